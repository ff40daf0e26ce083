package plan

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// notToolTags are tags that never name a tool after a task list, even when
// any tool is accepted.
var notToolTags = map[string]bool{
	"plan": true, "answer": true, "think": true, "graph": true, "node": true,
	"observation": true, "result": true, "reflection": true, "thought": true,
	"b": true, "i": true, "u": true, "em": true, "strong": true, "code": true,
	"pre": true, "p": true, "br": true, "sup": true, "sub": true, "span": true,
	"div": true, "li": true, "ul": true, "ol": true, "table": true, "tr": true, "td": true,
}

// parseTaskList reads a task list and the tool tags after it:
//
//	<plan>
//	T1: Find the capital of France
//	- Dependencies: none
//	T2: Find the population of the city found in T1
//	- Dependencies: T1
//	</plan>
//	<search>capital of France|population of {T1}</search>
//
// Tool calls go, in order, to the tasks that do not name their own tool; a
// task left without a call runs DefaultTool on its description. A second
// <plan> with tasks is a second plan: an error naming both, unless it and
// its calls are the same as the first (see samePlans). So are tasks
// written without a <plan> before it (tasksBefore) or after it (nextPlan),
// when they give dependencies or a tool.
func parseTaskList(d *doc, o *Options) (parsed, *Error) {
	p := parsed{format: FormatTaskList}
	start, end, after := 0, len(d.text), 0
	for i := tagIndex(d, "plan", 0); i >= 0; {
		gt := strings.IndexByte(d.text[i:], '>')
		if gt < 0 {
			d.m.add(len(d.text) - i)
			p.cut = "inside the <plan> tag"
			return p, nil
		}
		d.m.add(gt)
		start, p.from, p.to = i+gt+1, i, i+gt+1
		if c := d.index("</plan>", start); c >= 0 {
			end, after = c, c+len("</plan>")
			p.to = after
			// A closed <plan> without a task ("write it in
			// `<plan>…</plan>` tags") is a mention: the plan is in the
			// next one, if any, else its tasks are written without a
			// <plan> (without any, the <plan> is an empty plan).
			if hasTaskLine(d, start, end) {
				break
			}
			if i = tagIndex(d, "plan", after); i >= 0 {
				continue
			}
			if hasTaskLine(d, 0, len(d.text)) {
				start, end, after, p.from, p.to = 0, len(d.text), 0, 0, 0
			}
		} else {
			// Cut off inside the plan: the last line may be incomplete.
			p.cut = "inside <plan>"
			p.to = len(d.text)
			if !strings.HasSuffix(d.text, "\n") {
				d.m.add(len(d.text) - start)
				if nl := strings.LastIndexByte(d.text[start:], '\n'); nl >= 0 {
					end = start + nl
				} else {
					end = start
				}
			}
			after = len(d.text)
		}
		break
	}
	// A closed <plan> may be followed by its dependencies.
	closed := start > 0 && p.cut == ""
	tail := planTail{end: after, tag: -1}
	if closed {
		var perr *Error
		if tail, perr = readTail(d, o, after); perr != nil {
			return p, perr
		}
		p.to = max(p.to, tail.end)
	}
	inline, _, perr := readTasks(d, o, &p, start, end, start == 0, tail.edges)
	if perr != nil {
		return p, perr
	}
	var (
		before     []tagCall // calls between tasks written before the <plan> and it
		beforeLine int       // the line of those tasks
		prose      bool      // those tasks are prose: the calls alone are the plan's
		ok         bool
	)
	if start > 0 {
		if before, beforeLine, prose, perr = tasksBefore(d, o, &p, inline); perr != nil {
			return p, perr
		}
	}
	if len(p.nodes) == 0 && p.cut == "" && start == 0 {
		return p, errorf(ErrSyntax, "expected a task list such as \"T1: … - Dependencies: none\", but there is none")
	}
	// The calls after the plan run up to the next plan, if any: a <plan>,
	// or tasks written again without one.
	next, limit := planBlock{at: -1}, len(d.text)
	if closed {
		if next = nextPlan(d, o, tail.end); next.at >= 0 {
			limit = next.at
		}
	}
	if perr := strayDeps(d, o, p.nodes, tail.tag, limit); perr != nil {
		return p, perr
	}
	calls, cut, to, terr := toolTags(d, after, limit, o)
	if terr != nil {
		return p, terr
	}
	if to > 0 {
		p.to = to
	}
	where := "after the plan"
	if next.at >= 0 {
		if calls, cut, terr = samePlans(d, o, &p, inline, calls, cut, next); terr != nil {
			return p, terr
		}
	}
	if len(before) > 0 {
		if len(calls) == 0 && cut == "" || p.cut != "" {
			where = "before the plan"
		}
		if p.cut != "" {
			// The <plan> was cut off, and its calls with it: the calls
			// before it are those of its tasks, the ones cut off included.
			n := 0
			for i := range p.nodes {
				if !inline[i] {
					n++
				}
			}
			calls = before[:min(n, len(before))]
		} else if calls, cut, ok = sameCalls(calls, cut, before, ""); !ok {
			line := d.line(p.from)
			if prose {
				return p, &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
					"the tool calls before the <plan> at line %d (from line %d) differ from those after it; write the calls once, after the plan",
					line, before[0].line)}
			}
			return p, &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
				"the output holds two different plans, the task list at line %d and the <plan> at line %d; write one <plan> with the whole plan",
				beforeLine, line)}
		}
	}
	if cut != "" && p.cut == "" {
		p.cut = cut
	}
	if perr := assignCalls(&p, inline, calls, cut, where, o); perr != nil {
		return p, perr
	}
	if o.Partial && !(closed && tail.tag >= 0) {
		// Streamed, the plan may still gain a dependency (a line below a
		// task, a section under a later one or after </plan>): its tasks
		// wait, as those waiting for their calls do, until it cannot.
		for i := range p.nodes {
			p.nodes[i].Tool = o.DefaultTool
		}
	}
	return p, nil
}

// sameCalls puts together the calls after a plan and those after the same
// plan written again: the same calls, or the calls of the one that has
// any (the plan repeated before or after its calls). ok is false when both
// have calls and they differ.
func sameCalls(calls []tagCall, cut string, more []tagCall, moreCut string) (_ []tagCall, _ string, ok bool) {
	switch {
	case len(more) == 0 && moreCut == "":
	case len(calls) == 0 && cut == "":
		calls, cut = more, moreCut
	case moreCut != cut || !slices.EqualFunc(calls, more, func(a, b tagCall) bool { return a.tool == b.tool && a.input == b.input }):
		return nil, "", false
	}
	return calls, cut, true
}

// readTasks reads the task lines of d.text[start:end] into p, and says
// which tasks name their own tool, and whether a task gives its
// dependencies (listed). bare: the tasks are not in a <plan>, and p.from
// and p.to are set to the text they take. tail holds the dependencies
// written after the </plan> (readTail).
func readTasks(d *doc, o *Options, p *parsed, start, end int, bare bool, tail []depEdge) (inline map[int]bool, listed bool, perr *Error) {
	var (
		cur *rawNode
		err error
		x   taskIndex
	)
	sawDeps := map[int]bool{}
	deps := map[int][]taskDep{} // as read; resolveDeps makes them ids
	inline = map[int]bool{}     // tasks that name their own tool
	// more holds the lines that go on describing a task, joined at the end:
	// appending them one by one would copy the description once per line.
	more := map[int][]string{}
	// An empty dependency list (head, the task it is of) may head the
	// lines below it: the task's dependencies, one a line, or statements
	// of which task depends on which (a section), which it then does not
	// give for its task: the task's dependencies go back to what they were.
	var (
		head      = -1
		headDeps  []taskDep
		headSaw   bool
		headItems bool
		section   bool
		edges     []depEdge
	)
	heading := func(i int, prevDeps []taskDep, prevSaw bool) {
		head, headDeps, headSaw, headItems, section = i, prevDeps, prevSaw, false, false
	}
	eol := -1 // the end of the line off is in, once found
	for off := start; off < end; {
		if off > eol {
			eol = end
			if nl := strings.IndexByte(d.text[off:end], '\n'); nl >= 0 {
				eol = off + nl
			}
		}
		lineEnd, next := eol, eol+1
		// Several tasks may share a line ("T1: … - Dependencies: none
		// T2: …"): the next one starts after the dependencies.
		if q := nextTask(d.m, d.text[off:lineEnd]); q > 0 {
			lineEnd, next = off+q, off+q
		}
		line := d.text[off:lineEnd]
		// Each line is trimmed, lowered and searched for a dozen keys.
		d.m.add(16 * (len(line) + 1))
		lineNo := d.line(off)
		off = next
		// Without a <plan> wrapper, the plan's text ends with its last
		// task, dependency or tool line: prose after it is not plan.
		planLine := func() {
			if bare {
				p.to = lineEnd
			}
		}
		if head >= 0 || section {
			if item, _ := listItem(line); item != "" {
				es, colon, ok, err := depStatement(d.m, item, o.MaxNodes, false)
				if err != nil {
					return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Message: fmt.Sprintf("the dependency line %q (line %d): %v", item, lineNo, err)}
				}
				// "T2: T1" is a statement about a task of the plan, else a task.
				if ok && (!colon || len(es) == 1 && len(es[0].tasks) == 1 && x.find(es[0].tasks[0]) >= 0) {
					if !section && head >= 0 && !headItems {
						deps[head], sawDeps[head] = headDeps, headSaw
						if !headSaw {
							delete(sawDeps, head)
						}
					}
					section = true
					for _, e := range es {
						e.line, e.text = lineNo, item
						edges = append(edges, e)
					}
					planLine()
					continue
				}
			}
		}
		if id, rest, ok := taskLine(line); ok {
			head, section = -1, false
			p.nodes = append(p.nodes, rawNode{line: lineNo, Node: Node{ID: id, Args: map[string]any{}}})
			x.add(id, len(p.nodes)-1)
			cur = &p.nodes[len(p.nodes)-1]
			if bare && len(p.nodes) == 1 {
				p.from = lineEnd - len(line)
			}
			planLine()
			desc, list, hasDeps := splitDeps(d.m, rest)
			if hasDeps {
				if deps[len(p.nodes)-1], err = taskDeps(d.m, list, o.MaxNodes); err != nil {
					return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Node: id, Message: fmt.Sprintf("task %s: %v", id, err)}
				}
				sawDeps[len(p.nodes)-1] = true
				if !strings.ContainsFunc(list, isAlnum) {
					heading(len(p.nodes)-1, nil, false)
				}
			}
			desc = strings.TrimSpace(strings.Trim(desc, "*_ "))
			if c, note, ok, _ := callRegion(d.m, desc); ok {
				cur.Tool, cur.Args, cur.Description = c.tool, c.args, note
				inline[len(p.nodes)-1] = true
			} else {
				cur.Description = desc
			}
			continue
		}
		if cur == nil {
			continue
		}
		field := strings.TrimSpace(strings.TrimLeft(line, " \t-*+•>"))
		if field == "" {
			continue
		}
		if section {
			// A bullet under the heading that says nothing readable is a
			// dependency lost; prose ends the dependencies, and the tasks.
			if item, bullet := listItem(line); bullet {
				return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Message: fmt.Sprintf(
					"the line %q (line %d) under the dependencies does not say which task depends on which; write one on each line, as in \"T3 depends on T1, T2\" or \"T1: none\"",
					item, lineNo)}
			}
			head, section, cur = -1, false, nil
			continue
		}
		if head >= 0 {
			// The heading's own task's dependencies, one a line ("- T1").
			if item, bullet := listItem(line); onlyTasks(item) || bullet && startsWithTask(d.m, item) {
				ds, err := taskDeps(d.m, item, o.MaxNodes)
				if err != nil {
					return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Node: p.nodes[head].ID, Message: fmt.Sprintf("task %s: %v", p.nodes[head].ID, err)}
				}
				deps[head] = append(deps[head], ds...)
				headItems = true
				planLine()
				continue
			}
			head = -1
		}
		if _, list, ok := splitDeps(d.m, field); ok {
			// "T2 depends on T1" under T3 is about T2.
			es, _, ok, err := depStatement(d.m, field, o.MaxNodes, true)
			if err != nil {
				return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Node: cur.ID, Message: fmt.Sprintf("the dependency line %q (line %d): %v", field, lineNo, err)}
			}
			if ok && !(len(es) == 1 && len(es[0].tasks) == 1 && x.find(es[0].tasks[0]) == len(p.nodes)-1) {
				for _, e := range es {
					e.line, e.text = lineNo, field
					edges = append(edges, e)
				}
				planLine()
				continue
			}
			i := len(p.nodes) - 1
			prevDeps, prevSaw := deps[i], sawDeps[i]
			if deps[i], err = taskDeps(d.m, list, o.MaxNodes); err != nil {
				return nil, false, &Error{Kind: ErrSyntax, Line: lineNo, Node: cur.ID, Message: fmt.Sprintf("task %s: %v", cur.ID, err)}
			}
			sawDeps[i] = true
			if !strings.ContainsFunc(list, isAlnum) {
				heading(i, prevDeps, prevSaw)
			}
			planLine()
			continue
		}
		if depHeading(field) {
			i := len(p.nodes) - 1
			heading(i, deps[i], sawDeps[i])
			deps[i], sawDeps[i] = nil, true
			planLine()
			continue
		}
		if k, v, ok := keyValue(field); ok {
			switch k {
			case "tool", "action":
				if c, _, ok, _ := callRegion(d.m, v); ok {
					cur.Tool, cur.Args = c.tool, c.args
				} else {
					cur.Tool = strings.Trim(v, "`*\"' ")
				}
				inline[len(p.nodes)-1] = true
				planLine()
				continue
			case "input", "query", "args", "arguments":
				cur.Args["input"] = strings.Trim(v, "`\"")
				planLine()
				continue
			}
		}
		if !sawDeps[len(p.nodes)-1] && !inline[len(p.nodes)-1] {
			more[len(p.nodes)-1] = append(more[len(p.nodes)-1], field)
		}
	}
	for i, lines := range more {
		n := &p.nodes[i]
		n.Description = strings.TrimSpace(n.Description + " " + strings.Join(lines, " "))
	}
	if perr := applyEdges(d.m, &x, p.nodes, append(edges, tail...), deps, sawDeps); perr != nil {
		return nil, false, perr
	}
	if p.cut != "" && len(p.nodes) > 0 && !sawDeps[len(p.nodes)-1] {
		// The last task's dependency line never came: it is incomplete.
		p.nodes = p.nodes[:len(p.nodes)-1]
	}
	resolveDeps(d.m, p.nodes, deps)
	return inline, len(sawDeps) > 0, nil
}

// startsWithTask reports whether s starts with a task ("T1 (the capital)").
func startsWithTask(m *meter, s string) bool {
	_, n := taskList(m, s, 0)
	return n > 0
}

// tasksBefore checks the text before p's <plan> for tasks written without
// a <plan>: the same tasks as p's are the plan written twice, but others
// (a draft, or a plan revised in the <plan>) are a second plan, and which
// one the planner means is anyone's guess. Lines that look like tasks but
// give neither dependencies nor a tool are prose ("T1: the capital comes
// first"). When p is cut off, its tasks so far must begin the others.
// When the tasks are p's, or prose, it returns the calls written between
// them and the <plan> (calls), the line they start on, and whether they
// are prose: the calls are the plan's either way, never dropped.
func tasksBefore(d *doc, o *Options, p *parsed, inline map[int]bool) (calls []tagCall, listLine int, prose bool, perr *Error) {
	if !hasTaskLine(d, 0, p.from) {
		return nil, 0, false, nil
	}
	q := parsed{}
	qinline, listed, err := readTasks(d, o, &q, 0, p.from, true, nil)
	if err == nil && !listed && len(qinline) == 0 {
		if len(q.nodes) == 0 {
			return nil, 0, false, nil
		}
		calls, _, _, perr = toolTags(d, q.from, p.from, o)
		return calls, q.nodes[0].line, true, perr
	}
	if err == nil && len(q.nodes) > 0 {
		n := len(q.nodes)
		if p.cut != "" {
			n = min(n, len(p.nodes))
		}
		same := sameNodes(p.nodes, q.nodes[:n])
		for i := range n {
			same = same && inline[i] == qinline[i]
		}
		if same && (p.cut != "" || maps.Equal(inline, qinline)) {
			calls, _, _, perr = toolTags(d, q.from, p.from, o)
			return calls, q.nodes[0].line, false, perr
		}
	}
	first, line := d.line(p.from), d.line(p.from)
	if len(q.nodes) > 0 {
		first = q.nodes[0].line
	}
	return nil, 0, false, &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
		"the output holds two different plans, the task list at line %d and the <plan> at line %d; write one <plan> with the whole plan",
		first, line)}
}

// resolveDeps sets the dependencies of nodes, deps[i] those of nodes[i]
// as read. A task named by its number alone (a bare "2", the middle of a
// range) is the plan's task of that id, else the one task with that
// number: "2" is T02 in a plan of T01, T02, T03.
func resolveDeps(m *meter, nodes []rawNode, deps map[int][]taskDep) {
	ids := make(map[string]bool, len(nodes))
	byNumber := map[int][]string{}
	for _, n := range nodes {
		ids[n.ID] = true
		if k, err := strconv.Atoi(n.ID[1:]); err == nil {
			byNumber[k] = append(byNumber[k], n.ID)
		}
	}
	for i, ds := range deps {
		if i >= len(nodes) {
			continue // the task was cut off
		}
		m.add(len(ds))
		out := make([]string, 0, len(ds))
		for _, dep := range ds {
			id := dep.id
			if c := byNumber[dep.number]; dep.byNumber && !ids[id] && len(c) == 1 {
				id = c[0]
			}
			out = append(out, id)
		}
		nodes[i].Deps = dedupe(out)
	}
}

// planBlock is a <plan> element that holds tasks: its tag is at at, its
// tasks in d.text[start:end], and what follows it starts at after (the
// end of the output if the plan is never closed, as cut says). A bare
// block is tasks written without a <plan>, from at to after.
type planBlock struct {
	at, start, end, after int
	cut                   string
	bare                  bool
}

// nextPlan finds the first plan at or after from: tasks written without a
// <plan> that give their dependencies or a tool (lines that give neither
// are prose), else the first <plan> that holds a task line; at is -1 if
// there is none. Closed <plan>s without a task are mentions, and one never
// closed that holds none runs to the end.
func nextPlan(d *doc, o *Options, from int) planBlock {
	g := nextPlanTag(d, from)
	limit := len(d.text)
	if g.at >= 0 {
		limit = g.at
	}
	if hasTaskLine(d, from, limit) {
		q := parsed{}
		qinline, listed, err := readTasks(d, o, &q, from, limit, true, nil)
		if err != nil || listed || len(qinline) > 0 {
			return planBlock{at: q.from, start: q.from, end: limit, after: max(q.to, q.from), bare: true}
		}
	}
	return g
}

// nextPlanTag finds the first <plan> at or after from that holds a task
// line; at is -1 if there is none.
func nextPlanTag(d *doc, from int) planBlock {
	for g := tagIndex(d, "plan", from); g >= 0; {
		gt := strings.IndexByte(d.text[g:], '>')
		if gt < 0 {
			d.m.add(len(d.text) - g)
			break // cut off inside the tag
		}
		d.m.add(gt)
		b := planBlock{at: g, start: g + gt + 1, end: len(d.text), after: len(d.text), cut: "inside <plan>"}
		if c := d.index("</plan>", b.start); c >= 0 {
			b.end, b.after, b.cut = c, c+len("</plan>"), ""
		}
		if hasTaskLine(d, b.start, b.end) {
			return b
		}
		if b.cut != "" {
			break
		}
		g = tagIndex(d, "plan", b.after)
	}
	return planBlock{at: -1}
}

// samePlans reads the plans after p's, the first of which is next: each
// must hold the same tasks as p's, or the output holds two plans and which
// one the planner means is anyone's guess (it may revise a plan, or write
// a draft after it). Calls after a repeated plan must be the same as those
// after p's (calls, cut), unless one of the two has none: the planner
// repeated the plan before or after its calls. It returns the calls for
// the plan.
func samePlans(d *doc, o *Options, p *parsed, inline map[int]bool, calls []tagCall, cut string, next planBlock) ([]tagCall, string, *Error) {
	first := d.line(p.from)
	for b := next; b.at >= 0; {
		line := d.line(b.at)
		second := "the <plan>"
		if b.bare {
			second = "the task list"
		}
		twoPlans := &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
			"the output holds two different plans, the <plan> at line %d and %s at line %d; write one <plan> with the whole plan",
			first, second, line)}
		q := parsed{from: b.at, cut: b.cut}
		tail := planTail{end: b.after, tag: -1}
		var err *Error
		if !b.bare && b.cut == "" {
			if tail, err = readTail(d, o, b.after); err != nil {
				return nil, "", err
			}
		}
		qinline, _, err := readTasks(d, o, &q, b.start, b.end, b.bare, tail.edges)
		if err != nil || q.cut != "" || !sameNodes(p.nodes, q.nodes) || !maps.Equal(inline, qinline) {
			return nil, "", twoPlans
		}
		later, limit := nextPlan(d, o, tail.end), len(d.text)
		if later.at >= 0 {
			limit = later.at
		}
		if err := strayDeps(d, o, q.nodes, tail.tag, limit); err != nil {
			return nil, "", err
		}
		qcalls, qcut, _, terr := toolTags(d, b.after, limit, o)
		if terr != nil {
			return nil, "", terr
		}
		var ok bool
		if calls, cut, ok = sameCalls(calls, cut, qcalls, qcut); !ok {
			return nil, "", twoPlans
		}
		b = later
	}
	return calls, cut, nil
}

// assignCalls is the end of parseTaskList: it gives the calls, cut off
// where cut says, to the tasks that do not name their own tool (inline).
// where says where the calls were written ("after the plan").
func assignCalls(p *parsed, inline map[int]bool, calls []tagCall, cut, where string, o *Options) *Error {
	k := 0
	kept := p.nodes[:0]
	for i := range p.nodes {
		n := &p.nodes[i]
		switch {
		case inline[i]:
			if len(n.Args) == 0 && n.Description != "" {
				n.Args["input"] = n.Description
			}
		case k < len(calls):
			n.Tool = calls[k].tool
			n.Args["input"] = calls[k].input
			k++
		case cut != "":
			// The calls were cut off: this task's was among those lost,
			// so it is not a complete node.
			continue
		default:
			n.Tool = o.DefaultTool
			if _, ok := n.Args["input"]; !ok {
				n.Args["input"] = n.Description
			}
		}
		kept = append(kept, *n)
	}
	p.nodes = kept
	if k < len(calls) && cut == "" {
		return &Error{Kind: ErrSyntax, Line: calls[k].line, Message: fmt.Sprintf(
			"there are %d tool calls %s but only %d tasks without their own tool; the extra call is <%s>%s</%s>",
			len(calls), where, k, calls[k].tool, calls[k].input, calls[k].tool)}
	}
	return nil
}

type tagCall struct {
	tool, input string
	line        int
}

// toolTags collects the calls in tool tags <tool>q1|q2</tool> in
// d.text[from:limit]. A tag cut off by the end of the output is reported
// in cut; to is the end of the last tag read, or 0.
func toolTags(d *doc, from, limit int, o *Options) (calls []tagCall, cut string, to int, err *Error) {
	s := d.text[:limit]
	// closes lists the closing tags </name> in order, each linked to the
	// next one of its name, and next holds the first one of each name not
	// yet passed: one scan, after which every opening tag finds its own
	// closing tag without a scan of its own, however many distinct tags
	// are left open.
	type closeTag struct {
		at   int
		name string // lower case
		next int    // index in closes of the next </name>, or -1
	}
	var closes []closeTag
	for i := from; i < len(s); {
		k := strings.Index(s[i:], "</")
		if k < 0 {
			d.m.add(len(s) - i)
			break
		}
		d.m.add(k + 2)
		i += k + 2
		j := identAt(s, i)
		if j > i && j < len(s) && s[j] == '>' {
			d.m.add(j - i)
			closes = append(closes, closeTag{at: i - 2, name: d.lower[i:j]})
		}
	}
	next := make(map[string]int)
	for k := len(closes) - 1; k >= 0; k-- {
		c := &closes[k]
		c.next = -1
		if n, ok := next[c.name]; ok {
			c.next = n
		}
		next[c.name] = k
	}
	d.m.add(len(closes))
	// A tag the output ends in the middle of ("<sea", "</sea") was cut off
	// with the calls it held or was about to hold.
	end, tail := len(s), ""
	if t := strings.LastIndexByte(s, '<'); t >= from && limit == len(d.text) {
		d.m.add(len(s) - t)
		name := t + 1
		if name < len(s) && s[name] == '/' {
			name++
		}
		if e := identAt(s, name); e == len(s) && (e == name || !notToolTags[d.lower[name:e]]) {
			end, tail = t, s[t:]
		}
	}
	lastTag := strings.LastIndexByte(s[:end], '<')
	if limit < len(d.text) {
		lastTag = limit // the next plan's tag: the output goes on
	}
	d.m.add(end - max(lastTag, from))
	for i := from; i < end; i++ {
		k := strings.IndexByte(s[i:end], '<')
		if k < 0 {
			d.m.add(end - i)
			break
		}
		d.m.add(k + 1)
		i += k
		j := identAt(s[:end], i+1)
		if j == i+1 || j >= end || s[j] != '>' {
			continue
		}
		d.m.add(j - i)
		name := s[i+1 : j]
		lname := d.lower[i+1 : j]
		if notToolTags[lname] {
			continue
		}
		c := -1
		if k, ok := next[lname]; ok {
			for k >= 0 && closes[k].at < j+1 {
				k = closes[k].next
			}
			if next[lname] = k; k >= 0 {
				c = closes[k].at
			}
		}
		if c < 0 {
			if lastTag < j+1 {
				// Cut off in the tag's content, or a stop string ate the
				// closing tag: keep the complete queries, drop the last.
				tool, ok := tagTool(name, o)
				if !ok {
					continue
				}
				d.m.add(end - j)
				parts := strings.Split(s[j+1:end], "|")
				if !strings.HasPrefix(tail, "</") {
					parts = parts[:len(parts)-1] // the last query may be cut off
				}
				for _, q := range parts {
					if q = strings.TrimSpace(q); q != "" {
						calls = append(calls, tagCall{tool: tool, input: q, line: d.line(i)})
					}
				}
				return calls, fmt.Sprintf("inside <%s>", name), len(s), nil
			}
			continue
		}
		tool, ok := tagTool(name, o)
		if !ok {
			return nil, "", 0, &Error{Kind: ErrUnknownTool, Line: d.line(i), Message: fmt.Sprintf(
				"<%s> after the plan is not a known tool; the tools are: %s", name, strings.Join(o.Tools, ", "))}
		}
		d.m.add(2 * (c - j))
		for _, q := range strings.Split(s[j+1:c], "|") {
			if q = strings.TrimSpace(q); q != "" {
				calls = append(calls, tagCall{tool: tool, input: q, line: d.line(i)})
			}
		}
		i = c + len("</>") + len(lname) - 1
		to = i + 1
	}
	if tail != "" {
		return calls, fmt.Sprintf("inside %q", tail), len(s), nil
	}
	return calls, "", to, nil
}

func tagTool(name string, o *Options) (string, bool) {
	if len(o.Tools) == 0 {
		return name, true
	}
	return knownTool(o.Tools, name)
}

// hasTaskLine reports whether a line of d.text[start:end] is a task line.
func hasTaskLine(d *doc, start, end int) bool {
	for off := start; off < end; {
		lineEnd := end
		if nl := strings.IndexByte(d.text[off:end], '\n'); nl >= 0 {
			lineEnd = off + nl
		}
		d.m.add(2 * (lineEnd - off + 1))
		if _, _, ok := taskLine(d.text[off:lineEnd]); ok {
			return true
		}
		off = lineEnd + 1
	}
	return false
}

// nextTask returns the offset in line of a task ("T2:", "Task 2:") that
// follows the dependency list of the task before it on the line, or -1.
// Each stretch of the line between two such ids is read once.
func nextTask(m *meter, line string) int {
	from := 0
	for i := 1; i < len(line); i++ {
		if c := line[i]; c != 'T' && c != 't' || line[i-1] != ' ' && line[i-1] != '\t' {
			continue
		}
		_, k, ok := taskRef(line, i)
		for ok && k < len(line) && (line[k] == '*' || line[k] == '_') {
			k++
		}
		if !ok || k >= len(line) || line[k] != ':' {
			continue
		}
		if _, deps, ok := splitDeps(m, line[from:i]); ok && onlyTasks(deps) {
			return i
		}
		from = i
	}
	return -1
}

// onlyTasks reports whether a dependency list holds nothing but task ids
// and the words that join them ("T1 and T2", "none"): a list that goes
// on in prose ("T1 (its result T1: …)") ends no task.
func onlyTasks(deps string) bool {
	for _, w := range strings.FieldsFunc(deps, func(r rune) bool {
		return !(r == '/' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}) {
		switch w = asciiLower(w); {
		case isNumber(w), len(w) > 1 && w[0] == 't' && isNumber(w[1:]):
		case w == "and" || w == "task" || w == "tasks" || w == "step" || w == "steps" || w == "to" || w == "through" || noDeps(w):
		default:
			return false
		}
	}
	return true
}

// taskLine recognises "T1: …", "**T1.** …", "- Task 1: …" and returns the
// id (T1) and the rest of the line.
func taskLine(line string) (id, rest string, ok bool) {
	s := strings.TrimLeft(line, " \t-*+#>•")
	if len(s) < 2 || s[0] != 'T' && s[0] != 't' {
		return "", "", false
	}
	j := 1
	if len(s) >= 4 && strings.EqualFold(s[:4], "task") {
		j = 4
		for j < len(s) && (s[j] == ' ' || s[j] == '#') {
			j++
		}
	}
	k := digitsEnd(s, j)
	if k == j || k-j > 6 {
		return "", "", false
	}
	id = "T" + s[j:k]
	r := strings.TrimLeft(s[k:], "*_")
	r = strings.TrimLeft(r, " \t")
	if r == "" {
		return "", "", false
	}
	switch r[0] {
	case ':', '.', ')':
		r = r[1:]
	default:
		if strings.HasPrefix(r, "- ") || strings.HasPrefix(r, "– ") || strings.HasPrefix(r, "— ") {
			_, n := firstRune(r)
			r = r[n:]
		} else {
			return "", "", false
		}
	}
	return id, strings.TrimLeft(strings.TrimSpace(r), "*_ "), true
}

func firstRune(s string) (rune, int) { return utf8.DecodeRuneInString(s) }

func isAlnum(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// taskDep is a task that a dependency list names: by its id as written
// ("T2"; "Task 02" is T02), or by its number alone (byNumber: a bare "2",
// the middle or the unnamed end of a range), for resolveDeps to find
// among the plan's tasks; id is then the id the number stands for if the
// plan has no task with that number.
type taskDep struct {
	id       string
	number   int
	byNumber bool
}

// taskDeps extracts the tasks (T1, Task 2) of a dependency list such as
// "T1, T2", "T1 and T2", "[T1]" or "none"; other words are ignored. A
// range, "T1-T3" or "T1-3" (also with an en or em dash, or "T1 to T3"), is
// every task from the first to the last; one that runs backwards or spans
// more tasks than a plan may hold (limit) is an error naming it. Tasks may
// be named by their numbers ("1, 2", "1-3", "Task 1 and 2") in a list of
// nothing else. A list that names no task and is not "none" ("the results
// of 1 and 2", "the previous task") is an error, not a list of no tasks.
func taskDeps(m *meter, s string, limit int) ([]taskDep, error) {
	m.add(2 * len(s))
	bare := onlyTasks(s)
	var out []taskDep
	var numbers []string // bare numbers in a list of other words
	for i := 0; i < len(s); i++ {
		if i > 0 && isIdent(s[i-1]) {
			continue
		}
		from, k, ok := taskRef(s, i)
		written := ok
		if !ok {
			// A bare number, not one that goes on as a word or a
			// decimal ("1st", "1.5").
			k = digitsEnd(s, i)
			if k == i || k < len(s) && (isIdentStart(s[k]) || s[k] == '.' && digitsEnd(s, k+1) > k+1) {
				continue
			}
			from = s[i:k]
			if !bare {
				numbers = append(numbers, "T"+from)
				i = k - 1
				continue
			}
		}
		a, aerr := strconv.Atoi(from)
		out = append(out, taskDep{id: "T" + from, number: a, byNumber: !written && aerr == nil})
		if to, e, toWritten, ok := rangeTo(s, k); ok {
			b, berr := strconv.Atoi(to)
			switch {
			case aerr != nil || berr != nil || b-a >= limit:
				return nil, fmt.Errorf("the dependency range %s spans more tasks than a plan may have (%d); list the tasks it needs", s[i:e], limit)
			case b < a:
				return nil, fmt.Errorf("the dependency range %s runs backwards; write T%s-T%s", s[i:e], to, from)
			}
			m.add(b - a)
			// The tasks in between are written as the first is: T02 after T01.
			width := 0
			if len(from) > 1 && from[0] == '0' {
				width = len(from)
			}
			for n := a + 1; n < b; n++ {
				out = append(out, taskDep{id: fmt.Sprintf("T%0*d", width, n), number: n, byNumber: true})
			}
			if b > a {
				out = append(out, taskDep{id: "T" + to, number: b, byNumber: !toWritten})
			}
			k = e
		}
		i = k - 1
	}
	switch {
	case len(out) > 0 || noDeps(asciiLower(strings.Trim(s, "`\"'"))) || !strings.ContainsFunc(s, isAlnum):
		// A list of tasks, "none", or nothing ("Dependencies:", "-").
	case len(numbers) > 0:
		return nil, fmt.Errorf("the dependencies %q hold numbers but name no task; write the ids of the tasks it depends on (%s), or none",
			s, strings.Join(numbers, ", "))
	default:
		// Prose ("the previous task", "all of the above") names no task
		// for sure: guessing which would be worse than asking.
		return nil, fmt.Errorf("the dependencies %q name no task; write the ids of the tasks it depends on, as in \"Dependencies: T1, T2\", or \"Dependencies: none\"", s)
	}
	return out, nil
}

// taskRef reads a task id at s[i] ("T1", "Task 2", "task #3"): its number
// as written and where it ends.
func taskRef(s string, i int) (number string, end int, ok bool) {
	if i >= len(s) || s[i] != 'T' && s[i] != 't' {
		return "", i, false
	}
	j := i + 1
	if i+4 <= len(s) && strings.EqualFold(s[i:i+4], "task") {
		j = i + 4
		for j < len(s) && (s[j] == ' ' || s[j] == '#') {
			j++
		}
	}
	k := digitsEnd(s, j)
	if k == j || k < len(s) && isIdentStart(s[k]) {
		return "", i, false
	}
	return s[j:k], k, true
}

// rangeSeps join the ends of a range of tasks.
var rangeSeps = []string{"-", "–", "—", "to ", "through "}

// rangeTo reads the end of a range after a task id that ends at s[i]
// ("-T3", " – T3", " to Task 3", "-3"): its number, where it ends, and
// whether it is written as a task id (not "-3").
func rangeTo(s string, i int) (number string, end int, written, ok bool) {
	j := i
	for j < len(s) && s[j] == ' ' {
		j++
	}
	for _, sep := range rangeSeps {
		if len(s)-j >= len(sep) && strings.EqualFold(s[j:j+len(sep)], sep) {
			k := j + len(sep)
			for k < len(s) && s[k] == ' ' {
				k++
			}
			if to, e, ok := taskRef(s, k); ok {
				return to, e, true, true
			}
			// "T1-3": the end's T is left out, as it is in "pages 1-3".
			if e := digitsEnd(s, k); e > k && (e == len(s) || !isIdentStart(s[e])) {
				return s[k:e], e, false, true
			}
			return "", i, false, false
		}
	}
	return "", i, false, false
}

// depKeys introduce a dependency list, lowered: first the keys with a
// colon, then the words that also occur in a task's text ("find what the
// price depends on"), which count only before a dependency list (see
// splitDeps).
var (
	depKeys     = []string{"dependencies:", "dependency:", "depends on:", "deps:", "requires:"}
	weakDepKeys = []string{"dependencies -", "depends on", "dependencies"}
)

// splitDeps splits "Find X - Dependencies: T1" into the description and
// the dependency list. A key with a colon introduces one where it starts a
// field (at the start, after a dash, a bracket or a stop) or before tasks
// or "none": "Find what the law requires: a visa" and `search("deps:
// numpy")` are task text. A key without a colon ("depends on") introduces
// one only if a task follows it somewhere on the line, or a word such as
// "none" right after it: "search(\"what the price depends on\")" and "List
// the dependencies of numpy" are task text.
func splitDeps(m *meter, s string) (desc, deps string, ok bool) {
	ls := asciiLower(s)
	split := func(i, n int) (string, string, bool) {
		desc = strings.TrimRight(s[:i], " \t-–—,;([*_")
		deps = strings.TrimSpace(s[i+n:])
		deps = strings.TrimLeft(deps, ":*_ ")
		deps = strings.TrimRight(deps, ")]*_. ")
		return desc, deps, true
	}
	last := lastTaskRef(s)
	for _, k := range depKeys {
		for i := strings.Index(ls, k); i >= 0; {
			end := i + len(k)
			next := strings.Index(ls[end:], k)
			// Only the last key can be followed by nothing but numbers:
			// the words of a later key are not numbers.
			if fieldAt(s, i) || last >= end || noDeps(ls[end:]) || next < 0 && numberList(m, s[end:]) {
				return split(i, len(k))
			}
			if next < 0 {
				break
			}
			i = end + next
		}
	}
	for _, k := range weakDepKeys {
		for i := strings.Index(ls, k); i >= 0; {
			end := i + len(k)
			next := strings.Index(ls[end:], k)
			// As above, only the last key can be followed by nothing but
			// numbers: numberList reads to the end of the line, once.
			if last >= end || noDeps(ls[end:]) || next < 0 && numberList(m, s[end:]) {
				return split(i, len(k))
			}
			if next < 0 {
				break
			}
			i = end + next
		}
	}
	return s, "", false
}

// fieldAt reports whether a key at s[i] starts a field of a task: at the
// start of s, or after a dash, a bracket or a punctuation mark ("Find X -
// Dependencies: T1", "Find X (deps: T1)", "Find X. Requires: none").
func fieldAt(s string, i int) bool {
	j := i
	for j > 0 && strings.IndexByte(" \t*_", s[j-1]) >= 0 {
		j--
	}
	return j == 0 || strings.IndexByte("-([|;,.:", s[j-1]) >= 0 ||
		strings.HasSuffix(s[:j], "–") || strings.HasSuffix(s[:j], "—")
}

// numberList reports whether s names tasks by their numbers and holds
// nothing else (" 1 and 2.", ": 1-3"), as what follows "depends on"
// without a colon must be to be a dependency list: "how the price depends on
// 2 factors" and `search("what depends on 2")` are a task's text.
func numberList(m *meter, s string) bool {
	m.add(len(s)) // read to the end: callers call it once a line (splitDeps)
	s = strings.Trim(s, " \t:*_.([])")
	return strings.IndexFunc(s, func(r rune) bool { return '0' <= r && r <= '9' }) >= 0 &&
		!strings.ContainsAny(s, "\"'`()") && onlyTasks(s)
}

// lastTaskRef returns the offset of the last task id in s (as taskDeps
// reads them), or -1.
func lastTaskRef(s string) int {
	last := -1
	for i := 0; i < len(s); i++ {
		if i > 0 && isIdent(s[i-1]) {
			continue
		}
		if _, k, ok := taskRef(s, i); ok {
			last = i
			i = k - 1
		}
	}
	return last
}

// noDeps reports whether the lower-case s starts with a word that says
// there are no dependencies ("none", "n/a").
func noDeps(s string) bool {
	s = strings.TrimLeft(s, " \t:*_-([")
	s = s[:min(len(s), len("nothing")+1)] // the longest word, and what ends it
	w := s
	if i := strings.IndexAny(s, " \t)].,;*_"); i >= 0 {
		w = s[:i]
	}
	switch w {
	case "none", "null", "nil", "n/a", "na", "no", "nothing", "empty":
		return true
	}
	return false
}

// keyValue splits "Tool: search" into a lowered key and its value.
func keyValue(s string) (key, value string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || i > 20 {
		return "", "", false
	}
	key = asciiLower(strings.Trim(s[:i], "*_ "))
	return key, strings.TrimSpace(strings.Trim(s[i+1:], "*_ ")), true
}

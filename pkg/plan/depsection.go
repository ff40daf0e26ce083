package plan

import (
	"fmt"
	"strings"
)

// A task list may give its dependencies apart from its tasks, as lines
// that each say which task depends on which, under a heading that is an
// empty dependency list:
//
//	T1: Find the capital of France
//	T2: Find its population
//	T3: Compare the two
//	Dependencies:
//	- T2 depends on T1
//	- T3 after T1, T2
//
// The same heading over a list of tasks alone ("- T1", "- T2") is the
// dependency list of the task it follows.

// depEdge says that each of tasks depends on each of deps.
type depEdge struct {
	tasks, deps []taskDep
	line        int
	text        string
}

// relation joins the two sides of a dependency statement. before: the
// tasks on the left come first ("T1 before T2", "T1 -> T2"); otherwise
// they depend on those on the right. strict relations are the ones that
// also say so outside a dependency heading ("T2 depends on T1" under T3).
type relation struct {
	word           string
	before, strict bool
}

var relations = []relation{
	{word: "depends on", strict: true}, {word: "depend on", strict: true},
	{word: "depends upon", strict: true}, {word: "depend upon", strict: true},
	{word: "requires", strict: true}, {word: "require", strict: true},
	{word: "relies on"}, {word: "rely on"}, {word: "needs"}, {word: "need"},
	{word: "uses"}, {word: "use"}, {word: "waits for"}, {word: "wait for"},
	{word: "comes after"}, {word: "come after"}, {word: "runs after"}, {word: "run after"},
	{word: "is after"}, {word: "are after"}, {word: "after"}, {word: "follows"}, {word: "follow"},
	{word: "<-"}, {word: "←"},
	{word: "comes before", before: true}, {word: "come before", before: true},
	{word: "runs before", before: true}, {word: "run before", before: true},
	{word: "is before", before: true}, {word: "are before", before: true}, {word: "before", before: true},
	{word: "precedes", before: true}, {word: "precede", before: true},
	{word: "->", before: true}, {word: "→", before: true}, {word: "=>", before: true}, {word: "⟶", before: true},
}

// noneRelations say that the tasks before them depend on nothing.
var noneRelations = []string{"has no dependencies", "have no dependencies", "has no dependency",
	"has none", "have none", "is independent", "are independent"}

// isArrow reports whether a relation is a symbol: arrows chain ("T1 -> T2
// -> T3"), words do not.
func (r relation) isArrow() bool { return !isIdentStart(r.word[0]) }

// relationAt returns the relation that starts at ls[i] (lowered), or false.
func relationAt(m *meter, ls string, i int, strict bool) (relation, int, bool) {
	m.add(16)
	if i >= len(ls) {
		return relation{}, i, false
	}
	for _, r := range relations {
		if strict && !r.strict || !strings.HasPrefix(ls[i:], r.word) {
			continue
		}
		e := i + len(r.word)
		if !r.isArrow() && e < len(ls) && isIdent(ls[e]) {
			continue // "users", "afterwards"
		}
		return r, e, true
	}
	return relation{}, i, false
}

// taskList reads a list of tasks that starts at s[i] ("T2", "T1 and T2",
// "Task 1, 2", "T1-T3") and returns where it ends and how many items it
// has; none: i, 0.
func taskList(m *meter, s string, i int) (end, n int) {
	end = i
	for j := i; ; {
		for j < len(s) && strings.IndexByte(" \t*_`\"'([", s[j]) >= 0 {
			j++
		}
		for _, w := range []string{"steps ", "step ", "tasks "} {
			if len(s)-j > len(w) && strings.EqualFold(s[j:j+len(w)], w) {
				j += len(w)
				break
			}
		}
		_, k, ok := taskRef(s, j)
		if !ok {
			// A bare number, not one that goes on as a word or a decimal.
			k = digitsEnd(s, j)
			if k == j || k < len(s) && (isIdentStart(s[k]) || s[k] == '.' && digitsEnd(s, k+1) > k+1) {
				return end, n
			}
		}
		if _, e, _, ok := rangeTo(s, k); ok {
			k = e
		}
		for k < len(s) && strings.IndexByte("*_`\"')]", s[k]) >= 0 {
			k++
		}
		m.add(k - end)
		end, n = k, n+1
		for j = k; j < len(s) && (s[j] == ' ' || s[j] == '\t'); j++ {
		}
		switch {
		case j < len(s) && strings.IndexByte(",&/+", s[j]) >= 0:
			j++
		case len(s)-j > 4 && strings.EqualFold(s[j:j+4], "and "):
			j += 4
		default:
			return end, n
		}
	}
}

// depStatement reads a line that says which tasks depend on which: "T2
// depends on T1", "T2, T3 after T1", "T1 -> T2 -> T3", "T1 has no
// dependencies", "T2: T1" (colon: a task line in form, which the caller
// takes for a statement only where the task is already known). With
// strict, only the relations in strict wording count. ok is false when
// the line is not a statement; err names what is wrong with one that is,
// such as two statements on a line.
func depStatement(m *meter, s string, limit int, strict bool) (edges []depEdge, colon, ok bool, err error) {
	m.add(2 * len(s))
	ls := asciiLower(s)
	end, n := taskList(m, s, 0)
	if n == 0 {
		return nil, false, false, nil
	}
	left, lerr := taskDeps(m, s[:end], limit)
	if lerr != nil || len(left) == 0 {
		return nil, false, false, nil
	}
	skip := func(i int, cut string) int {
		for i < len(s) && strings.IndexByte(cut, s[i]) >= 0 {
			i++
		}
		return i
	}
	j := skip(end, " \t*_`)")
	if j < len(s) && s[j] == ':' {
		colon = true
		j = skip(j+1, " \t*_`")
	}
	rel, k, found := relationAt(m, ls, j, strict)
	if !found {
		if strict {
			return nil, false, false, nil
		}
		rest := strings.TrimRight(s[j:], " \t.*_`")
		for _, w := range noneRelations {
			if !colon && strings.EqualFold(rest, w) {
				return []depEdge{{tasks: left}}, false, true, nil
			}
		}
		// "T2: T1", "T2: none": after a colon, a list and nothing else.
		if !colon || !onlyTasks(rest) {
			return nil, false, false, nil
		}
		deps, derr := taskDeps(m, rest, limit)
		if derr != nil {
			return nil, false, false, nil
		}
		return []depEdge{{tasks: left, deps: deps}}, true, true, nil
	}
	for {
		k = skip(k, " \t:*_`")
		e, n := taskList(m, s, k)
		t := skip(e, " \t.,;")
		if next, k2, more := relationAt(m, ls, t, strict); more && n > 0 {
			if !rel.isArrow() || !next.isArrow() || next.before != rel.before {
				return nil, false, false, fmt.Errorf("it says more than one thing; write one on each line, as in \"T3 depends on T2\"")
			}
			right, rerr := taskDeps(m, s[k:e], limit)
			if rerr != nil {
				return nil, false, false, rerr
			}
			edges = append(edges, edge(rel, left, right))
			left, rel, k = right, next, k2
			continue
		}
		obj := strings.TrimRight(s[k:], " \t.*_`")
		if n == 0 && !noDeps(asciiLower(obj)) {
			return nil, false, false, fmt.Errorf("it names no task after %q; write the ids of the tasks, as in \"T3 depends on T1, T2\"", rel.word)
		}
		right, rerr := taskDeps(m, obj, limit)
		if rerr != nil {
			return nil, false, false, rerr
		}
		return append(edges, edge(rel, left, right)), colon, true, nil
	}
}

// edge orders the two sides of a relation.
func edge(r relation, left, right []taskDep) depEdge {
	if r.before {
		return depEdge{tasks: right, deps: left}
	}
	return depEdge{tasks: left, deps: right}
}

// listItem returns a line without its bullet or its number ("- T2", "2.
// T2") and whether it had one.
func listItem(line string) (string, bool) {
	s := strings.TrimLeft(line, " \t")
	t := strings.TrimLeft(s, "-*+•>")
	bullet := len(t) < len(s)
	if k := digitsEnd(t, 0); k > 0 && k+1 < len(t) && (t[k] == '.' || t[k] == ')') && (t[k+1] == ' ' || t[k+1] == '\t') {
		t, bullet = t[k+1:], true
	}
	return strings.TrimSpace(t), bullet
}

// depHeading reports whether a field is a dependency key alone, which
// splitDeps does not take for a list: "**Dependencies**", "##
// Dependencies:".
func depHeading(field string) bool {
	switch asciiLower(strings.Trim(field, "#*_: \t")) {
	case "dependencies", "dependency", "deps":
		return true
	}
	return false
}

// taskIndex finds the task that t names among the tasks read so far:
// by its id, else, for a bare number, the one task of that number.
type taskIndex struct {
	ids      map[string]int
	byNumber map[int][]int
}

func (x *taskIndex) add(id string, i int) {
	if x.ids == nil {
		x.ids, x.byNumber = map[string]int{}, map[int][]int{}
	}
	if _, ok := x.ids[id]; !ok {
		x.ids[id] = i
	}
	if k, ok := taskNumber(id); ok {
		x.byNumber[k] = append(x.byNumber[k], i)
	}
}

func (x *taskIndex) find(t taskDep) int {
	if i, ok := x.ids[t.id]; ok {
		return i
	}
	if c := x.byNumber[t.number]; t.byNumber && len(c) == 1 {
		return c[0]
	}
	return -1
}

func taskNumber(id string) (int, bool) {
	k := 0
	if len(id) < 2 || len(id) > 8 {
		return 0, false
	}
	for i := 1; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return 0, false
		}
		k = 10*k + int(id[i]-'0')
	}
	return k, true
}

// applyEdges adds the dependencies that statements give to the tasks they
// name; a statement about a task the plan does not have is an error.
func applyEdges(m *meter, x *taskIndex, nodes []rawNode, edges []depEdge, deps map[int][]taskDep, sawDeps map[int]bool) *Error {
	for _, e := range edges {
		m.add(len(e.tasks) + len(e.deps))
		for _, t := range e.tasks {
			i := x.find(t)
			if i < 0 || i >= len(nodes) {
				return &Error{Kind: ErrSyntax, Line: e.line, Node: t.id, Message: fmt.Sprintf(
					"the dependency line %q (line %d) is about %s, which is not a task of the plan; name the tasks by their ids, as in \"T3 depends on T2\"",
					e.text, e.line, t.id)}
			}
			deps[i] = append(deps[i], e.deps...)
			sawDeps[i] = true
		}
	}
	return nil
}

// A <plan> may also be followed by its dependencies, between </plan> and
// the first tag after it (its calls, usually):
//
//	</plan>
//	Dependencies:
//	- T2 depends on T1
//	<search>…</search>
//
// Below that tag a dependency line may only say what the plan says: one
// that would add a dependency is an error (strayDeps). So once the tag is
// written, no later text can add a dependency to a task, and a streamed
// plan may release its tasks.

// planTail is what the text after a </plan> adds to its plan.
type planTail struct {
	edges []depEdge
	end   int // the end of its last dependency line, else the </plan>'s
	tag   int // the first tag after the </plan>, or -1
}

// readTail reads the dependency lines between the </plan> that ends at
// after and the first tag after it.
func readTail(d *doc, o *Options, after int) (planTail, *Error) {
	t := planTail{tag: nextTag(d, after)}
	to := t.tag
	if to < 0 {
		to = len(d.text)
	}
	var err *Error
	t.edges, t.end, err = depLines(d, o, after, to, true)
	return t, err
}

// nextTag returns the offset of the first tag (<name or </name) at or
// after from, or -1.
func nextTag(d *doc, from int) int {
	for i := from; i < len(d.text); {
		k := strings.IndexByte(d.text[i:], '<')
		if k < 0 {
			d.m.add(len(d.text) - i)
			return -1
		}
		d.m.add(k + 1)
		i += k + 1
		if i < len(d.text) && (d.text[i] == '/' || isIdentStart(d.text[i])) {
			return i - 1
		}
	}
	return -1
}

// depLines reads the dependency lines of d.text[from:to], text outside a
// plan: a heading (an empty "Dependencies:", "## Dependencies") and the
// statements under it, "Dependencies: T2 depends on T1", and statements in
// strict wording on their own line ("T2 depends on T1"). Other lines are
// prose, and end a heading's statements; with tasks, a task line ends
// them all: the tasks written again, for nextPlan to read. end is the end
// of the last dependency line read, else from.
func depLines(d *doc, o *Options, from, to int, tasks bool) (edges []depEdge, end int, perr *Error) {
	end = from
	section := false
	for off := from; off < to; {
		lineEnd := to
		if nl := strings.IndexByte(d.text[off:to], '\n'); nl >= 0 {
			lineEnd = off + nl
		}
		line := d.text[off:lineEnd]
		d.m.add(16 * (len(line) + 1))
		lineNo := d.line(off)
		off = lineEnd + 1
		item, bullet := listItem(line)
		if item == "" {
			continue
		}
		if depHeading(item) {
			section, end = true, lineEnd
			continue
		}
		stmt, strict := item, !section
		desc, list, keyed := splitDeps(d.m, item)
		if keyed = keyed && strings.Trim(desc, "#*_ \t") == ""; keyed {
			switch {
			case !strings.ContainsFunc(list, isAlnum):
				section, end = true, lineEnd
				continue
			case noDeps(asciiLower(list)):
				end = lineEnd // names no task: adds nothing
				continue
			}
			stmt, strict = list, false
		}
		es, _, ok, err := depStatement(d.m, stmt, o.MaxNodes, strict)
		if err != nil {
			return nil, 0, &Error{Kind: ErrSyntax, Line: lineNo, Message: fmt.Sprintf("the dependency line %q (line %d): %v", item, lineNo, err)}
		}
		switch {
		case ok:
			for _, e := range es {
				e.line, e.text = lineNo, item
				edges = append(edges, e)
			}
			end = lineEnd
			continue
		case keyed:
			return nil, 0, &Error{Kind: ErrSyntax, Line: lineNo, Message: fmt.Sprintf(
				"the dependency line %q (line %d) after the </plan> does not say which task depends on which; write one on each line, as in \"T3 depends on T1, T2\", or write the dependencies in the <plan>",
				item, lineNo)}
		case tasks && isTaskLine(line):
			return edges, end, nil
		case section && bullet:
			return nil, 0, &Error{Kind: ErrSyntax, Line: lineNo, Message: fmt.Sprintf(
				"the line %q (line %d) under the dependencies does not say which task depends on which; write one on each line, as in \"T3 depends on T1, T2\" or \"T1: none\"",
				item, lineNo)}
		}
		section = false
	}
	return edges, end, nil
}

// strayDeps checks the dependency lines of d.text[from:to], below the
// first tag after a </plan> (from; -1: none): each may only say what the
// plan's nodes say, since the plan's tasks may already be running.
func strayDeps(d *doc, o *Options, nodes []rawNode, from, to int) *Error {
	if from < 0 || from >= to {
		return nil
	}
	edges, _, err := depLines(d, o, from, to, false)
	if err != nil || len(edges) == 0 {
		return err
	}
	var x taskIndex
	has := map[[2]string]bool{} // task, dependency
	for i, n := range nodes {
		x.add(n.ID, i)
		d.m.add(1 + len(n.Deps))
		for _, dep := range n.Deps {
			has[[2]string{n.ID, dep}] = true
		}
	}
	for _, e := range edges {
		d.m.add(len(e.tasks) * (1 + len(e.deps)))
		for _, t := range e.tasks {
			i := x.find(t)
			if i < 0 {
				return &Error{Kind: ErrSyntax, Line: e.line, Node: t.id, Message: fmt.Sprintf(
					"the dependency line %q (line %d) is about %s, which is not a task of the plan; name the tasks by their ids, as in \"T3 depends on T2\"",
					e.text, e.line, t.id)}
			}
			for _, dep := range e.deps {
				id := dep.id
				if j := x.find(dep); j >= 0 {
					id = nodes[j].ID
				}
				if !has[[2]string{nodes[i].ID, id}] {
					return &Error{Kind: ErrSyntax, Line: e.line, Node: nodes[i].ID, Message: fmt.Sprintf(
						"the dependency line %q (line %d) comes after the plan's tool calls, and the plan does not say it; write the dependencies in the <plan>, or right after </plan>",
						e.text, e.line)}
				}
			}
		}
	}
	return nil
}

func isTaskLine(line string) bool {
	_, _, ok := taskLine(line)
	return ok
}

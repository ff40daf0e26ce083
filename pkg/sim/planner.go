package sim

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The simulated planner's prompt contract (what planact writes):
//
//	Question: <question>                 first such line
//	Plan format: <graph|tasklist|json|numbered|steps>   optional, default graph
//	- <tool>: <description>              tools offered; a tool named like "search" is used
//	<observation>                        after each of the model's earlier outputs
//	s1 search("capital of France") -> Paris
//	s3 search("x") -> ERROR: <message>   (or SKIPPED: <reason>) -> re-planned next turn
//	</observation>
//	<observation>
//	Your plan could not be used: <error>
//	</observation>
//
// The planner derives the lookups of the question, takes the ones already
// answered from the observations (matched by query text) and writes either
// <answer>…</answer> or a plan of the remaining lookups in the requested format.

// Plan formats the simulated planner writes.
const (
	FormatGraph    = "graph"
	FormatTaskList = "tasklist"
	FormatJSON     = "json"
	FormatNumbered = "numbered"
	FormatSteps    = "steps"
)

// Formats lists every plan format.
var Formats = []string{FormatGraph, FormatTaskList, FormatJSON, FormatNumbered, FormatSteps}

var (
	questionLineRe = regexp.MustCompile(`(?m)^[ \t]*Question:[ \t]*(.+?)[ \t]*$`)
	formatLineRe   = regexp.MustCompile(`(?mi)^[ \t]*Plan format:[ \t]*([A-Za-z_-]+)`)
	toolLineRe     = regexp.MustCompile(`(?m)^[ \t]*-[ \t]*([A-Za-z_][\w.-]*)[ \t]*:`)
	observationRe  = regexp.MustCompile(`(?s)<observation>(.*?)</observation>`)
)

// plannerPrompt is what the simulated planner reads from its prompt.
type plannerPrompt struct {
	question   string // as written, markers included
	format     string
	tool       string
	observed   map[string]string // normQuery(input) -> output, successful acts only
	failed     int               // ERROR / SKIPPED lines
	planErrors int               // "Your plan could not be used" blocks
	turns      int               // observation blocks
}

func parsePlannerPrompt(prompt string) plannerPrompt {
	p := plannerPrompt{format: FormatGraph, tool: "search", observed: map[string]string{}}
	if m := questionLineRe.FindStringSubmatch(prompt); m != nil {
		p.question = m[1]
	}
	if m := formatLineRe.FindStringSubmatch(prompt); m != nil {
		f := strings.ToLower(m[1])
		switch f {
		case "task_list", "task-list", "tasks":
			f = FormatTaskList
		case "step":
			f = FormatSteps
		}
		for _, known := range Formats {
			if f == known {
				p.format = f
			}
		}
	}
	var tools []string
	for _, m := range toolLineRe.FindAllStringSubmatch(prompt, -1) {
		if !strings.EqualFold(m[1], "Dependencies") {
			tools = append(tools, m[1])
		}
	}
	if len(tools) > 0 {
		p.tool = tools[0]
		for _, t := range tools {
			if strings.Contains(strings.ToLower(t), "search") {
				p.tool = t
				break
			}
		}
	}
	for _, block := range observationRe.FindAllStringSubmatch(prompt, -1) {
		p.turns++
		for line := range strings.SplitSeq(block[1], "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			if strings.HasPrefix(line, "Your plan could not be used") {
				p.planErrors++
				continue
			}
			input, output, ok := parseObservationLine(line)
			if !ok {
				continue
			}
			if strings.HasPrefix(output, "ERROR") || strings.HasPrefix(output, "SKIPPED") {
				p.failed++
				continue
			}
			p.observed[normQuery(input)] = output
		}
	}
	return p
}

// parseObservationLine reads `<id> <tool>("<input>") -> <output>`.
func parseObservationLine(line string) (input, output string, ok bool) {
	open := strings.Index(line, "(")
	arrow := strings.LastIndex(line, ") -> ")
	if open < 0 || arrow < open {
		if arrow = strings.LastIndex(line, ")->"); arrow < open || open < 0 {
			return "", "", false
		}
		input, output = line[open+1:arrow], line[arrow+3:]
	} else {
		input, output = line[open+1:arrow], line[arrow+5:]
	}
	input = strings.TrimSpace(input)
	if len(input) >= 2 && input[0] == '"' && input[len(input)-1] == '"' {
		var s string
		if err := json.Unmarshal([]byte(input), &s); err == nil {
			input = s
		} else {
			input = input[1 : len(input)-1]
		}
	}
	return input, strings.TrimSpace(output), true
}

// planNode is one node the planner writes.
type planNode struct {
	query string // with {k} placeholders that refer to other nodes by index
	deps  []int  // node indexes
	tool  string
}

// planFault is how a written plan is broken on purpose.
type planFault int

const (
	planOK planFault = iota
	planMalformed
	planCyclic
	planTruncated
	planToolInvalid
)

// plannerTurn decides the planner's output for a prompt: an answer or the
// nodes to plan. stepwise plans only the lookups that can run now.
func (w *World) plannerTurn(p plannerPrompt, stepwise bool) (answer string, nodes []planNode, think string, ok bool) {
	qp, ok := parseQuestion(p.question)
	if !ok {
		return "unknown", nil, "I do not know how to break this question down.", true
	}
	n := len(qp.steps)
	vals := make([]string, n)
	known := make([]bool, n)
	for i, s := range qp.steps {
		ready := true
		for _, k := range refs(s) {
			ready = ready && known[k]
		}
		if !ready {
			continue
		}
		q := fill(s, vals, func(k int) string { return vals[k] })
		if v, seen := p.observed[normQuery(q)]; seen {
			vals[i], known[i] = v, true
		}
	}
	pending := []int{}
	for i := range n {
		if !known[i] {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		ans := qp.answer(vals)
		think = "The observations give me everything I need."
		if qp.kind.compare != "" {
			think = fmt.Sprintf("%s has %s people and %s has %s, so the capital with the %s population is %s.",
				vals[0], vals[2], vals[1], vals[3], qp.kind.compare, ans)
		}
		return ans, nil, think, true
	}
	if stepwise {
		var ready []int
		for _, i := range pending {
			ok := true
			for _, k := range refs(qp.steps[i]) {
				ok = ok && known[k]
			}
			if ok {
				ready = append(ready, i)
			}
		}
		pending = ready
	}
	// Node index of each pending step, so placeholders can point at nodes.
	nodeOf := map[int]int{}
	for ni, si := range pending {
		nodeOf[si] = ni
	}
	var descs []string
	for _, si := range pending {
		nd := planNode{tool: p.tool}
		var deps []int
		nd.query = fill(qp.steps[si], vals, func(k int) string {
			if known[k] {
				return vals[k]
			}
			deps = append(deps, nodeOf[k])
			return fmt.Sprintf("{%d}", nodeOf[k])
		})
		nd.deps = deps
		nodes = append(nodes, nd)
		descs = append(descs, fill(qp.steps[si], vals, func(k int) string {
			if known[k] {
				return vals[k]
			}
			return "that"
		}))
	}
	switch {
	case p.failed > 0:
		think = "Some lookups failed; I will try them again: " + strings.Join(descs, "; ") + "."
	case len(p.observed) > 0:
		think = "I still need: " + strings.Join(descs, "; ") + "."
	default:
		think = "I need to look up: " + strings.Join(descs, "; ") + "."
	}
	return "", nodes, think, true
}

// nodeIDs and placeholders of each format.
func formatIDs(format string, i int) (id, ref string) {
	switch format {
	case FormatTaskList, FormatJSON:
		return fmt.Sprintf("T%d", i+1), fmt.Sprintf("{T%d}", i+1)
	case FormatNumbered:
		return fmt.Sprintf("%d", i+1), fmt.Sprintf("$%d", i+1)
	case FormatSteps:
		return fmt.Sprintf("step_%d", i+1), fmt.Sprintf("{step_%d}", i+1)
	default:
		return fmt.Sprintf("s%d", i+1), fmt.Sprintf("{s%d}", i+1)
	}
}

// renderPlan writes nodes in a plan format.
func renderPlan(format, think string, nodes []planNode) string {
	ids := make([]string, len(nodes))
	queries := make([]string, len(nodes))
	deps := make([][]string, len(nodes))
	for i, nd := range nodes {
		ids[i], _ = formatIDs(format, i)
		queries[i] = placeholderRe.ReplaceAllStringFunc(nd.query, func(m string) string {
			var k int
			fmt.Sscanf(m, "{%d}", &k)
			_, ref := formatIDs(format, k)
			return ref
		})
	}
	for i, nd := range nodes {
		deps[i] = []string{}
		for _, d := range nd.deps {
			deps[i] = append(deps[i], ids[d])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<think>%s</think>\n", think)
	switch format {
	case FormatTaskList:
		b.WriteString("<plan>\n")
		for i := range nodes {
			fmt.Fprintf(&b, "%s: Find the %s\n", ids[i], describe(queries[i], format))
			d := "none"
			if len(deps[i]) > 0 {
				d = strings.Join(deps[i], ", ")
			}
			fmt.Fprintf(&b, "- Dependencies: %s\n", d)
		}
		b.WriteString("</plan>\n")
		// Calls are assigned to the tasks in order; one tag per tool run.
		for i := 0; i < len(nodes); {
			j := i
			for j < len(nodes) && nodes[j].tool == nodes[i].tool {
				j++
			}
			fmt.Fprintf(&b, "<%s>%s</%s>\n", nodes[i].tool, strings.Join(queries[i:j], "|"), nodes[i].tool)
			i = j
		}
	case FormatJSON:
		type jnode struct {
			ID        string            `json:"id"`
			Tool      string            `json:"tool"`
			Args      map[string]string `json:"args"`
			DependsOn []string          `json:"depends_on"`
		}
		var js struct {
			Nodes []jnode `json:"nodes"`
		}
		for i, nd := range nodes {
			js.Nodes = append(js.Nodes, jnode{ids[i], nd.tool, map[string]string{"query": queries[i]}, deps[i]})
		}
		data, _ := json.Marshal(js)
		b.Write(data)
		b.WriteString("\n")
	case FormatNumbered:
		fmt.Fprintf(&b, "Thought: %s\n", think)
		for i, nd := range nodes {
			q := queries[i]
			// Numbered plans carry dependencies only as $k references.
			for _, d := range deps[i] {
				if !strings.Contains(q, "$"+d) {
					q += " $" + d
				}
			}
			fmt.Fprintf(&b, "%d. %s(%s)\n", i+1, nd.tool, quote(q))
		}
		fmt.Fprintf(&b, "%d. join()\n", len(nodes)+1)
	case FormatSteps:
		type jstep struct {
			ID           string            `json:"id"`
			Action       string            `json:"action"`
			Params       map[string]string `json:"params"`
			Dependencies []string          `json:"dependencies"`
			Description  string            `json:"description"`
		}
		var steps []jstep
		for i, nd := range nodes {
			steps = append(steps, jstep{ids[i], nd.tool, map[string]string{"query": queries[i]}, deps[i],
				"Find the " + describe(queries[i], format)})
		}
		data, _ := json.Marshal(steps)
		b.Write(data)
		b.WriteString("\n")
	default:
		b.WriteString("<graph>\n")
		for i, nd := range nodes {
			dep := ""
			if len(deps[i]) > 0 {
				dep = fmt.Sprintf(" depends=%q", strings.Join(deps[i], ","))
			}
			fmt.Fprintf(&b, "<node id=%q%s>%s(%s)</node>\n", ids[i], dep, nd.tool, quote(queries[i]))
		}
		b.WriteString("</graph>\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// describe turns a query into a task description: placeholders become words.
func describe(q, format string) string {
	return strings.TrimSpace(markerRe.ReplaceAllString(refWordRe.ReplaceAllString(q, "the result of $1"), ""))
}

var refWordRe = regexp.MustCompile(`[{$]\{?((?:s|T|step_)?[0-9]+)\}?`)

func quote(s string) string {
	data, _ := json.Marshal(s)
	r := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&")
	return r.Replace(string(data))
}

// breakPlan applies a plan fault to the nodes before rendering, or to the
// rendered text after it. It returns the text and whether it was truncated.
func breakPlan(f planFault, format, think string, nodes []planNode) (string, bool) {
	switch f {
	case planToolInvalid:
		nodes = append([]planNode(nil), nodes...)
		nodes[0].tool = InvalidTool
		return renderPlan(format, think, nodes), false
	case planCyclic:
		nodes = append([]planNode(nil), nodes...)
		last := len(nodes) - 1
		first := nodes[0]
		first.deps = append(append([]int(nil), first.deps...), last)
		first.query += fmt.Sprintf(" {%d}", last)
		nodes[0] = first
		if last > 0 && !slices.Contains(nodes[last].deps, 0) {
			// Close the loop: the last node also waits for the first.
			nd := nodes[last]
			nd.deps = append(append([]int(nil), nd.deps...), 0)
			nd.query += " {0}"
			nodes[last] = nd
		}
		return renderPlan(format, think, nodes), false
	case planTruncated:
		// Cut inside the first node, as if max_new_tokens ran out there.
		text := renderPlan(format, think, nodes)
		_, body, _ := strings.Cut(text, "</think>")
		at := len(text) - len(body)
		if i := strings.Index(body, nodes[0].query); i >= 0 {
			return text[:at+i+len(nodes[0].query)/2], true
		}
		return text[:len(text)*3/5], true
	case planMalformed:
		text := renderPlan(format, think, nodes)
		switch format {
		case FormatJSON:
			return strings.Replace(strings.Replace(text, `"depends_on":[`, `"depends_on":[,`, 1), "]}", "]", 1), false
		case FormatSteps:
			return strings.Replace(strings.Replace(text, `"dependencies":[`, `"dependencies":[,`, 1), `"id":`, `"id"`, 1), false
		case FormatTaskList:
			// Tasks without calls, and no closing tag.
			text = text[:strings.Index(text, "</plan>")]
			return strings.Replace(text, ": Find", " Find", 1), false
		case FormatNumbered:
			return strings.Replace(text, "\")\n", "\"\n", 1), false
		default:
			text = strings.Replace(text, "</graph>", "", 1)
			return strings.Replace(text, "<node id=\"s1\"", "<node", 1), false
		}
	}
	return renderPlan(format, think, nodes), false
}

// widePlan is the planner's turn with PlanWidth set: width independent
// lookups first, the answer once they were observed.
func widePlan(p plannerPrompt, question string, width int) (string, bool) {
	if p.turns > 0 {
		return fmt.Sprintf("<think>I have what I need.</think>\n<answer>%d facts about %s</answer>", len(p.observed), question), false
	}
	nodes := make([]planNode, width)
	for i := range nodes {
		// Short queries: a plan of many nodes stays well inside the
		// planner's token budget in every format.
		nodes[i] = planNode{query: fmt.Sprintf("fact %d of q%x", i+1, hash64(0, question)&0xffffff), tool: p.tool}
	}
	return breakPlan(planOK, p.format, fmt.Sprintf("%d independent lookups.", width), nodes)
}

package plan

import (
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/dag"
)

// inputKeys are the argument names that hold a node's main text, in order
// of preference.
var inputKeys = []string{"input", "query", "prompt", "question", "expression"}

// Input returns the node's main text argument: "input", "query", "prompt",
// "question" or "expression", else the first string argument by key, else "".
func (n Node) Input() string {
	for _, k := range inputKeys {
		if s, ok := n.Args[k].(string); ok {
			return s
		}
	}
	for _, k := range sortedKeys(n.Args) {
		if s, ok := n.Args[k].(string); ok {
			return s
		}
	}
	return ""
}

func (p *Plan) graph() ([]string, map[string][]string) {
	ids := make([]string, len(p.Nodes))
	deps := make(map[string][]string, len(p.Nodes))
	for i, n := range p.Nodes {
		ids[i] = n.ID
		deps[n.ID] = n.Deps
	}
	return ids, deps
}

// Levels returns the node ids grouped by topological level: level 0 needs
// nothing, level k needs only nodes of lower levels. Within a level nodes
// keep plan order. It returns nil for a plan that does not validate.
func (p *Plan) Levels() [][]string {
	ids, deps := p.graph()
	lv, err := dag.Levels(ids, deps)
	if err != nil {
		return nil
	}
	return lv
}

// CriticalPath returns the chain of dependent nodes with the largest total
// cost, in execution order, and that cost. cost nil counts each node as 1.
func (p *Plan) CriticalPath(cost func(Node) float64) ([]string, float64) {
	ids, deps := p.graph()
	var c func(string) float64
	if cost != nil {
		byID := make(map[string]Node, len(p.Nodes))
		for _, n := range p.Nodes {
			byID[n.ID] = n
		}
		c = func(id string) float64 { return cost(byID[id]) }
	}
	return dag.CriticalPath(ids, deps, c)
}

// DOT renders the plan as a Graphviz digraph; edges point from a
// dependency to the node that uses it, and labels show id, tool and input.
func (p *Plan) DOT() string {
	var b strings.Builder
	b.WriteString("digraph plan {\n\trankdir=LR;\n\tnode [shape=box, fontname=\"Helvetica\"];\n")
	for _, n := range p.Nodes {
		label := n.ID + ": " + n.Tool
		if in := n.Input(); in != "" {
			label += "\n" + shorten(in, 60)
		}
		fmt.Fprintf(&b, "\t%s [label=%s];\n", dotQuote(n.ID), dotQuote(label))
	}
	for _, n := range p.Nodes {
		for _, d := range n.Deps {
			fmt.Fprintf(&b, "\t%s -> %s;\n", dotQuote(d), dotQuote(n.ID))
		}
	}
	b.WriteString("}\n")
	return b.String()
}

func dotQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// shorten cuts s to at most n runes, marking the cut with "…".
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

package plan_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/plan"
)

var (
	dupDepsOnce sync.Once
	dupDeps     []plan.Node // the nodes the format last returned
)

// TestCustomFormatRepeatedDeps: a dependency a registered format names
// twice is one dependency, as in the built-in formats, and the format's
// own nodes are left as they are; an empty one is an error naming the node.
func TestCustomFormatRepeatedDeps(t *testing.T) {
	dupDepsOnce.Do(func() { // -count=N runs the test N times in one process
		plan.RegisterFormat("dupdeps-test", plan.CustomFormat{
			Instructions: "id: query <- deps, one node a line",
			Parse: func(text string) ([]plan.Node, error) {
				var nodes []plan.Node
				for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
					head, deps, _ := strings.Cut(line, "<-")
					id, q, _ := strings.Cut(head, ":")
					n := plan.Node{ID: strings.TrimSpace(id), Tool: "search", Args: map[string]any{"query": strings.TrimSpace(q)}}
					if deps = strings.TrimSpace(deps); deps != "" || strings.Contains(line, "<-") {
						n.Deps = strings.Split(deps, ",")
					}
					nodes = append(nodes, n)
				}
				dupDeps = nodes
				return nodes, nil
			},
		})
	})
	opts := plan.Options{Format: "dupdeps-test", Tools: []string{"search"}}
	r, err := plan.Parse("a: x\nb: y\nc: {a} {b} <- a,b,a", opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Plan.Nodes[2].Deps; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("c depends on %q; want [a b]", got)
	}
	if !slices.Equal(dupDeps[2].Deps, []string{"a", "b", "a"}) {
		t.Errorf("the format's own node was changed: %q", dupDeps[2].Deps)
	}
	_, err = plan.Parse("a: x\nb: {a} <- ", opts)
	var pe *plan.Error
	const want = "dupdeps-test plan: node b has an empty dependency"
	if !errors.As(err, &pe) || pe.Kind != plan.ErrSyntax || pe.Message != want {
		t.Errorf("empty dependency: %v; want %s", err, want)
	}
}

package plan_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/plan"
)

// once registers the test's own entry once per process.
var once sync.Once

// TestRegisterFormat: a registered format parses when asked for, its
// nodes validated as every plan's; answers are found before it.
func TestRegisterFormat(t *testing.T) {
	once.Do(func() { // -count=N runs the test N times in one process
		plan.RegisterFormat("pairs-test", plan.CustomFormat{
			Instructions: "one id=query per line",
			Parse: func(text string) ([]plan.Node, error) {
				var nodes []plan.Node
				for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
					id, q, ok := strings.Cut(line, "=")
					if !ok {
						return nil, errors.New("want id=query on every line")
					}
					deps := []string{}
					if i := strings.Index(q, "{"); i >= 0 {
						deps = append(deps, strings.Trim(q[i:], "{}"))
					}
					nodes = append(nodes, plan.Node{ID: id, Tool: "search", Args: map[string]any{"query": q}, Deps: deps})
				}
				return nodes, nil
			},
		})
	})
	opts := plan.Options{Format: "pairs-test", Tools: []string{"search"}}
	r, err := plan.Parse("a=capital of France\nb=population of {a}", opts)
	if err != nil || r.Plan == nil || r.Plan.Format != "pairs-test" || len(r.Plan.Nodes) != 2 {
		t.Fatalf("parse: %+v %v", r, err)
	}
	for text, kind := range map[string]plan.ErrorKind{
		"a=x {b}\nb=y {a}": plan.ErrCycle,
		"no pairs here":    plan.ErrSyntax,
		"a=x {c}":          plan.ErrUnknownDependency,
	} {
		_, err := plan.Parse(text, opts)
		var pe *plan.Error
		if !errors.As(err, &pe) || pe.Kind != kind {
			t.Errorf("%q: %v, want %s", text, err, kind)
		}
	}
	if r, err := plan.Parse("<answer>Paris</answer>", opts); err != nil || len(r.Answers) != 1 {
		t.Errorf("answer: %+v %v", r, err)
	}
	if _, ok := plan.Custom("pairs-test"); !ok {
		t.Error("Custom does not find the format")
	}
	for _, name := range []plan.Format{"graph", "pairs-test", "Bad"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RegisterFormat(%q) did not panic", name)
				}
			}()
			plan.RegisterFormat(name, plan.CustomFormat{Parse: func(string) ([]plan.Node, error) { return nil, nil }, Instructions: "x"})
		}()
	}
}

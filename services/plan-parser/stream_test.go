package planparser

import (
	"slices"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestParsePartialHoldsTaskDependencies: a streamed task list whose tasks
// name their tools is released, chunk by chunk, only as the whole output
// has it: a task waits while a dependency section below it could still
// add to its dependencies.
func TestParsePartialHoldsTaskDependencies(t *testing.T) {
	cfg := schema.DefaultConfig()
	const text = "<plan>\nT1: search(\"capital of France\")\nT2: search(\"population of Paris\")\nT3: Compare them\nDependencies:\n- T2 depends on T1\n- T3 depends on T1, T2\n</plan>\n<search>compare {T1} and {T2}</search>\n"
	final, ok := Parse(&schema.PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: text, FinishReason: "stop"}, cfg).(*schema.PlanDAG)
	if !ok {
		t.Fatal("the whole output is not a plan")
	}
	deps := map[string][]string{}
	for _, n := range final.Plan.Nodes {
		deps[n.ID] = n.Deps
	}
	released := 0
	for end := 1; end <= len(text); end++ {
		d := ParsePartial(&schema.PlanPartial{Rollout: 7, Episode: 2, Turn: 3, Seq: end, Text: text[:end]}, cfg)
		if d == nil {
			continue
		}
		for _, n := range d.Plan.Nodes {
			if !slices.Equal(n.Deps, deps[n.ID]) {
				t.Fatalf("after %q, %s is released with the dependencies %v; the plan gives it %v", text[:end], n.ID, n.Deps, deps[n.ID])
			}
		}
		released = max(released, len(d.Plan.Nodes))
	}
	if released != 3 {
		t.Errorf("released %d tasks while the plan streamed, want 3 once its call came", released)
	}
}

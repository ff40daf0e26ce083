package actdispatcher

import (
	"reflect"
	"testing"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

func TestApplyPlanMergesStreamedPlans(t *testing.T) {
	node := func(id, input string, deps ...string) plan.Node {
		return plan.Node{ID: id, Tool: "search", Args: map[string]any{"input": input}, Deps: deps}
	}
	a, b := node("a", "capital of France"), node("b", "capital of Japan")
	c, d := node("c", "population of {a}", "a"), node("d", "compare {b} and {c}", "b", "c")
	dag := func(partial bool, seq int, nodes ...plan.Node) *schema.PlanDAG {
		return &schema.PlanDAG{Rollout: 1, Episode: 0, Turn: 1, Partial: partial, Seq: seq, Plan: plan.Plan{Nodes: nodes}}
	}
	partial := func(seq int, nodes ...plan.Node) *schema.PlanDAG { return dag(true, seq, nodes...) }
	final := func(nodes ...plan.Node) *schema.PlanDAG { return dag(false, 0, nodes...) }

	// A step applies a DAG (and advances, as handleDAG does) or records an
	// act's outcome (as handleDone does); want is what the step released.
	type step struct {
		dag          *schema.PlanDAG
		done, status string
		want         []string
	}
	cases := []struct {
		name      string
		policy    string
		steps     []step
		ids       []string          // the run's nodes, in order
		status    map[string]string // of some nodes
		input     map[string]string // as executed, of some nodes
		conflicts []string
	}{
		{
			name: "partials then final",
			steps: []step{
				{dag: partial(1, a), want: []string{"a"}},
				{dag: partial(2, a, b), want: []string{"b"}},
				{done: "a", status: schema.NodeDone, want: []string{}},
				{dag: final(a, b, c, d), want: []string{"c"}},
			},
			ids:    []string{"a", "b", "c", "d"},
			status: map[string]string{"a": schema.NodeDone, "b": schema.NodeReleased, "c": schema.NodeReleased, "d": schema.NodePending},
			input:  map[string]string{"c": "population of Paris"},
		},
		{
			name: "a partial that arrives late changes nothing",
			steps: []step{
				{dag: partial(2, a, b), want: []string{"a", "b"}},
				{dag: partial(1, a), want: []string{}},
				{dag: final(a, b, c), want: []string{}},
				{dag: partial(3, a, b, c, d), want: []string{}},
			},
			ids: []string{"a", "b", "c"},
		},
		{
			name: "the final plan replaces a pending node",
			steps: []step{
				{dag: partial(1, a, c), want: []string{"a"}},
				{dag: final(a, node("c", "area of {a}", "a")), want: []string{}},
				{done: "a", status: schema.NodeDone, want: []string{"c"}},
			},
			ids:   []string{"a", "c"},
			input: map[string]string{"c": "area of Paris"},
		},
		{
			name: "a released node stays as it ran",
			steps: []step{
				{dag: partial(1, a), want: []string{"a"}},
				{dag: final(node("a", "capital of Spain"), b), want: []string{"b"}},
			},
			ids:       []string{"a", "b"},
			input:     map[string]string{"a": "capital of France"},
			conflicts: []string{"a"},
		},
		{
			name: "a released node with placeholders matches its final self",
			steps: []step{
				{dag: partial(1, a, c), want: []string{"a"}},
				{done: "a", status: schema.NodeDone, want: []string{"c"}},
				{dag: final(a, c, b), want: []string{"b"}},
			},
			ids: []string{"a", "c", "b"},
		},
		{
			name: "the final plan drops what it does not have",
			steps: []step{
				{dag: partial(1, a, c), want: []string{"a"}},
				{dag: final(b), want: []string{"b"}},
			},
			ids:       []string{"a", "b"}, // c was pending: dropped; a ran: kept
			conflicts: []string{"a"},
		},
		{
			name:   "nodes that come after a failure that stopped the turn are skipped",
			policy: schema.PolicyReplan,
			steps: []step{
				{dag: partial(1, a), want: []string{"a"}},
				{done: "a", status: schema.NodeFailed, want: []string{}},
				{dag: final(a, b), want: []string{}},
			},
			ids:    []string{"a", "b"},
			status: map[string]string{"b": schema.NodeSkipped},
		},
		{
			name:   "under policy skip they run",
			policy: schema.PolicySkip,
			steps: []step{
				{dag: partial(1, a), want: []string{"a"}},
				{done: "a", status: schema.NodeFailed, want: []string{}},
				{dag: final(a, b, c), want: []string{"b"}},
			},
			ids:    []string{"a", "b", "c"},
			status: map[string]string{"b": schema.NodeReleased, "c": schema.NodeSkipped},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			policy := tc.policy
			if policy == "" {
				policy = schema.PolicyReplan
			}
			var r schema.Run
			exists := false
			var conflicts []string
			for i, s := range tc.steps {
				var got []string
				if s.dag != nil {
					changed, c := applyPlan(&r, exists, s.dag, schema.ScheduleEager, policy)
					if !exists && !changed {
						t.Fatalf("step %d: creating the run is a change", i)
					}
					exists = true
					conflicts = append(conflicts, c...)
					run, _ := advance(&r, nil)
					got = keys(run)
				} else {
					got = finish(&r, s.done, s.status, "Paris")
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d released %v, want %v", i, got, s.want)
				}
			}
			if ids := keys(r.Nodes); !reflect.DeepEqual(ids, tc.ids) {
				t.Errorf("nodes %v, want %v", ids, tc.ids)
			}
			for _, n := range r.Nodes {
				if want, ok := tc.status[n.Node.ID]; ok && n.Status != want {
					t.Errorf("node %s is %s, want %s", n.Node.ID, n.Status, want)
				}
				if want, ok := tc.input[n.Node.ID]; ok && n.Input != want {
					t.Errorf("node %s ran with %q, want %q", n.Node.ID, n.Input, want)
				}
			}
			if !reflect.DeepEqual(conflicts, tc.conflicts) {
				t.Errorf("conflicts %v, want %v", conflicts, tc.conflicts)
			}
			if !r.Complete {
				t.Error("the run is not complete after its final plan")
			}
		})
	}
}

// A run whose every node is terminal is not over while its plan is still
// being written: only the final plan completes it.
func TestPartialRunIsNotComplete(t *testing.T) {
	var r schema.Run
	a := plan.Node{ID: "a", Tool: "search", Args: map[string]any{"input": "capital of France"}}
	applyPlan(&r, false, &schema.PlanDAG{Turn: 1, Partial: true, Seq: 1, Plan: plan.Plan{Nodes: []plan.Node{a}}}, schema.ScheduleEager, schema.PolicyReplan)
	advance(&r, nil)
	finish(&r, "a", schema.NodeDone, "Paris")
	if r.Complete || !allTerminal(&r) {
		t.Fatalf("complete %v, all terminal %v: want an incomplete run whose nodes are all done", r.Complete, allTerminal(&r))
	}
	if changed, _ := applyPlan(&r, true, &schema.PlanDAG{Turn: 1, Plan: plan.Plan{Nodes: []plan.Node{a}}}, schema.ScheduleEager, schema.PolicyReplan); !changed || !r.Complete {
		t.Fatalf("final plan: changed %v complete %v", changed, r.Complete)
	}
	if changed, _ := applyPlan(&r, true, &schema.PlanDAG{Turn: 1, Plan: plan.Plan{Nodes: []plan.Node{a}}}, schema.ScheduleEager, schema.PolicyReplan); changed {
		t.Error("a redelivered final plan changed the run")
	}
}

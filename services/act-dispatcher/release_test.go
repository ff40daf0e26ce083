package actdispatcher

import (
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// diamond: a and b are independent, c needs a, d needs b and c.
func diamond(schedule string) *schema.Run {
	node := func(id, input string, deps ...string) plan.Node {
		return plan.Node{ID: id, Tool: "search", Args: map[string]any{"input": input}, Deps: deps}
	}
	return newRun(&schema.PlanDAG{Rollout: 1, Episode: 0, Turn: 2, Plan: plan.Plan{Nodes: []plan.Node{
		node("a", "capital of France"),
		node("b", "capital of Japan"),
		node("c", "population of {a}", "a"),
		node("d", "compare {b} and {c}", "b", "c"),
	}}}, schedule)
}

func keys(ns []*schema.NodeState) []string {
	out := []string{}
	for _, n := range ns {
		out = append(out, n.Node.ID)
	}
	return out
}

// finish marks node id done (or failed) as handleDone does, then advances.
func finish(r *schema.Run, id, status, output string) []string {
	for _, n := range r.Nodes {
		if n.Node.ID == id {
			n.Status, n.Output = status, output
			if status == schema.NodeFailed {
				n.Error = "boom"
			}
		}
	}
	run, _ := advance(r, nil)
	return keys(run)
}

func TestAdvanceBySchedule(t *testing.T) {
	type step struct {
		id, status, output string
		want               []string // released by this step
	}
	cases := []struct {
		schedule string
		first    []string
		steps    []step
	}{
		{schema.ScheduleEager, []string{"a", "b"}, []step{
			{"a", schema.NodeDone, "Paris", []string{"c"}}, // c goes before b is done
			{"c", schema.NodeDone, "2.1 million", []string{}},
			{"b", schema.NodeDone, "Tokyo", []string{"d"}},
		}},
		{schema.ScheduleLevels, []string{"a", "b"}, []step{
			{"a", schema.NodeDone, "Paris", []string{}}, // level 1 waits for all of level 0
			{"b", schema.NodeDone, "Tokyo", []string{"c"}},
			{"c", schema.NodeDone, "2.1 million", []string{"d"}},
		}},
		{schema.ScheduleSequential, []string{"a"}, []step{
			{"a", schema.NodeDone, "Paris", []string{"b"}},
			{"b", schema.NodeDone, "Tokyo", []string{"c"}},
			{"c", schema.NodeDone, "2.1 million", []string{"d"}},
		}},
	}
	for _, c := range cases {
		t.Run(c.schedule, func(t *testing.T) {
			r := diamond(c.schedule)
			run, _ := advance(r, nil)
			if got := keys(run); !reflect.DeepEqual(got, c.first) {
				t.Fatalf("first release %v, want %v", got, c.first)
			}
			for _, s := range c.steps {
				if got := finish(r, s.id, s.status, s.output); !reflect.DeepEqual(got, s.want) {
					t.Fatalf("after %s %s: released %v, want %v", s.id, s.status, got, s.want)
				}
			}
			d := byID(r)["d"]
			if d.Input != "compare Tokyo and 2.1 million" {
				t.Errorf("d's input %q: placeholders not replaced by outputs", d.Input)
			}
			if allTerminal(r) {
				t.Error("d is still running; the run is not finished")
			}
		})
	}
}

func TestFailureSkipsDependentsTransitively(t *testing.T) {
	r := diamond(schema.ScheduleEager)
	advance(r, nil)
	if got := finish(r, "a", schema.NodeFailed, ""); len(got) != 0 {
		t.Fatalf("released %v after a failed", got)
	}
	ids := byID(r)
	if ids["c"].Status != schema.NodeSkipped || ids["d"].Status != schema.NodeSkipped {
		t.Fatalf("c %s, d %s: want both skipped", ids["c"].Status, ids["d"].Status)
	}
	if ids["d"].Error != "dependency c skipped" {
		t.Errorf("d's reason %q", ids["d"].Error)
	}
	finish(r, "b", schema.NodeDone, "Tokyo")
	if !allTerminal(r) {
		t.Error("every node has finished")
	}
	obs := Observation(r)
	for _, want := range []string{`a search("capital of France") -> ERROR: boom`, `b search("capital of Japan") -> Tokyo`, `d search("compare {b} and {c}") -> SKIPPED: dependency c skipped`} {
		if !strings.Contains(obs, want) {
			t.Errorf("observation lacks %q:\n%s", want, obs)
		}
	}
}

func TestDuplicateCallsAreCached(t *testing.T) {
	r := newRun(&schema.PlanDAG{Rollout: 1, Turn: 1, Plan: plan.Plan{Nodes: []plan.Node{
		{ID: "x", Tool: "search", Args: map[string]any{"input": "capital of Peru"}},
		{ID: "y", Tool: "search", Args: map[string]any{"input": "capital of Peru"}},
		{ID: "z", Tool: "search", Args: map[string]any{"input": "capital of Chile"}},
	}}}, schema.ScheduleEager)
	prior := map[string]priorAct{callKey(plan.Node{Tool: "search", Args: map[string]any{"input": "capital of Chile"}}): {Key: "t0-q", Output: "Santiago"}}
	run, cached := advance(r, prior)
	if got := keys(run); !reflect.DeepEqual(got, []string{"x"}) {
		t.Fatalf("run %v, want only x: y repeats x, z an earlier turn", got)
	}
	if got := keys(cached); !reflect.DeepEqual(got, []string{"z"}) {
		t.Fatalf("cached %v, want z", got)
	}
	ids := byID(r)
	if ids["y"].Status != schema.NodeReleased || ids["y"].CachedFrom != "t1-x" {
		t.Fatalf("y: %s from %q, want waiting on t1-x", ids["y"].Status, ids["y"].CachedFrom)
	}
	ids["x"].Status, ids["x"].Output = schema.NodeDone, "Lima"
	if w := resolveWaiters(r, ids["x"]); len(w) != 1 || ids["y"].Status != schema.NodeCached || ids["y"].Output != "Lima" {
		t.Errorf("y after x: %s %q", ids["y"].Status, ids["y"].Output)
	}
}

// A streamed plan's partial may hold a node whose dependency it does not
// hold yet (a plan that names its tasks out of order, the later one's call
// still to come). The levels schedule keeps its barrier among the nodes it
// has: c, of level 1, waits for b, of level 0, though a, its dependency, is
// done. Before, the unknown dependency failed the levels and the run was
// released eagerly: c ran beside b.
func TestLevelsHoldTheirBarrierWhileAPartialPlanLacksADependency(t *testing.T) {
	node := func(id, input string, deps ...string) plan.Node {
		return plan.Node{ID: id, Tool: "search", Args: map[string]any{"input": input}, Deps: deps}
	}
	var r schema.Run
	applyPlan(&r, false, &schema.PlanDAG{Rollout: 1, Turn: 1, Partial: true, Seq: 1, Plan: plan.Plan{Nodes: []plan.Node{
		node("a", "capital of France"),
		node("b", "capital of Japan"),
		node("c", "population of {a}", "a"),
		node("x", "compare {c} and {z}", "c", "z"), // z is not written yet
	}}}, schema.ScheduleLevels, schema.PolicyReplan)
	run, _ := advance(&r, nil)
	if got := keys(run); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("first release %v, want [a b]", got)
	}
	if got := finish(&r, "a", schema.NodeDone, "Paris"); len(got) != 0 {
		t.Fatalf("released %v while b, of the level below, runs: want nothing", got)
	}
	if got := finish(&r, "b", schema.NodeDone, "Tokyo"); !reflect.DeepEqual(got, []string{"c"}) {
		t.Fatalf("released %v once level 0 is done, want [c]", got)
	}
	// The final plan brings z: x, of level 2 now, waits for it.
	applyPlan(&r, true, &schema.PlanDAG{Rollout: 1, Turn: 1, Plan: plan.Plan{Nodes: []plan.Node{
		node("a", "capital of France"),
		node("b", "capital of Japan"),
		node("c", "population of {a}", "a"),
		node("x", "compare {c} and {z}", "c", "z"),
		node("z", "population of {b}", "b"),
	}}}, schema.ScheduleLevels, schema.PolicyReplan)
	if got, _ := advance(&r, nil); !reflect.DeepEqual(keys(got), []string{"z"}) {
		t.Fatalf("released %v after the final plan, want [z]", keys(got))
	}
	finish(&r, "c", schema.NodeDone, "2.1 million")
	if got := finish(&r, "z", schema.NodeDone, "14 million"); !reflect.DeepEqual(got, []string{"x"}) {
		t.Fatalf("released %v once level 1 is done, want [x]", got)
	}
	if x := byID(&r)["x"]; x.Input != "compare 2.1 million and 14 million" {
		t.Errorf("x's input %q", x.Input)
	}
}

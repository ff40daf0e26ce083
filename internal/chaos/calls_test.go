package chaos_test

import (
	"context"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// The ledger holds each act's engine calls against its outcome: one call
// per attempt, one per recorded retry, one per call an engine's pause
// aborted; a call beyond them is a generation nothing records, reported
// with its act.
func TestCheckEngineCalls(t *testing.T) {
	okPlanner := chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}}
	okActor := chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1"}}
	executed := map[string]bool{"0/1/s1": true, "1/1/s1": true}
	both := map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}
	once := chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 1, Calls: 1}
	tests := []struct {
		name        string
		act         chaos.ActCalls // beside act 0/t1-s1, generated once
		verdict     string
		unexplained int
	}{
		{name: "generated once", act: once, verdict: chaos.VerdictOK},
		{name: "a duplicate nothing records", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 1, Calls: 2}, verdict: chaos.VerdictDuplicate, unexplained: 1},
		{name: "a duplicate a recorded retry explains", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 1, Retries: 1, Calls: 2}, verdict: chaos.VerdictOK},
		{name: "one call per attempt", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 3, Calls: 3}, verdict: chaos.VerdictOK},
		{name: "a call an engine's pause aborted", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 1, Calls: 2, Aborted: 1}, verdict: chaos.VerdictOK},
		{name: "an outcome explains one call at least", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Calls: 1}, verdict: chaos.VerdictOK},
		{name: "three calls, a retry explains one", act: chaos.ActCalls{Act: "1/t1-s1", Outcome: true, Attempts: 1, Retries: 1, Calls: 3}, verdict: chaos.VerdictDuplicate, unexplained: 1},
		{name: "calls of an act without an outcome", act: chaos.ActCalls{Act: "1/t2-s1", Calls: 1}, verdict: chaos.VerdictDuplicate, unexplained: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := chaos.RolloutRecord{Rollout: 7, Episodes: 2, Planner: okPlanner, Actor: okActor}
			calls := []chaos.ActCalls{{Act: "0/t1-s1", Outcome: true, Attempts: 1, Calls: 1}, tc.act}
			c := chaos.Check(rec, both, executed, calls)
			if c.Verdict != tc.verdict || c.UnexplainedCalls != tc.unexplained || c.ActCalls != 1+tc.act.Calls {
				t.Fatalf("verdict %s, unexplained calls %d, act calls %d; want %s, %d, %d\nproblems: %q",
					c.Verdict, c.UnexplainedCalls, c.ActCalls, tc.verdict, tc.unexplained, 1+tc.act.Calls, c.Problems)
			}
			if (c.Verdict == chaos.VerdictOK) != (len(c.Problems) == 0) {
				t.Errorf("verdict %s with problems %q", c.Verdict, c.Problems)
			}
			if tc.unexplained > 0 && (len(c.Problems) != 1 || !strings.Contains(c.Problems[0], "act "+tc.act.Act+" ")) {
				t.Errorf("problems %q, want one naming act %s", c.Problems, tc.act.Act)
			}
			var tally chaos.Tally
			tally.Add(c)
			if tally.Clean() != (tc.verdict == chaos.VerdictOK) || tally.UnexplainedCalls != tc.unexplained {
				t.Errorf("tally clean %v, unexplained %d for verdict %s", tally.Clean(), tally.UnexplainedCalls, c.Verdict)
			}
		})
	}
}

func TestParseGeneration(t *testing.T) {
	tests := []struct {
		id      string
		rollout int64
		act     string
		turn    bool
		err     string
	}{
		{id: "7-0-t1-s2", rollout: 7, act: "0/t1-s2"},
		{id: "7-3-t12-lookup-2", rollout: 7, act: "3/t12-lookup-2"},
		{id: "7-0-t1", rollout: 7, act: "0/t1", turn: true},
		{id: "7-0", err: "want <rollout>-<episode>-<turn or node key>"},
		{id: "x-0-t1", err: `rollout "x"`},
		{id: "7-y-t1", err: `episode "y"`},
		{id: "7-0-s1", err: "neither a turn"},
	}
	for _, tc := range tests {
		n, act, turn, err := chaos.ParseGeneration(tc.id)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.id) {
				t.Errorf("%s: error %v, want one naming it and saying %q", tc.id, err, tc.err)
			}
			continue
		}
		if err != nil || n != tc.rollout || act != tc.act || turn != tc.turn {
			t.Errorf("%s: %d %q %v %v; want %d %q %v", tc.id, n, act, turn, err, tc.rollout, tc.act, tc.turn)
		}
	}
}

// From planact's engine client through the simulated engine's count to
// the ledger: an act generated twice without a recorded retry is reported
// (the engines are deterministic: both generations yield the same sample,
// and only the count tells them apart); one generated again with a
// recorded retry is not.
func TestLedgerCountsTheEnginesCalls(t *testing.T) {
	srv := httptest.NewServer(sim.New(sim.Config{Role: sim.RoleActor, Seed: 2}))
	defer srv.Close()
	c, err := engine.New("sglang", srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 7
	generate := func(e int, key string) {
		ctx := engine.WithGeneration(context.Background(), engine.ActGeneration(n, e, key))
		if _, err := c.Generate(ctx, engine.Request{Text: "Tool: search\nInput: capital of France\nAnswer:", Sampling: engine.Sampling{MaxNewTokens: 8}}); err != nil {
			t.Fatal(err)
		}
	}
	generate(0, "t1-s1")
	generate(0, "t1-s1") // a duplicate: the act's outcome records one attempt, no retry
	generate(1, "t1-s1")
	generate(1, "t1-s1") // generated again, recorded as a retry
	ctx := engine.WithGeneration(context.Background(), engine.TurnGeneration(n, 0, 1))
	if _, err := c.Generate(ctx, engine.Request{Text: "Question: ?", Sampling: engine.Sampling{MaxNewTokens: 4}}); err != nil {
		t.Fatal(err)
	}

	calls := chaos.NewEngineCalls(srv.URL)
	calls.Take(context.Background())
	calls.Take(context.Background()) // nothing more: counted once
	outcomes := map[string]chaos.ActOutcome{
		chaos.ActKey(0, "t1-s1"): {Rollout: n, Episode: 0, Turn: 1, Node: "s1", Key: "t1-s1", Status: schema.ActDoneOK, Generation: true, Attempts: 1},
		chaos.ActKey(1, "t1-s1"): {Rollout: n, Episode: 1, Turn: 1, Node: "s1", Key: "t1-s1", Status: schema.ActDoneOK, Generation: true, Attempts: 1, Retries: 1},
	}
	joined := chaos.JoinCalls(outcomes, calls.Acts()[n])
	want := []chaos.ActCalls{
		{Act: "0/t1-s1", Outcome: true, Executed: true, Attempts: 1, Calls: 2},
		{Act: "1/t1-s1", Outcome: true, Executed: true, Attempts: 1, Retries: 1, Calls: 2},
	}
	if !reflect.DeepEqual(joined, want) {
		t.Fatalf("joined %+v, want %+v", joined, want)
	}
	rec := chaos.RolloutRecord{Rollout: n, Episodes: 2,
		Planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}},
		Actor:   chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1"}}}
	check := chaos.Check(rec, map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}, map[string]bool{"0/1/s1": true, "1/1/s1": true}, joined)
	if check.Verdict != chaos.VerdictDuplicate || check.UnexplainedCalls != 1 || len(check.Problems) != 1 || !strings.Contains(check.Problems[0], "act 0/t1-s1 generated 2 times") {
		t.Errorf("verdict %s, unexplained %d, problems %q; want duplicated, 1, act 0/t1-s1 generated 2 times", check.Verdict, check.UnexplainedCalls, check.Problems)
	}
	if s := calls.Summary(); s.Acts != 2 || s.ActCalls != 4 || s.TurnCalls != 1 || len(s.Incomplete) != 0 {
		t.Errorf("summary %+v, want 2 acts, 4 calls, 1 turn call, complete", s)
	}
}

// A take that fails may have lost counts: the run says so and does not pass.
func TestLostCountsFailTheRun(t *testing.T) {
	calls := chaos.NewEngineCalls("http://127.0.0.1:1") // nothing listens there
	calls.Take(context.Background())
	calls.Add(sim.GenerationLog{Dropped: 2})
	r := &chaos.Report{Tally: chaos.Tally{Rollouts: 1, OK: 1}, EngineCalls: calls.Summary()}
	r.Verdict()
	if r.Pass || len(r.EngineCalls.Incomplete) != 2 {
		t.Fatalf("pass %v, incomplete %q; want a failure and two notes", r.Pass, r.EngineCalls.Incomplete)
	}
	found := false
	for _, f := range r.Failures() {
		found = found || strings.Contains(f, "not all counted")
	}
	if !found {
		t.Errorf("failures %q say nothing of the counts", r.Failures())
	}
}

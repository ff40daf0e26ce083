package chaos_test

import (
	"testing"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
)

func TestCheck(t *testing.T) {
	okPlanner := chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}}
	okActor := chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1", "1/2/s2"}}
	executed := map[string]bool{"0/1/s1": true, "1/1/s1": true, "1/2/s2": true}
	both := map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}
	tests := []struct {
		name     string
		planner  chaos.RoleOutcome
		actor    chaos.RoleOutcome
		results  map[string]int
		executed map[string]bool
		verdict  string
		dups     int
		missing  int
		extra    int
	}{
		{name: "ok", planner: okPlanner, actor: okActor, results: both, executed: executed, verdict: chaos.VerdictOK},
		{name: "no acts at all", planner: okPlanner, actor: chaos.RoleOutcome{Status: schema.ResultOK}, results: both, verdict: chaos.VerdictOK},
		{
			name:    "lost: no result anywhere",
			planner: chaos.RoleOutcome{Hung: true, Err: "timed out"}, actor: chaos.RoleOutcome{Hung: true, Err: "timed out"},
			results: map[string]int{}, executed: executed, verdict: chaos.VerdictLost,
		},
		{
			name:    "hung: the result came after the deadline",
			planner: chaos.RoleOutcome{Hung: true, Err: "timed out"}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictHung,
		},
		{
			name:    "wrong status",
			planner: chaos.RoleOutcome{Status: schema.ResultPartial, Samples: []string{"0"}}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictWrong,
		},
		{
			name:    "rejected arrival",
			planner: chaos.RoleOutcome{Status: schema.ResultInvalid, Err: "rejected"}, actor: okActor,
			results: map[string]int{schema.RoleActor: 1}, executed: executed, verdict: chaos.VerdictWrong,
		},
		{
			name:    "actor sample twice",
			planner: okPlanner, actor: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1", "1/2/s2", "1/1/s1"}},
			results: both, executed: executed, verdict: chaos.VerdictDuplicate, dups: 1,
		},
		{
			name:    "planner sample twice",
			planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1", "1"}}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictDuplicate, dups: 1,
		},
		{
			name:    "result published twice",
			planner: okPlanner, actor: okActor,
			results: map[string]int{schema.RolePlanner: 2, schema.RoleActor: 1}, executed: executed, verdict: chaos.VerdictDuplicate,
		},
		{
			name:    "executed act without a sample",
			planner: okPlanner, actor: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0/1/s1", "1/1/s1"}},
			results: both, executed: executed, verdict: chaos.VerdictMismatch, missing: 1,
		},
		{
			name:    "sample of an act not executed",
			planner: okPlanner, actor: okActor,
			results: both, executed: map[string]bool{"0/1/s1": true, "1/1/s1": true}, verdict: chaos.VerdictMismatch, extra: 1,
		},
		{
			name:    "episode without a planner sample",
			planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0"}}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictMismatch, missing: 1,
		},
		{
			// Two planner results and none of the actor's on the bus: two
			// messages in all, as many as a sound rollout has.
			name:    "a role's result twice, the other's not on the bus",
			planner: okPlanner, actor: okActor,
			results: map[string]int{schema.RolePlanner: 2}, executed: executed, verdict: chaos.VerdictDuplicate,
		},
		{
			name:    "an ok result the bus does not hold",
			planner: okPlanner, actor: okActor,
			results: map[string]int{schema.RolePlanner: 1}, executed: executed, verdict: chaos.VerdictMismatch,
		},
		{
			name:    "a sample the engine did not generate",
			planner: okPlanner, actor: chaos.RoleOutcome{Status: schema.ResultOK, Samples: okActor.Samples, BadSamples: []string{"sample 7-1: generated token 3 has log-prob -1"}},
			results: both, executed: executed, verdict: chaos.VerdictMismatch,
		},
		{
			name:    "client gave up and asked again",
			planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}, ClientErrors: []string{"no heartbeat"}}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictClient,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := chaos.RolloutRecord{Rollout: 7, Episodes: 2, Planner: tc.planner, Actor: tc.actor}
			c := chaos.Check(rec, tc.results, tc.executed, nil)
			if c.Verdict != tc.verdict || c.DuplicateSamples != tc.dups || c.MissingSamples != tc.missing || c.ExtraSamples != tc.extra {
				t.Errorf("verdict %s, duplicates %d, missing %d, extra %d; want %s, %d, %d, %d\nproblems: %q",
					c.Verdict, c.DuplicateSamples, c.MissingSamples, c.ExtraSamples, tc.verdict, tc.dups, tc.missing, tc.extra, c.Problems)
			}
			if (c.Verdict == chaos.VerdictOK) != (len(c.Problems) == 0) {
				t.Errorf("verdict %s with problems %q", c.Verdict, c.Problems)
			}
			var tally chaos.Tally
			tally.Add(c)
			if tally.Clean() != (tc.verdict == chaos.VerdictOK) {
				t.Errorf("tally clean %v for verdict %s", tally.Clean(), c.Verdict)
			}
		})
	}
}

func TestTallyOfNothingIsNotClean(t *testing.T) {
	if (chaos.Tally{}).Clean() {
		t.Error("a run without rollouts passes")
	}
}

func TestUnsolicited(t *testing.T) {
	recs := []chaos.RolloutRecord{{Rollout: 7}, {Rollout: 8}}
	both := map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}
	tests := []struct {
		name     string
		results  map[int64]map[string]int
		executed map[int64]map[string]bool
		want     int
	}{
		{"every result played", map[int64]map[string]int{7: both, 8: both}, map[int64]map[string]bool{7: {"0/1/s1": true}}, 0},
		{"a result of a rollout no trainer played", map[int64]map[string]int{7: both, 8: both, 9: {schema.RoleActor: 1}}, nil, 1},
		{"a result of no role", map[int64]map[string]int{7: {schema.RolePlanner: 1, schema.RoleActor: 1, "critic": 1}}, nil, 1},
		{"an act of a rollout no trainer played", map[int64]map[string]int{7: both}, map[int64]map[string]bool{12: {"0/1/s1": true}}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := chaos.Unsolicited(recs, tc.results, tc.executed); len(got) != tc.want {
				t.Errorf("%q, want %d", got, tc.want)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	clean := func() *chaos.Report {
		r := &chaos.Report{Tally: chaos.Tally{Rollouts: 3, OK: 3}}
		r.Settings.Faults = []chaos.Fault{{Kind: chaos.FaultKill(chaos.ActDispatcher)}, {Kind: chaos.FaultKillNATS}}
		r.Faults = []chaos.FaultRecord{{Kind: chaos.FaultKill(chaos.ActDispatcher)}, {Kind: chaos.FaultKillNATS}}
		return r
	}
	r := clean()
	if r.Verdict(); !r.Pass || len(r.Failures()) > 0 {
		t.Fatalf("a clean run: pass %v, failures %q", r.Pass, r.Failures())
	}
	tests := []struct {
		name   string
		doctor func(r *chaos.Report)
	}{
		{"a planned fault not carried out", func(r *chaos.Report) { r.Faults = r.Faults[:1] }},
		{"a process exited on its own", func(r *chaos.Report) {
			r.Exits = []chaos.Exit{{Proc: "session-store-1", Err: "exit status 2"}}
		}},
		{"a result of a rollout no trainer played", func(r *chaos.Report) { r.Unsolicited = []string{"rollout 9: 1 actor result messages"} }},
		{"a message the harness could not read", func(r *chaos.Report) { r.Unread = []string{"ACT: act.7.done.0.s1: bad msgpack"} }},
		{"a fault failed", func(r *chaos.Report) { r.Faults[1].Err = "no running nats" }},
		{"keys left", func(r *chaos.Report) { r.Leftovers.Keys = map[string]int{"sessions": 1} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := clean()
			tc.doctor(r)
			r.Verdict()
			if r.Pass || len(r.Failures()) == 0 {
				t.Errorf("pass %v, failures %q", r.Pass, r.Failures())
			}
		})
	}
}

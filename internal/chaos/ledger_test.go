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
			name:    "client gave up and asked again",
			planner: chaos.RoleOutcome{Status: schema.ResultOK, Samples: []string{"0", "1"}, ClientErrors: []string{"no heartbeat"}}, actor: okActor,
			results: both, executed: executed, verdict: chaos.VerdictClient,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := chaos.RolloutRecord{Rollout: 7, Episodes: 2, Planner: tc.planner, Actor: tc.actor}
			c := chaos.Check(rec, tc.results, tc.executed)
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

package chaos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// soundSample is a sample the engine of seed generated: response generated
// from prompt, every token with the log-prob the engine gives it.
func soundSample(seed int64, prompt, response string, meta map[string]any) schema.Sample {
	resp := sim.Encode(response)
	s := schema.Sample{Prompt: prompt, Response: response, Tokens: append(sim.Encode(prompt), resp...), ResponseLength: len(resp), Metadata: meta}
	for i, id := range resp {
		s.LossMask = append(s.LossMask, 1)
		s.RolloutLogProbs = append(s.RolloutLogProbs, sim.LogProb(seed, prompt, i, id))
	}
	return s
}

// soundResults are the ok results of a rollout of two completed episodes,
// the actor's two acts executed (0/1/s1, 1/1/s1), every count true.
func soundResults() (planner, actor *schema.Result) {
	const pseed, aseed = 1, 2
	planner = &schema.Result{Rollout: 7, Role: schema.RolePlanner, Status: schema.ResultOK}
	actor = &schema.Result{Rollout: 7, Role: schema.RoleActor, Status: schema.ResultOK}
	stats := schema.Stats{Episodes: 2, Ended: 2, Completed: 2, Acts: 2,
		EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}, TaskStates: map[string]int{schema.TaskTrained: 2}, Tokens: map[string]int{}}
	for e := range 2 {
		ps := soundSample(pseed, fmt.Sprintf("Question %d:", e), " Paris", map[string]any{"episode": e})
		as := soundSample(aseed, fmt.Sprintf("Tool %d:", e), " found", map[string]any{"episode": e, "turn": 1, "node": "s1"})
		planner.Samples, actor.Samples = append(planner.Samples, ps), append(actor.Samples, as)
		stats.Tokens[schema.RolePlanner] += len(ps.Tokens)
		stats.Tokens[schema.RoleActor] += len(as.Tokens)
		for _, r := range []*schema.Result{planner, actor} {
			r.Tasks = append(r.Tasks, schema.TaskOutcome{Episode: e, State: schema.TaskTrained})
		}
	}
	for _, r := range []*schema.Result{planner, actor} {
		r.Stats, r.SampleCount = stats, len(r.Samples)
	}
	return planner, actor
}

// An ok result is a claim, and so is every count in it: a result whose
// stats or tasks say other than what it holds, or than what ran, does not
// balance the ledger, though its samples are sound.
func TestResultCountsAreHeldAgainstWhatItHolds(t *testing.T) {
	seeds := map[string]int64{schema.RolePlanner: 1, schema.RoleActor: 2}
	executed := map[string]bool{"0/1/s1": true, "1/1/s1": true}
	both := map[string]int{schema.RolePlanner: 1, schema.RoleActor: 1}
	tests := []struct {
		name   string
		doctor func(planner, actor *schema.Result)
		want   string // in a problem; "" for none
	}{
		{name: "sound", doctor: func(_, _ *schema.Result) {}},
		{name: "more episodes than the rollout has", want: "counts 3 episodes; the rollout has 2", doctor: func(p, _ *schema.Result) {
			p.Stats.Episodes = 3
			p.Stats.EpisodeStatus = map[string]int{schema.EpisodeCompleted: 3}
			p.Stats.Ended, p.Stats.Completed = 3, 3
			p.Stats.TaskStates = map[string]int{schema.TaskTrained: 3}
			p.Tasks = append(p.Tasks, schema.TaskOutcome{Episode: 2, State: schema.TaskTrained})
		}},
		{name: "more acts than ran", want: "counts 3 executed acts; the ACT stream shows 2", doctor: func(_, a *schema.Result) { a.Stats.Acts = 3 }},
		{name: "an episode in two tasks", want: "episode 1 in 0 tasks", doctor: func(p, _ *schema.Result) { p.Tasks[1].Episode = 0 }},
		{name: "task states that are not the tasks'", want: "task_states counts 2 tasks trained, its tasks 1", doctor: func(_, a *schema.Result) { a.Tasks[1].State = schema.TaskFailed }},
		{name: "statuses that do not add up", want: "episode_status adds up to 1", doctor: func(p, _ *schema.Result) {
			p.Stats.EpisodeStatus = map[string]int{schema.EpisodeCompleted: 1}
		}},
		{name: "ended beyond the statuses", want: "stats.ended 2, stats.episode_status says 1", doctor: func(_, a *schema.Result) {
			a.Stats.EpisodeStatus = map[string]int{schema.EpisodeCompleted: 1, schema.TaskUnfinished: 1}
			a.Stats.Completed = 1
		}},
		{name: "tokens its samples do not hold", want: "stats.tokens counts", doctor: func(_, a *schema.Result) { a.Stats.Tokens = map[string]int{schema.RoleActor: 1} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, a := soundResults()
			tc.doctor(p, a)
			rec := RolloutRecord{Rollout: 7, Episodes: 2,
				Planner: outcome(p, nil, schema.RolePlanner, seeds[schema.RolePlanner]),
				Actor:   outcome(a, nil, schema.RoleActor, seeds[schema.RoleActor])}
			c := Check(rec, both, executed, nil)
			if tc.want == "" {
				if c.Verdict != VerdictOK {
					t.Fatalf("verdict %s, problems %q; want ok", c.Verdict, c.Problems)
				}
				return
			}
			if c.Verdict != VerdictMismatch || !strings.Contains(strings.Join(c.Problems, "\n"), tc.want) {
				t.Fatalf("verdict %s, problems %q; want mismatch saying %q", c.Verdict, c.Problems, tc.want)
			}
			var tally Tally
			tally.Add(c)
			if tally.Clean() || tally.Mismatched != 1 {
				t.Errorf("tally clean %v, mismatched %d; want a mismatched rollout", tally.Clean(), tally.Mismatched)
			}
		})
	}
}

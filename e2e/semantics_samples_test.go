package e2e

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestSemanticsSamplesAndRewards: rewards by exact match, F1 and a remote
// reward server, split across act samples on request; samples grouped by
// group_index whatever the task order; sample status from the finish
// reason; weight versions, timings and stats.
func TestSemanticsSamplesAndRewards(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	// Groups interleaved on purpose; the wrong actor answer makes F1 and EM differ.
	tasks := func(a, b string) []schema.Task {
		ts := []schema.Task{
			e.question(0, population(a)),
			e.question(1, population(b), sim.FaultActorWrong),
			e.question(2, population(a)),
			e.question(3, population(b), sim.FaultActorWrong),
		}
		for i := range ts {
			ts[i].GroupIndex = i % 2
		}
		return ts
	}
	cases := []struct {
		n     int64
		cfg   schema.Config
		score func(answer, label string) float64
	}{
		{311, schema.Config{Reward: "f1"}, reward.F1},
		{312, schema.Config{Reward: "em", SplitActReward: true}, reward.ExactMatch},
		{313, schema.Config{Reward: e.planner.URL + "/reward"}, reward.F1},
		{314, schema.Config{ActorSampling: schema.Sampling{Temperature: schema.Float(1), TopP: schema.Float(1), MaxNewTokens: 2}}, reward.F1},
	}
	outs := make([]outcome, len(cases))
	tl := make([][]schema.Task, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		tl[i] = tasks([]string{"France", "Spain", "Italy", "Canada"}[i], []string{"Germany", "Poland", "Japan", "Chile"}[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = e.rollout(t, e.trainer(t), e.trainer(t), c.n, tl[i], &c.cfg, false)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		o := outs[i]
		if o.perr != nil || o.planner.Status != schema.ResultOK {
			t.Fatalf("rollout %d: %v %+v", c.n, o.perr, o.planner)
		}
		if c.cfg.Reward != "em" && c.n != 314 {
			checkResults(t, c.n, tl[i], o, false)
		}
		rewards := map[string]float64{}
		var tokens [2]int
		turns, correct := 0, 0
		for k, s := range o.planner.Samples {
			if k > 0 && s.GroupIndex < o.planner.Samples[k-1].GroupIndex {
				t.Errorf("rollout %d: planner samples not grouped: %d after %d", c.n, s.GroupIndex, o.planner.Samples[k-1].GroupIndex)
			}
			task := tl[i][s.Index]
			ans := joinAnswers(s.Metadata["answers"])
			if want := c.score(ans, task.Label); s.Status == schema.EpisodeCompleted && math.Abs(s.Reward-want) > 1e-9 {
				t.Errorf("rollout %d episode %s: reward %v, want %v for %q against %q", c.n, s.RolloutID, s.Reward, want, ans, task.Label)
			}
			if reward.ExactMatch(strings.ReplaceAll(ans, " | ", " "), task.Label) == 1 {
				correct++
			}
			rewards[s.RolloutID] = s.Reward
			tokens[0] += len(s.Tokens)
			turns += asInt(s.Metadata["turns"])
			if s.Metadata["ended_ms"] == nil || asInt(s.Metadata["ended_ms"]) <= 0 {
				t.Errorf("rollout %d: planner sample without timing: %v", c.n, s.Metadata)
			}
		}
		if c.cfg.Reward == "em" {
			// A wrong population in millions: F1 would give partial credit, EM none.
			s, _ := sampleOf(o.planner, c.n, 1)
			if ans := joinAnswers(s.Metadata["answers"]); s.Reward != 0 || reward.F1(ans, s.Label) == 0 {
				t.Errorf("rollout %d: EM reward %v for %q against %q (F1 %v)", c.n, s.Reward, ans, s.Label, reward.F1(ans, s.Label))
			}
		}
		perEpisode := map[string]int{}
		for k, s := range o.actor.Samples {
			if k > 0 && s.GroupIndex < o.actor.Samples[k-1].GroupIndex {
				t.Errorf("rollout %d: actor samples not grouped", c.n)
			}
			perEpisode[s.RolloutID]++
			tokens[1] += len(s.Tokens)
			checkTokenExact(t, s)
			if asInt(s.Metadata["started_ms"]) <= 0 || asInt(s.Metadata["ended_ms"]) < asInt(s.Metadata["started_ms"]) || s.Metadata["latency_ms"] == nil {
				t.Errorf("rollout %d: actor sample timings %v", c.n, s.Metadata)
			}
			if len(s.WeightVersions) != 1 || s.WeightVersions[0] != "actor-v3" {
				t.Errorf("rollout %d: actor weight versions %v", c.n, s.WeightVersions)
			}
			if c.n == 314 && (s.Status != schema.EpisodeTruncated || s.ResponseLength != 2) {
				t.Errorf("actor output cut by max_new_tokens: status %s, %d tokens", s.Status, s.ResponseLength)
			}
			if c.n != 314 && s.Status != schema.EpisodeCompleted {
				t.Errorf("rollout %d: actor sample status %s", c.n, s.Status)
			}
		}
		for _, s := range o.actor.Samples {
			want := rewards[s.RolloutID]
			if c.cfg.SplitActReward {
				want /= float64(perEpisode[s.RolloutID])
			}
			if math.Abs(s.Reward-want) > 1e-9 {
				t.Errorf("rollout %d act %v: reward %v, want %v", c.n, s.Metadata["key"], s.Reward, want)
			}
		}
		st := o.planner.Stats
		eps := float64(len(o.planner.Samples))
		if st.Completed != 4 || st.Accuracy != float64(correct)/eps || st.MeanTurns != float64(turns)/eps ||
			st.ActsPerEpisode != float64(len(o.actor.Samples))/eps || st.Acts != len(o.actor.Samples) {
			t.Errorf("rollout %d: stats %+v (correct %d, turns %d, acts %d)", c.n, st, correct, turns, len(o.actor.Samples))
		}
		if st.Tokens[schema.RolePlanner] != tokens[0] || st.Tokens[schema.RoleActor] != tokens[1] || st.WallMs <= 0 {
			t.Errorf("rollout %d: tokens %v (want %v), wall %dms", c.n, st.Tokens, tokens, st.WallMs)
		}
		if fmt.Sprint(o.actor.Stats) != fmt.Sprint(st) {
			t.Errorf("rollout %d: roles see different stats", c.n)
		}
	}
}

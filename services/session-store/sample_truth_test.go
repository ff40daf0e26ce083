package sessionstore

import (
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// actorAndPlanner builds the actor sample of one act and the planner
// sample of an episode that ended as end, its reward error rewardErr.
func actorAndPlanner(t *testing.T, end, rewardErr string) (actor, planner schema.Sample) {
	t.Helper()
	act := &schema.ActDone{Status: schema.ActDoneOK, Key: "t1-s1", Turn: 1,
		Generation: &schema.Generation{PromptIDs: []int{1}, OutputIDs: []int{2, 3}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}}
	ep := &episode{task: schema.Task{Prompt: "q", Label: "a"}, rewardErr: rewardErr,
		end: &schema.EpisodeEnd{Status: end, Turns: 1, Acts: []string{"t1-s1"}},
		last: &schema.PlanOutput{Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "p", IDs: []int{4}, LogProbs: []float64{-0.5}},
		}}}
	a, ok := actorSample(7, 0, ep, act)
	p, pok := plannerSample(7, 0, ep)
	if !ok || !pok {
		t.Fatalf("episode %s: no sample (actor %v, planner %v)", end, ok, pok)
	}
	return a, p
}

// TestActorSamplesNameTheirRewardError: a reward that could not be
// computed (the reward server down) leaves each sample of the episode a
// 0 that is no score, and each says so, the actor's as the planner's. The
// actor's trainer sees no planner sample: it took the 0 for a wrong answer.
func TestActorSamplesNameTheirRewardError(t *testing.T) {
	const why = "reward http://judge/score: HTTP 503"
	a, p := actorAndPlanner(t, schema.EpisodeCompleted, why)
	if a.Metadata["reward_error"] != why || p.Metadata["reward_error"] != why {
		t.Errorf("reward_error: the actor sample says %v, the planner's %v; want %q on each", a.Metadata["reward_error"], p.Metadata["reward_error"], why)
	}
	a, p = actorAndPlanner(t, schema.EpisodeCompleted, "")
	if _, said := a.Metadata["reward_error"]; said {
		t.Errorf("a scored episode's actor sample has reward_error %v", a.Metadata["reward_error"])
	}
}

// TestActorSamplesOfFailedEpisodesSaySo: an act of an episode that failed
// or was aborted has its episode's status, as the planner sample has
// (its reward, 0, was never an answer's score), never completed; an act
// of an episode that was answered keeps its own (completed, or
// truncated when its generation was cut).
func TestActorSamplesOfFailedEpisodesSaySo(t *testing.T) {
	for _, c := range []struct{ end, want string }{
		{schema.EpisodeCompleted, schema.EpisodeCompleted},
		{schema.EpisodeTruncated, schema.EpisodeCompleted}, // out of turns: the act itself was not cut
		{schema.EpisodeFailed, schema.EpisodeFailed},
		{schema.EpisodeAborted, schema.EpisodeAborted},
	} {
		a, p := actorAndPlanner(t, c.end, "")
		if a.Status != c.want {
			t.Errorf("episode %s: actor sample %s, want %s (its planner sample: %s)", c.end, a.Status, c.want, p.Status)
		}
	}
}

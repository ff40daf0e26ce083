package sessionstore

import (
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestSamplesNeverZeroMissingLogProbs: a generated segment (a planner
// turn, an act) whose engine returned no log-probs makes the sample's
// rollout_log_probs absent, its metadata saying why; observations keep
// their 0 (loss mask 0), and a sample whose every turn has log-probs has
// them all.
func TestSamplesNeverZeroMissingLogProbs(t *testing.T) {
	ep := func(segs ...schema.Segment) *episode {
		return &episode{
			task: schema.Task{Prompt: "q"},
			end:  &schema.EpisodeEnd{Status: schema.EpisodeCompleted, Turns: 2},
			last: &schema.PlanOutput{Turn: 2, FinishReason: "stop", Segments: segs},
		}
	}
	prompt := schema.Segment{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}}
	turn1 := schema.Segment{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3, 4}, LogProbs: []float64{-0.5, -0.25}}
	obs := schema.Segment{Kind: schema.SegObservation, Turn: 2, Text: "o", IDs: []int{5}}
	turn2 := schema.Segment{Kind: schema.SegGenerated, Turn: 2, Text: "b", IDs: []int{6}, LogProbs: []float64{-1}}
	bare := schema.Segment{Kind: schema.SegGenerated, Turn: 2, Text: "b", IDs: []int{6},
		LogProbsMissing: "the engine returned no meta_info.output_token_logprobs"}

	s, ok := plannerSample(7, 0, ep(prompt, turn1, obs, turn2))
	if !ok || !slices.Equal(s.RolloutLogProbs, []float64{-0.5, -0.25, 0, -1}) || s.Metadata["log_probs_missing"] != nil {
		t.Errorf("every turn with log-probs: %v, %v", s.RolloutLogProbs, s.Metadata["log_probs_missing"])
	}
	s, ok = plannerSample(7, 0, ep(prompt, turn1, obs, bare))
	why, _ := s.Metadata["log_probs_missing"].(string)
	if !ok || s.RolloutLogProbs != nil || !strings.Contains(why, "turn 2") || !strings.Contains(why, "output_token_logprobs") {
		t.Errorf("turn 2 without log-probs: rollout_log_probs %v, log_probs_missing %q; want none, and why", s.RolloutLogProbs, why)
	}
	if !slices.Equal(s.LossMask, []int{1, 1, 0, 1}) || s.ResponseLength != 4 {
		t.Errorf("loss mask %v, response length %d", s.LossMask, s.ResponseLength)
	}

	done := func(g *schema.Generation) *schema.ActDone {
		return &schema.ActDone{Status: schema.ActDoneOK, Key: "t1-s1", Generation: g}
	}
	a, ok := actorSample(7, 0, ep(prompt), done(&schema.Generation{PromptIDs: []int{1}, OutputIDs: []int{2, 3}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}))
	if !ok || !slices.Equal(a.RolloutLogProbs, []float64{-1, -2}) || a.Metadata["log_probs_missing"] != nil {
		t.Errorf("an act with log-probs: %v, %v", a.RolloutLogProbs, a.Metadata["log_probs_missing"])
	}
	a, ok = actorSample(7, 0, ep(prompt), done(&schema.Generation{PromptIDs: []int{1}, OutputIDs: []int{2, 3}, FinishReason: "stop",
		LogProbsMissing: "the server returned no log-probs"}))
	why, _ = a.Metadata["log_probs_missing"].(string)
	if !ok || a.RolloutLogProbs != nil || why != "the server returned no log-probs" {
		t.Errorf("an act without log-probs: rollout_log_probs %v, log_probs_missing %q; want none, and why", a.RolloutLogProbs, why)
	}
	// One weight version per generated segment, as a planner sample has
	// (an act's segment is the act): "" where no one said which. An act
	// without one used to have none at all.
	if !slices.Equal(a.WeightVersions, []string{""}) || !slices.Equal(s.WeightVersions, []string{"", ""}) {
		t.Errorf("weight_versions of an act %q, of a planner sample %q: want one per generated segment", a.WeightVersions, s.WeightVersions)
	}
}

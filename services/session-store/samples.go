package sessionstore

// The samples of an episode, token-exact: the planner's (one per episode,
// its whole trajectory) and the actor's (one per act a model ran), with
// their staleness marked.

import (
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/schema"
)

// plannerSample turns an episode's trajectory into one multi-turn sample:
// the prompt, then every turn's generated tokens (loss mask 1, their
// log-probs) and the observations planact appended (loss mask 0, log-prob
// 0: no model wrote them and no loss falls on them). When the engine did
// not return a turn's log-probs the sample has none at all (slime's
// rollout_log_probs left unset: the trainer computes its own), and
// metadata.log_probs_missing says which turn and why: a zero in their place
// would be trusted by an importance ratio.
func plannerSample(n int64, e int, ep *episode) (schema.Sample, bool) {
	out := ep.last
	if out == nil || len(out.Segments) == 0 || out.Segments[0].Kind != schema.SegPrompt {
		return schema.Sample{}, false
	}
	prompt := out.Segments[0]
	// The trajectory's length first: every array is made once, at its size.
	rest, text := 0, 0
	for _, seg := range out.Segments[1:] {
		rest, text = rest+len(seg.IDs), text+len(seg.Text)
	}
	smp := schema.Sample{
		GroupIndex: ep.task.GroupIndex, Index: ep.task.Index, RolloutID: episodeID(n, e),
		Prompt: prompt.Text, Label: ep.task.Label, Reward: ep.reward, Status: ep.end.Status,
		Tokens: append(make([]int, 0, len(prompt.IDs)+rest), prompt.IDs...),
	}
	if rest > 0 {
		smp.LossMask, smp.RolloutLogProbs = make([]int, 0, rest), make([]float64, 0, rest)
	}
	var resp strings.Builder
	resp.Grow(text)
	missing, unchecked := "", ""
	for _, seg := range out.Segments[1:] {
		resp.WriteString(seg.Text)
		smp.Tokens = append(smp.Tokens, seg.IDs...)
		gen := seg.Kind == schema.SegGenerated
		if gen && missing == "" && len(seg.LogProbs) != len(seg.IDs) {
			missing = fmt.Sprintf("turn %d: %s", seg.Turn, logProbsMissing(seg.LogProbsMissing, len(seg.LogProbs), len(seg.IDs)))
		}
		if gen && unchecked == "" && seg.StalenessUnchecked != "" {
			unchecked = fmt.Sprintf("turn %d: %s", seg.Turn, seg.StalenessUnchecked)
		}
		for i := range seg.IDs {
			if gen {
				smp.LossMask = append(smp.LossMask, 1)
				lp := 0.0
				if i < len(seg.LogProbs) {
					lp = seg.LogProbs[i]
				}
				smp.RolloutLogProbs = append(smp.RolloutLogProbs, lp) // dropped below if any is missing
			} else {
				smp.LossMask = append(smp.LossMask, 0)
				smp.RolloutLogProbs = append(smp.RolloutLogProbs, 0)
			}
		}
		if gen {
			// One version per generated segment (each turn), as slime's
			// weight_versions: what generated it, in order.
			smp.WeightVersions = append(smp.WeightVersions, seg.Version)
		}
	}
	smp.Response = resp.String()
	smp.ResponseLength = len(smp.Tokens) - len(prompt.IDs)
	switch out.FinishReason {
	case "length":
		if smp.Status == schema.EpisodeCompleted {
			smp.Status = schema.EpisodeTruncated
		}
	case "abort":
		smp.Status = schema.EpisodeAborted
	}
	smp.Metadata = map[string]any{
		"rollout": n, "episode": e, "turns": ep.end.Turns, "answers": ep.end.Answers,
		"finish_reason": out.FinishReason, "end_reason": ep.end.Reason, "ended_ms": ep.end.AtMs,
	}
	if missing != "" {
		smp.RolloutLogProbs = nil
		smp.Metadata["log_probs_missing"] = missing
	}
	if unchecked != "" {
		smp.Metadata["staleness_unchecked"] = unchecked
	}
	if out.Truncated != "" && smp.Status == schema.EpisodeTruncated {
		smp.Metadata["truncated"] = out.Truncated // the limit that cut it
	}
	if ep.rewardErr != "" {
		smp.Metadata["reward_error"] = ep.rewardErr
	}
	return smp, true
}

// logProbsMissing says why a generation of n tokens has got log-probs for
// none, or not all, of them: why, what the engine's reply lacked, when it
// was recorded.
func logProbsMissing(why string, got, n int) string {
	if why != "" {
		return why
	}
	return fmt.Sprintf("%d log-probs for %d generated tokens", got, n)
}

// actorSample turns one executed act into a sample. Acts answered from the
// cache, skipped or failed before the model ran give none.
func actorSample(n int64, e int, ep *episode, d *schema.ActDone) (schema.Sample, bool) {
	g := d.Generation
	if !modelRan(d) {
		return schema.Sample{}, false
	}
	smp := schema.Sample{
		GroupIndex: ep.task.GroupIndex, Index: ep.task.Index, RolloutID: episodeID(n, e),
		Prompt: g.Prompt, Response: g.Text, Label: ep.task.Label, Reward: ep.reward,
		Tokens:         append(append(make([]int, 0, len(g.PromptIDs)+len(g.OutputIDs)), g.PromptIDs...), g.OutputIDs...),
		ResponseLength: len(g.OutputIDs),
		LossMask:       ones(len(g.OutputIDs)),
		Status:         schema.EpisodeCompleted,
	}
	// Log-probs the engine did not return are absent, never zeros.
	if len(g.LogProbs) == len(g.OutputIDs) {
		smp.RolloutLogProbs = append([]float64(nil), g.LogProbs...)
	}
	switch g.FinishReason {
	case "length":
		smp.Status = schema.EpisodeTruncated
	case "abort":
		smp.Status = schema.EpisodeAborted
	}
	switch ep.end.Status {
	case schema.EpisodeFailed, schema.EpisodeAborted:
		// Its reward (0) is no score: the episode's answer was never
		// scored. Said as its planner sample says it, so that the actor's
		// trainer, which sees no planner sample, does not take the 0 for
		// a wrong answer.
		smp.Status = ep.end.Status
	}
	// One version per generated segment, as a planner sample's: "" where
	// neither the engine nor the trainer said which.
	smp.WeightVersions = []string{g.WeightVersion}
	smp.Metadata = map[string]any{
		"rollout": n, "episode": e, "turn": d.Turn, "node": d.NodeID, "key": d.Key, "tool": d.Tool,
		"input": d.Input, "attempts": d.Attempts, "latency_ms": g.LatencyMs,
		"started_ms": d.StartedMs, "ended_ms": d.EndedMs,
		// The episode's outcome, whatever split_act_reward makes of the
		// sample's reward: what group-relative advantages compare.
		"episode_reward": ep.reward,
	}
	if len(g.LogProbs) != len(g.OutputIDs) {
		smp.Metadata["log_probs_missing"] = logProbsMissing(g.LogProbsMissing, len(g.LogProbs), len(g.OutputIDs))
	}
	if g.StalenessUnchecked != "" {
		smp.Metadata["staleness_unchecked"] = g.StalenessUnchecked
	}
	if g.Truncated != "" {
		smp.Metadata["truncated"] = g.Truncated // the limit that cut it
	}
	if ep.rewardErr != "" {
		smp.Metadata["reward_error"] = ep.rewardErr // its 0 is no score, as its planner sample says
	}
	return smp, true
}

// modelRan reports whether the actor model ran the act and it is done:
// what gives an actor sample.
func modelRan(d *schema.ActDone) bool {
	return d.Generation != nil && d.Status == schema.ActDoneOK
}

func sampleBefore(a, b *schema.Sample) bool {
	if a.GroupIndex != b.GroupIndex {
		return a.GroupIndex < b.GroupIndex
	}
	return a.Index < b.Index
}

func episodeID(n int64, e int) string { return fmt.Sprintf("%d-%d", n, e) }

func ones(n int) []int {
	m := make([]int, n)
	for i := range m {
		m[i] = 1
	}
	return m
}

// countUnchecked counts, by role, the generations of an ended episode
// that ran without their weights checked against max_staleness.
func countUnchecked(stats *schema.Stats, ep *episode) {
	add := func(role string) {
		if stats.StalenessUnchecked == nil {
			stats.StalenessUnchecked = map[string]int{}
		}
		stats.StalenessUnchecked[role]++
	}
	if ep.last != nil {
		for _, seg := range ep.last.Segments {
			if seg.Kind == schema.SegGenerated && seg.StalenessUnchecked != "" {
				add(schema.RolePlanner)
			}
		}
	}
	for _, d := range ep.acts {
		if d.Generation != nil && d.Generation.StalenessUnchecked != "" && d.Status == schema.ActDoneOK {
			add(schema.RoleActor)
		}
	}
}

// markStaleness records in a sample's metadata how many versions its oldest
// segment's weights are behind the trainer's newest (when versions end in
// numbers), and marks it stale past maxStaleness, so that the trainer can
// drop or re-weight it.
func markStaleness(smp *schema.Sample, newest string, maxStaleness int) {
	worst, known := int64(0), false
	for _, v := range smp.WeightVersions {
		if b, ok := schema.Behind(newest, v); ok {
			worst, known = max(worst, b), true
		}
	}
	if !known {
		return
	}
	smp.Metadata["staleness"] = worst
	if maxStaleness > 0 && worst > int64(maxStaleness) {
		smp.Metadata["stale"] = true
	}
}

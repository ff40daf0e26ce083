package sessionstore

import (
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestOKClaimsSamplesToTrainOn: a result's status counted every sample it
// held, those of failed and aborted episodes too (their status says so,
// their reward of 0 is no score): a role whose only samples came from
// episodes aborted on stale weights, or from episodes that failed and
// aborted, got ok. ok claims samples to train on (of tasks trained for the
// role), or says why there are none; such a result is failed, saying its
// samples are all of failed or aborted episodes.
func TestOKClaimsSamplesToTrainOn(t *testing.T) {
	const n = 294
	for _, c := range []struct {
		name string
		ends []string // each episode's end status
		want string   // both results' status
	}{
		{"every episode aborted", []string{schema.EpisodeAborted, schema.EpisodeAborted}, schema.ResultFailed},
		{"failed and aborted", []string{schema.EpisodeFailed, schema.EpisodeAborted}, schema.ResultFailed},
		{"one completed", []string{schema.EpisodeCompleted, schema.EpisodeAborted}, schema.ResultOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			sess := &schema.Session{Rollout: n, Config: schema.DefaultConfig(), Episodes: len(c.ends), State: schema.SessionDone, Status: schema.ResultOK}
			var tasks []schema.Task
			eps := map[int]*episode{}
			for e, status := range c.ends {
				task := schema.Task{GroupIndex: e, Index: e, Prompt: "q", Label: "a"}
				tasks = append(tasks, task)
				ep := &episode{task: task, end: &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: status, Reason: "stale: weights v1, v3 is current"}}
				ep.last = &schema.PlanOutput{Rollout: n, Episode: e, FinishReason: "stop", Segments: []schema.Segment{
					{Kind: schema.SegPrompt, Turn: 1, Text: "p", IDs: []int{1, 2}},
					{Kind: schema.SegGenerated, Turn: 1, Text: "g", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
				}}
				ep.acts = []*schema.ActDone{{Rollout: n, Episode: e, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
					Generation: &schema.Generation{Prompt: "a", PromptIDs: []int{4}, OutputIDs: []int{5}, LogProbs: []float64{-1}, FinishReason: "stop"}}}
				ep.ran = 1
				ps, ok := plannerSample(n, e, ep)
				as, ok2 := actorSample(n, e, ep, ep.acts[0])
				if !ok || !ok2 {
					t.Fatal("no samples built")
				}
				ep.planner, ep.actor = &ps, []schema.Sample{as}
				eps[e] = ep
			}
			planner, actor := buildResults(sess, tasks, eps, nil)
			for _, r := range []result{planner, actor} {
				if r.SampleCount != len(c.ends) {
					t.Fatalf("%s result holds %d samples; want one of each episode", r.Role, r.SampleCount)
				}
				if r.Status != c.want {
					t.Errorf("%s result: %s (%s); want %s", r.Role, r.Status, r.Reason, c.want)
				}
				if c.want == schema.ResultFailed && !strings.Contains(r.Reason, "no "+r.Role+" sample to train on: its 2 are all of failed or aborted episodes") {
					t.Errorf("%s result's reason %q does not say its samples are all of failed or aborted episodes", r.Role, r.Reason)
				}
			}
		})
	}
}

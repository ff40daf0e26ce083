package sessionstore

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestActorSamplesComeInPlanOrder: an episode's actor samples were ordered
// by turn, then by act key as a string: t1-s10 came before t1-s2, and a
// plan's steps out of the order it listed them. Now they come by turn,
// then in the order the turn's plan lists its steps (as the episode's end
// lists its acts), in its group's message as in the result.
func TestActorSamplesComeInPlanOrder(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 293
	var want []string // the act keys, as the plans list their steps
	for k := 1; k <= 11; k++ {
		want = append(want, fmt.Sprintf("t1-s%d", k))
	}
	want = append(want, "t2-zeta", "t2-alpha", "t2-s3")
	msgs := []schema.Message{&schema.PlanOutput{Rollout: n, Episode: 0, Turn: 2, FinishReason: "stop", Segments: []schema.Segment{
		{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
		{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
	}}}
	for i, key := range want {
		turn := 1 + i/11
		msgs = append(msgs, &schema.ActDone{Rollout: n, Episode: 0, Turn: turn, Key: key, NodeID: key[3:], Tool: "search", Status: schema.ActDoneOK,
			Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, i}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}})
	}
	msgs = append(msgs, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 2, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: want})
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := endedRollout(t, s, n, cfg, tasks, msgs)
	for range 3 {
		eps, err := s.gather(ctx, &sess, tasks, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, smp := range eps[0].actor {
			got = append(got, fmt.Sprint(smp.Metadata["key"]))
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("actor samples by act key:\n%v\nwant, as the plans list their steps:\n%v", got, want)
		}
		samples, _ := groupShare(&sess, eps, []int{0}, schema.RoleActor)
		for i, smp := range samples {
			if smp.Metadata["key"] != want[i] {
				t.Fatalf("the group's actor sample %d is of act %v; want %s", i, smp.Metadata["key"], want[i])
			}
		}
		_, actor := buildResults(&sess, tasks, eps, nil)
		for i, h := range actor.samples {
			if h.sample.Metadata["key"] != want[i] {
				t.Fatalf("the result's actor sample %d is of act %v; want %s", i, h.sample.Metadata["key"], want[i])
			}
		}
		if len(actor.samples) != len(want) {
			t.Fatalf("the result holds %d actor samples; want %d", len(actor.samples), len(want))
		}
	}
}

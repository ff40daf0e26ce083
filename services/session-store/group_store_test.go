package sessionstore

import (
	"context"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestAGroupWithNoStoreForItsSamplesFailsTheResults: a group whose
// samples must go to the object store (over the inline limit) of a role
// that has none was written to a store that is not there: the settle
// panicked, the handler's message was given up as a panic, and the
// rollout's results, behind the group in the outbox, never went out. A
// result that cannot be stored fails at once, saying why; a group that
// cannot be does the same, and the results go out failed, naming it.
func TestAGroupWithNoStoreForItsSamplesFailsTheResults(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 43
	s.InlineLimit = 1
	delete(s.Bus.Results, schema.RoleActor)
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}}})
	for _, m := range []schema.Message{
		&schema.PlanOutput{Rollout: n, Episode: 0, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
		}},
		&schema.ActDone{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
			Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
		&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := finishedRollout(t, s, n, cfg, "group:0", schema.EffectResults, schema.EffectCleanup)
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatalf("settle: %v; want the results given up at once", err)
	}
	r := resultOf(t, s, n, schema.RoleActor)
	if r == nil || r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "group 0") || !strings.Contains(r.Reason, "no result store for role") {
		t.Fatalf("the actor's result: %+v; want failed, naming group 0 and why", r)
	}
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Outbox) > 0 {
		t.Errorf("session outbox %v; want it settled", got.Outbox)
	}
}

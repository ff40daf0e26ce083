package sessionstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// unpublishable stores rollout n, finished, its group 0 streamed (its
// messages out) and its results still to publish, on a session-store whose actor results cannot
// be stored: every result goes to the object store (an inline limit of one
// byte), and the actor has none.
func unpublishable(t *testing.T, s *Service, n int64) schema.Session {
	t.Helper()
	ctx := context.Background()
	// Group 0's messages, as delivered (its episode left no sample): the
	// session records it delivered.
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		m := &schema.Group{Rollout: n, Role: role, GroupIndex: 0, Delivered: []int{0}, Groups: 1}
		if _, err := s.publishSamples(ctx, m, "unused"); err != nil {
			t.Fatal(err)
		}
	}
	s.InlineLimit = 1
	delete(s.Bus.Results, schema.RoleActor)
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	finishedRollout(t, s, n, cfg, schema.EffectResults, schema.EffectCleanup)
	sess, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.Groups = []schema.GroupState{{Index: 0, State: schema.GroupDelivered}}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tl := &schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "a"}}, From: schema.RolePlanner}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(n), tl); err != nil {
		t.Fatal(err)
	}
	// The end of the episode the session records as ended.
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	return sess
}

// TestAFailedResultNamesTheGroupsStreamed: a result that could not be
// published and went out failed instead, at the end of its patience, named
// no group, though every result names the groups streamed (a reader of the
// groups reads each until it is there, rather than end the stream without
// one a follower has not seen yet). Now the failed result names them too.
func TestAFailedResultNamesTheGroupsStreamed(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 61
	sess := unpublishable(t, s, n)
	// Its results have failed for longer than their patience.
	s.failing.note(identify(&sess), s.Now().Add(-2*s.ResultPatience))
	if err := s.settle(context.Background(), sess, 0); err != nil {
		t.Fatal(err)
	}
	r := resultOf(t, s, n, schema.RoleActor)
	if r == nil || r.Status != schema.ResultFailed || !slices.Equal(r.StreamedGroups, []int{0}) {
		t.Fatalf("the actor's result, not publishable: %+v; want failed, naming group 0 streamed", r)
	}
}

// TestAResultThatCanNeverBePublishedFailsAtOnce: a result that cannot be
// published for a reason no try can mend (no object store for its role)
// was tried for the whole patience (2 minutes) before its trainer was told,
// though a failure that cannot pass gives the results up at once
// (docs/guarantees.md), as one of assembly or of a group does. Now the
// failed result goes out at the first try.
func TestAResultThatCanNeverBePublishedFailsAtOnce(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 62
	sess := unpublishable(t, s, n)
	if err := s.settle(context.Background(), sess, 0); err != nil {
		t.Fatalf("settle at the first failure that cannot pass: %v; want the results given up at once", err)
	}
	r := resultOf(t, s, n, schema.RoleActor)
	if r == nil || r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "no result store for role") || r.ArrivalID != "a" {
		t.Fatalf("the actor's result: %+v; want failed, saying why, answering its arrival", r)
	}
	if p := resultOf(t, s, n, schema.RolePlanner); p == nil || p.SamplesObject == "" {
		t.Errorf("the planner's result: %+v; want it published, its samples in the object store", p)
	}
}

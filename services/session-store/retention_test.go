package sessionstore

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// bare makes the finished rollout n's results bare (it ended invalid):
// nothing to assemble.
func bare(t *testing.T, s *Service, n int64, objects ...string) schema.Session {
	t.Helper()
	sess, _, err := bus.Mutate(context.Background(), s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.Status, v.Reason, v.Episodes, v.Ended, v.Objects = schema.ResultInvalid, "no tasks: neither arrival carried any", 0, nil, objects
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

// retentionAt is when the retention time-out of rollout n is scheduled.
func retentionAt(t *testing.T, s *Service, n int64) (time.Time, bool) {
	t.Helper()
	m, err := s.Bus.LastMsg(context.Background(), bus.StreamTimeout, subject.TimeoutSchedule(n, schema.TimeoutRetention))
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339, strings.TrimPrefix(m.Header.Get(jetstream.ScheduleHeader), "@at "))
	if err != nil {
		t.Fatal(err)
	}
	return at, true
}

// TestResultRetentionCountsFromPublication: result objects are kept for
// the result retention after the results went out. It was counted from
// the rollout's end, so results published late (after a crash, or a
// patience of tries) were kept less, and results published more than the
// retention after the end lost their samples seconds after the trainer
// was told where they were. Here they go out an hour after the end.
func TestResultRetentionCountsFromPublication(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	now := time.Now()
	s.Now = func() time.Time { return now }
	s.InlineLimit = 1 // the samples go to the object stores
	ctx := context.Background()
	const n = 121
	finishedRollout(t, s, n, schema.DefaultConfig(), schema.EffectResults, schema.EffectCleanup)
	sess := bare(t, s, n)
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Objects) != 2 || sess.ResultsMs != now.UnixMilli() {
		t.Fatalf("session: objects %v, results at %d; want both results' objects, published at %d", sess.Objects, sess.ResultsMs, now.UnixMilli())
	}
	retention := s.Bus.Provisioning.ResultRetention
	if at, ok := retentionAt(t, s, n); !ok || at.Before(now.Add(retention)) {
		t.Errorf("retention time-out scheduled at %v (%v); want %v after the results, at %v or later", at, ok, retention, now.Add(retention))
	}
	published := now
	stored := func() bool {
		t.Helper()
		for _, obj := range sess.Objects {
			bucket, name, _ := cut(obj)
			if _, err := s.resultStore(bucket).GetInfo(ctx, name); err != nil {
				return false
			}
		}
		return true
	}

	// A minute before the retention is over, counted from the publication
	// (and long after, from the end).
	now = published.Add(retention - time.Minute)
	s.index.put(n, &sess, published)
	s.sweepOnce(ctx)
	if err := s.retire(ctx, n); err == nil || !fail.IsRetryable(err) {
		t.Errorf("retire a minute before the retention is over: %v; want to be tried again later", err)
	}
	if !stored() {
		t.Fatalf("the results' objects were removed %v after they were published, within the retention of %v", now.Sub(published), retention)
	}
	now = published.Add(retention + time.Second)
	if err := s.retire(ctx, n); err != nil {
		t.Fatal(err)
	}
	if stored() {
		t.Error("the results' objects are there after their retention")
	}
}

// TestGroupObjectsRetainedWithInlineResults: the objects of the groups a
// rollout delivered are removed after the retention too. With results
// small enough to go inline, cleanup scheduled nothing (it counted the
// results' objects only), and only the sweep, if it ran, removed them.
func TestGroupObjectsRetainedWithInlineResults(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 122
	group := bus.ObjectResults(schema.RoleActor) + "/rollout-122-actor.group-0.samples"
	finishedRollout(t, s, n, schema.DefaultConfig(), schema.EffectResults, schema.EffectCleanup)
	sess := bare(t, s, n, group)
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	if r := resultOf(t, s, n, schema.RoleActor); r == nil || r.SamplesObject != "" {
		t.Fatalf("actor result %+v; want one inline", r)
	}
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Objects, []string{group}) {
		t.Errorf("session objects %v, want the group's", got.Objects)
	}
	if _, ok := retentionAt(t, s, n); !ok {
		t.Error("no retention time-out scheduled for the group's object")
	}
}

// TestGroupObjectRecordedThoughItsSettleDidNotFinish: a delivered group
// whose samples went to the object store is recorded in the session (and
// removed after the retention) even when the settle that published it did
// not get to write the session (a later effect failed, the process
// stopped). The next settle found the group's messages published and
// named no object: the object outlived every retention.
func TestGroupObjectRecordedThoughItsSettleDidNotFinish(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	s.InlineLimit = 64 // the group's samples go to the object store
	ctx := context.Background()
	const n = 123
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
	sess := finishedRollout(t, s, n, cfg, schema.EffectGroup(0), schema.EffectResults, schema.EffectCleanup)
	// A settle decides the group and publishes it, then stops before its
	// write: what it published is not in the session.
	gs, sess, rev, eps, err := s.decideGroup(ctx, sess, 0, 0)
	if err != nil || gs.State != schema.GroupDelivered {
		t.Fatalf("group 0: %+v, %v; want delivered", gs, err)
	}
	objs, err := s.deliverGroup(ctx, &sess, 0, eps)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("group 0 left objects %v; want one per role", objs)
	}
	if err := s.settle(ctx, sess, rev); err != nil {
		t.Fatal(err)
	}
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if !slices.Contains(got.Objects, obj) {
			t.Errorf("session objects %v: the group's %s is not among them, and nothing removes it", got.Objects, obj)
		}
	}
	if _, ok := retentionAt(t, s, n); !ok {
		t.Error("no retention time-out scheduled for the group's objects")
	}
}

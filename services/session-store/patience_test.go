package sessionstore

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// finishedRollout stores the session of rollout n, finished an hour ago
// with both roles arrived and the effects given still to settle, and
// returns it.
func finishedRollout(t *testing.T, s *Service, n int64, cfg schema.Config, outbox ...string) schema.Session {
	t.Helper()
	now := s.Now().UnixMilli()
	sess := schema.Session{Rollout: n, State: schema.SessionDone, Status: schema.ResultOK, Config: cfg, Episodes: 1,
		Roles:     map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}},
		CreatedMs: now - 2*time.Hour.Milliseconds(), StartedMs: now - 2*time.Hour.Milliseconds(), FinishedMs: now - time.Hour.Milliseconds(),
		Ended: []int{0}, Outbox: outbox}
	if _, err := bus.Create(context.Background(), s.Bus.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	return sess
}

// resultOf reads role's result of rollout n, if one was published.
func resultOf(t *testing.T, s *Service, n int64, role string) *schema.Result {
	t.Helper()
	m, err := s.Bus.LastMsg(context.Background(), bus.StreamRollout, subject.Result(n, role))
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return nil
	}
	var r schema.Result
	if err := schema.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestAGroupThatCannotBeDeliveredFailsTheResults: a rollout's results
// wait for the groups decided before them, and a group that can never be
// delivered (an act its episode lists has no outcome) used to hold them
// back for ever: neither trainer ever had a result. Now the results go
// out failed, naming the group and why, and the rollout settles.
func TestAGroupThatCannotBeDeliveredFailsTheResults(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 41
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}}})
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted,
		Answers: []string{"a"}, Acts: []string{"t1-s1"}}); err != nil {
		t.Fatal(err)
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := finishedRollout(t, s, n, cfg, "group:0", schema.EffectResults, schema.EffectCleanup)
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := resultOf(t, s, n, role)
		if r == nil {
			t.Fatalf("no %s result", role)
		}
		if r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "group 0") || !strings.Contains(r.Reason, "t1-s1") || r.SampleCount != 0 {
			t.Errorf("%s result: %s (%q), %d samples; want failed, naming group 0 and the act without an outcome", role, r.Status, r.Reason, r.SampleCount)
		}
	}
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Outbox) > 0 || got.Status != schema.ResultFailed {
		t.Errorf("session: outbox %v, status %s; want settled and failed", got.Outbox, got.Status)
	}
}

// TestResultsTriedForThePatienceFromTheirFirstFailure: a failure that
// may pass (NATS not answering) is tried again for ResultPatience from
// the first time it was seen, not from the rollout's end: a rollout that
// finished long ago (NATS was down for minutes) used to be given up as
// failed at the first failure after NATS came back, though every sample
// was there. Past the patience, a group not delivered and the results
// behind it go out failed, saying why.
func TestResultsTriedForThePatienceFromTheirFirstFailure(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	now := time.Now()
	s.Now = func() time.Time { return now }
	ctx := context.Background()
	read := loadTaskList
	loadTaskList = func(context.Context, *bus.Bucket, *nats.Conn, int64) (schema.TaskList, bool, error) {
		return schema.TaskList{}, false, fail.Transientf("tasks: JetStream did not answer")
	}
	defer func() { loadTaskList = read }()
	cfg := schema.DefaultConfig()
	grouped := cfg
	grouped.StreamGroups = true
	for _, tc := range []struct {
		n      int64
		cfg    schema.Config
		outbox []string
	}{
		{51, cfg, []string{schema.EffectResults, schema.EffectCleanup}},
		{52, grouped, []string{"group:1", schema.EffectResults, schema.EffectCleanup}},
	} {
		sess := finishedRollout(t, s, tc.n, tc.cfg, tc.outbox...)
		if tc.n == 52 {
			// Group 0 was streamed before group 1 could not be.
			var err error
			if sess, _, err = bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(tc.n), func(v *schema.Session, _ bool) (bool, error) {
				v.Groups = []schema.GroupState{{Index: 0, State: schema.GroupDelivered}}
				return true, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.settle(ctx, sess, 0); err == nil {
			t.Fatalf("rollout %d: settled with its tasks unreadable", tc.n)
		}
		if r := resultOf(t, s, tc.n, schema.RolePlanner); r != nil {
			t.Fatalf("rollout %d: a %s result (%q) at the first failure, an hour after the rollout ended; want it tried again first", tc.n, r.Status, r.Reason)
		}
		now = now.Add(s.ResultPatience / 2)
		if err := s.settle(ctx, sess, 0); err == nil || resultOf(t, s, tc.n, schema.RolePlanner) != nil {
			t.Fatalf("rollout %d: given up within the patience (%v)", tc.n, err)
		}
		now = now.Add(s.ResultPatience)
		if err := s.settle(ctx, sess, 0); err != nil {
			t.Fatalf("rollout %d: past the patience: %v", tc.n, err)
		}
		r := resultOf(t, s, tc.n, schema.RoleActor)
		if r == nil || r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "JetStream did not answer") {
			t.Fatalf("rollout %d past the patience: result %+v; want failed, saying why", tc.n, r)
		}
		if tc.n == 52 && (!strings.Contains(r.Reason, "group 1") || !slices.Equal(r.StreamedGroups, []int{0})) {
			t.Errorf("rollout %d: reason %q, streamed_groups %v; want the group not delivered named, and the one streamed before", tc.n, r.Reason, r.StreamedGroups)
		}
	}
}

// TestAGroupCompletesThoughTheIndexIsBehind: whether an episode end
// completes a group is decided by the session as written, not by the
// index's copy of its config, which may predate the start (a first
// arrival without a config): such an end used to complete no group, and
// the group was never delivered.
func TestAGroupCompletesThoughTheIndexIsBehind(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 61
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0"}, {GroupIndex: 1, Index: 1, Prompt: "q1"}}})
	s.index.put(n, &schema.Session{Rollout: n, State: schema.SessionWaiting}, time.Now()) // as the actor's arrival left it
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	now := time.Now().UnixMilli()
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(n), schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg,
		Episodes: 2, CreatedMs: now, StartedMs: now}); err != nil {
		t.Fatal(err)
	}
	end := &pendingEnd{end: &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted}, done: make(chan struct{})}
	sess, _, err := s.recordEnds(ctx, n, []*pendingEnd{end})
	if err != nil {
		t.Fatal(err)
	}
	if !end.wrote || !sess.Owes(schema.EffectGroup(0)) {
		t.Errorf("episode 0 ended (written: %v), outbox %v; want group 0, now complete, to be delivered", end.wrote, sess.Outbox)
	}
}

// TestAnEarlierRolloutOfTheSameNumber: rollout numbers start again when a
// training run does, once the earlier run's sessions are gone. A replica
// that cached the earlier rollout's task list under the number (another
// replica cleaned it up) used it for the new one: groups of the wrong
// tasks, episodes past its length never grouped, and results scored
// against the wrong labels. The list the session names is read instead;
// a list that is gone, once the rollout started, is an error, not an
// empty batch.
func TestAnEarlierRolloutOfTheSameNumber(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 71
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Prompt: "old 0"}, {GroupIndex: 1, Index: 1, Prompt: "old 1"}},
		From: schema.RolePlanner, Digest: "sha256:old"})
	fresh := schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Prompt: "new 0"}, {GroupIndex: 1, Index: 1, Prompt: "new 1"}, {GroupIndex: 2, Index: 2, Prompt: "new 2"}},
		From: schema.RolePlanner, Digest: "sha256:new"}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(n), fresh); err != nil {
		t.Fatal(err)
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	now := time.Now().UnixMilli()
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: 3, CreatedMs: now, StartedMs: now,
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p", Digest: "d", Tasks: "sha256:new"}, schema.RoleActor: {ArrivalID: "a", Digest: "e"}}}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	tl, err := s.tasksOf(ctx, &sess)
	if err != nil || len(tl.Tasks) != 3 || tl.Tasks[0].Prompt != "new 0" {
		t.Fatalf("tasks of the new rollout: %+v (%v); want its 3 tasks", tl.Tasks, err)
	}
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Prompt: "old 0"}}, From: schema.RolePlanner, Digest: "sha256:old"})
	end := &pendingEnd{end: &schema.EpisodeEnd{Rollout: n, Episode: 2, Turns: 1, Status: schema.EpisodeCompleted}, done: make(chan struct{})}
	written, _, err := s.recordEnds(ctx, n, []*pendingEnd{end})
	if err != nil {
		t.Fatal(err)
	}
	if !written.Owes(schema.EffectGroup(2)) {
		t.Errorf("episode 2 ended with the earlier rollout's list cached: outbox %v; want its group 2 complete", written.Outbox)
	}

	// What this process counted of the earlier rollout's groups is not the
	// new one's.
	old := sess
	old.CreatedMs -= time.Hour.Milliseconds()
	s.counted.put(identify(&old), schema.RoleActor, 0, groupCounts{})
	if _, ok := s.counted.get(identify(&sess), schema.RoleActor, 0); ok {
		t.Error("the new rollout reads the counts of the earlier rollout's group 0")
	}

	// Gone (settled and cleaned up by another replica): an error that passes.
	s.taskCache.drop(n)
	if err := s.Bus.Sessions.Delete(ctx, schema.TasksKey(n)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.assemble(ctx, &sess); err == nil || !fail.IsRetryable(err) {
		t.Errorf("assembling a started rollout whose task list is gone: %v; want an error that passes", err)
	}
}

// TestAFailureWhileRunningStartsNoPatience: the patience of a finished
// rollout's results counts from their first failure. A replica that failed
// to deliver a group while the rollout ran (NATS did not answer), a
// failure another replica then settled, kept it as the rollout's first
// failure: an hour later, at the rollout's end, the first failure that
// may pass made it give the results up at once, and both trainers got a
// failed result although every sample was there.
func TestAFailureWhileRunningStartsNoPatience(t *testing.T) {
	_, url := bustest.Server(t)
	a, b := newTestService(bustest.Bus(t, url, "ss-1")), newTestService(bustest.Bus(t, url, "ss-2"))
	now := time.Now()
	a.Now = func() time.Time { return now }
	ctx := context.Background()
	const n = 71
	tasks := schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}}}
	b.keepTasks(n, tasks)
	for _, m := range []schema.Message{
		&schema.PlanOutput{Rollout: n, Episode: 0, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
		}},
		&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}},
	} {
		if err := a.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	read := loadTaskList
	defer func() { loadTaskList = read }()
	unreadable := func(context.Context, *bus.Bucket, *nats.Conn, int64) (schema.TaskList, bool, error) {
		return schema.TaskList{}, false, fail.Transientf("tasks: JetStream did not answer")
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := finishedRollout(t, a, n, cfg, schema.EffectGroup(0))
	sess, _, err := bus.Mutate(ctx, a.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.State, v.Status, v.FinishedMs, v.Episodes = schema.SessionRunning, "", 0, 2
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Replica a fails to deliver group 0 while the rollout runs; replica b
	// delivers it.
	loadTaskList = unreadable
	if err := a.settle(ctx, sess, 0); err == nil {
		t.Fatal("settled with the tasks unreadable")
	}
	loadTaskList = read
	if err := b.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	// An hour later the rollout ends, and replica a's first try at the
	// results fails in a way that may pass.
	now = now.Add(time.Hour)
	sess, _, err = bus.Mutate(ctx, a.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.State, v.Status, v.Reason, v.FinishedMs = schema.SessionTimeout, schema.ResultPartial, "rollout time-out: 1 of 2 episodes ended", now.UnixMilli()
		v.Outbox = []string{schema.EffectResults, schema.EffectCleanup}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	loadTaskList = unreadable
	err = a.settle(ctx, sess, 0)
	if r := resultOf(t, a, n, schema.RolePlanner); r != nil {
		t.Fatalf("a %s result (%q) at the results' first failure; want them tried again for the patience", r.Status, r.Reason)
	}
	if err == nil {
		t.Fatal("settled with the tasks unreadable")
	}
	loadTaskList = read
	if err := b.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if r := resultOf(t, a, n, role); r == nil || r.Status != schema.ResultPartial || r.StreamedGroups == nil {
			t.Errorf("%s result %+v; want partial, with group 0", role, r)
		}
	}
}

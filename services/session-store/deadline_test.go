package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestTheSweepTimesOutARolloutWhoseOutboxFails: the sweep is the backup
// for a time-out message that was lost, but it settled a session with
// effects owed before it looked at its deadline, so a running rollout
// whose outbox kept failing (a group that cannot be delivered) was
// settled again and again and never timed out: it ran for ever, and the
// patience that fails the results of a finished rollout never began. Now
// the deadline comes first: the rollout times out, and its results go out
// failed, naming the group.
func TestTheSweepTimesOutARolloutWhoseOutboxFails(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 111
	tasks := schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "b"}}}
	// The task list cannot be read for now (a failure that may pass: the
	// outbox keeps failing); and episode 0 ended naming an act that has no
	// outcome: once read, its group can never be delivered. (A group that
	// can never be delivered while the rollout runs is recorded failed, and
	// does not hold the outbox: TestAFailedGroupDoesNotBlockTheOthers.)
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted,
		Answers: []string{"a"}, Acts: []string{"t1-s1"}}); err != nil {
		t.Fatal(err)
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups, cfg.RolloutTimeoutS = true, 60
	started := s.Now().Add(-time.Hour).UnixMilli()
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: 2, Ended: []int{0},
		Roles:     map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}},
		CreatedMs: started, StartedMs: started, Outbox: []string{schema.EffectGroup(0)}}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	if err := s.settle(ctx, sess, 0); err == nil {
		t.Fatal("a group that cannot be delivered was settled")
	}
	// As the sweep's index has it: written long ago, its deadline long past.
	s.index.put(n, &sess, s.Now().Add(-time.Hour))
	s.sweepOnce(ctx)
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != schema.SessionTimeout {
		t.Fatalf("after the sweep, 59 min past the rollout's deadline, its outbox failing: %s (outbox %v); want timed out", got.State, got.Outbox)
	}
	s.keepTasks(n, tasks)
	if err := s.settle(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if r := resultOf(t, s, n, role); r == nil || r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "group 0") {
			t.Errorf("%s result: %+v; want failed, naming group 0", role, r)
		}
	}
}

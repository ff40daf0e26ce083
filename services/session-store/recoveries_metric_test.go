package sessionstore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// TestASweepThatFailsCountsNoRecovery: planact_recoveries_total counts
// work the sweep finished because no message did. A sweep whose try
// failed (its outbox could not be settled, and will be tried again) was
// counted all the same, each sweep again: a rollout whose outbox failed
// for a minute counted thirty recoveries of one. Now a try counts once it
// did what it says. (Not parallel: it reads process-wide metrics.)
func TestASweepThatFailsCountsNoRecovery(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 181
	// The task list cannot be read for now (a failure that may pass): the
	// group the outbox owes cannot be decided, and the settle fails.
	tasks := schema.TaskList{Tasks: []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "b"}}}
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted,
		Answers: []string{"a"}, Acts: []string{"t1-s1"}}); err != nil {
		t.Fatal(err)
	}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	started := s.Now().Add(-time.Minute).UnixMilli()
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: 2, Ended: []int{0},
		Roles:     map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}},
		CreatedMs: started, StartedMs: started, Outbox: []string{schema.EffectGroup(0)}}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	// As the sweep's index has it: written long ago, its outbox still owed.
	s.index.put(n, &sess, s.Now().Add(-time.Hour))
	settles := telemetry.Recoveries.WithLabelValues(Name, "settle")
	before := testutil.ToFloat64(settles)
	for range 3 {
		s.sweepOnce(ctx)
	}
	if got := testutil.ToFloat64(settles) - before; got != 0 {
		t.Errorf("three sweeps that could not settle the outbox counted %v recoveries; want 0", got)
	}
	s.keepTasks(n, tasks)
	s.sweepOnce(ctx)
	got, _, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Outbox) != 0 {
		t.Fatalf("outbox %v after the tasks could be read; want it settled", got.Outbox)
	}
	if got := testutil.ToFloat64(settles) - before; got != 1 {
		t.Errorf("the sweep that settled the outbox: %v recoveries counted in all; want 1", got)
	}
}

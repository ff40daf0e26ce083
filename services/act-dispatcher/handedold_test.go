package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// The copy of a plan that the watchdog publishes to hand a turn over
// (HdrTakeover) is a plan message like any other: delivered again after
// its ack was lost, once its turn ran, its rollout ended and its run
// states were removed, while the session cache still shows the rollout
// running, it runs no act. Before, a copy was never checked for being
// old: it created the run afresh and ran its acts again, an engine called
// twice for one act with no retry recorded.
func TestAnOldHandedOverPlanOfARolloutOverSinceRunsNothing(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info := testInfo() // as the cache shows it: running
	sess := info.Session
	sess.State = schema.SessionDone
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(1), &sess); err != nil {
		t.Fatal(err)
	}
	m := msg(9)
	m.Header.Set(HdrTakeover, "5")        // the watchdog's copy, taking the turn from runner 5
	m.Time = time.Now().Add(-time.Minute) // stored before its ack was lost
	createsNoRun(t, ctx, s, info, m, "the old copy of a plan of a rollout over")
}

// The watchdog's copy that comes fresh, once its turn's rollout ended and
// its run states were removed (the session cache may show the rollout
// running a second more, and the copy is too young to be read as old),
// finds no run to take over: it creates none, and runs no act. Before, it
// created the run afresh and ran its acts again.
func TestAHandedOverPlanWhoseRunIsGoneRunsNothing(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info := testInfo() // as the cache shows it: running
	sess := info.Session
	sess.State = schema.SessionDone
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(1), &sess); err != nil {
		t.Fatal(err)
	}
	m := msg(9)
	m.Header.Set(HdrTakeover, "5") // the watchdog's copy, taking the turn from runner 5
	createsNoRun(t, ctx, s, info, m, "the copy handed over of a run that is gone")
}

// createsNoRun handles m, a plan message of turn 1 of episode 0 of rollout
// 1 (what it is), and checks, as it runs and once it is handled, that it
// creates no run: its acts would run again.
func createsNoRun(t *testing.T, ctx context.Context, s *Service, info *session.Info, m bus.Msg, what string) {
	t.Helper()
	handled := make(chan error, 1)
	go func() { handled <- s.handleDAG(ctx, info, m, planDAG(1, false, 1, search("a", "x"))) }()
	for {
		var err error
		over := false
		select {
		case err = <-handled:
			over = true
		default:
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		_, _, found, rerr := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1))
		if rerr != nil {
			t.Fatal(rerr)
		}
		if found {
			t.Fatalf("%s created its run: its acts would run again", what)
		}
		if over {
			return // handled, and no run: nothing ran
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
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
			t.Fatalf("the old copy of a plan of a rollout over: %v", err)
		}
		_, _, found, rerr := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1))
		if rerr != nil {
			t.Fatal(rerr)
		}
		if found {
			t.Fatal("the old copy of a plan of a rollout over created its run: its acts would run again")
		}
		if over {
			return // handled, and no run: nothing ran
		}
		time.Sleep(5 * time.Millisecond)
	}
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
			t.Fatalf("the copy handed over of a run that is gone: %v", err)
		}
		_, _, found, rerr := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1))
		if rerr != nil {
			t.Fatal(rerr)
		}
		if found {
			t.Fatal("the copy handed over of a run that is gone created it: its acts would run again")
		}
		if over {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

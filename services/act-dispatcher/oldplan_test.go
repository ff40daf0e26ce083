package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestAnOldPlanOfARolloutOverSinceRunsNothing: a plan message delivered
// again after its ack was lost (a NATS restart), once its turn ran, its
// rollout ended and its run states were removed, while the session cache
// still shows the rollout running (it may be a second old), runs no act:
// make chaos found such a turn run again, an engine called twice for one
// act. A message as old whose rollout still runs is run.
func TestAnOldPlanOfARolloutOverSinceRunsNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		state string
		runs  bool
	}{
		{"the rollout ended since", schema.SessionDone, false},
		{"the rollout still runs", schema.SessionRunning, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := testService(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			info := testInfo() // as the cache shows it: running
			sess := info.Session
			sess.State = c.state
			if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(1), &sess); err != nil {
				t.Fatal(err)
			}
			m := msg(5)
			m.Time = time.Now().Add(-10 * time.Second) // stored before its ack was lost
			done := make(chan error, 1)
			go func() { done <- s.handleDAG(ctx, info, m, planDAG(1, false, 1, search("a", "x"))) }()
			_, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1))
			for ; err == nil && !found && c.runs && ctx.Err() == nil; _, _, found, err = bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1)) {
				time.Sleep(10 * time.Millisecond)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.runs {
				if err := <-done; err != nil {
					t.Fatalf("the old plan of a rollout over: %v", err)
				}
				if _, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(1, 0, 1)); err != nil || found {
					t.Fatalf("the old plan of a rollout over created its run (%v, %v): its acts would run again", found, err)
				}
				return
			}
			if !found {
				t.Fatal("the old plan of a rollout that still runs did not run its turn")
			}
			cancel()
			<-done
		})
	}
}

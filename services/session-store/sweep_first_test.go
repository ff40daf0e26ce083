package sessionstore

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestTheSweepRunsOnceTheSessionsAreRead: a session-store that starts
// (after a crash, say) finishes what was pending as soon as it has read
// the sessions and roles, as the sweep's comment said; its first pass
// waited for the first tick, SweepEvery later. Here a pause past its
// time-out when the sweep starts, with a sweep every hour, is ended at
// once.
func TestTheSweepRunsOnceTheSessionsAreRead(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	s.SweepEvery = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const role = schema.RoleActor
	now := time.Now().UnixMilli()
	if _, _, err := bus.Mutate(ctx, b.Sessions, schema.RoleKey(role), func(v *schema.RoleState, _ bool) (bool, error) {
		v.Role, v.Epoch = role, v.Epoch+1
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs = true, schema.PauseWait, "pause.actor.before-the-crash", now-60_000, now-1
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.sweep(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
		if err != nil {
			t.Fatal(err)
		}
		if !st.Paused && st.Expiry != nil && st.Expiry.PauseID == "pause.actor.before-the-crash" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pause past its time-out when the sweep started is still %+v: the sweep's first pass waits for its first tick (%v)", st, s.SweepEvery)
		}
	}
}

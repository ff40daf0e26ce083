package session_test

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// TestFollowerCancelsWorkOnARolloutAlreadyOver: work registered for a
// rollout after the follower saw it end (a request that was on its way, an
// act's retry) is cancelled at once, not when the session next changes. A
// gateway once started a generation for such an act, and it held an
// engine slot until a later write to the session happened to end it.
func TestFollowerCancelsWorkOnARolloutAlreadyOver(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := session.NewFollower(b, bustest.Logger())
	go f.Run(ctx)

	const n = 5
	sess := &schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	before, done := f.Rollout(ctx, n)
	defer done()
	set := func(state string) {
		t.Helper()
		_, _, err := bus.Mutate(ctx, b.Sessions, schema.SessionKey(n), func(s *schema.Session, _ bool) (bool, error) {
			s.State = state
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	set(schema.SessionDone)
	select {
	case <-before.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("work registered while the rollout ran was not cancelled when it ended")
	}
	after, done2 := f.Rollout(ctx, n)
	defer done2()
	select {
	case <-after.Done():
		if context.Cause(after) != session.ErrRolloutOver {
			t.Errorf("cause %v, want ErrRolloutOver", context.Cause(after))
		}
	default:
		t.Fatal("work registered after the rollout ended is not cancelled")
	}
	if other, done3 := f.Rollout(ctx, n+1); other.Err() != nil {
		t.Errorf("work on another rollout cancelled: %v", context.Cause(other))
		done3()
	} else {
		done3()
	}

	// The session removed (expired): its number may be used again.
	if err := b.Sessions.Delete(ctx, schema.SessionKey(n)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		again, done4 := f.Rollout(ctx, n)
		cancelled := again.Err() != nil
		done4()
		if !cancelled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("work on the rollout still cancelled at once after its session was removed")
		}
	}
}

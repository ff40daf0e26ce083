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

// TestSyncRoleSeesAPauseTheWatchHasNotBrought: a gateway that starts while
// its role is paused reads the pause from the bucket before it serves
// (SyncRole), not when its watch delivers it: no generation enters the
// gate. A state older than the one the gate holds, delivered later by the
// watch, does not open it again.
func TestSyncRoleSeesAPauseTheWatchHasNotBrought(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := schema.RoleKey(schema.RoleActor)
	put := func(paused bool) {
		t.Helper()
		if _, _, err := bus.Mutate(ctx, b.Sessions, key, func(v *schema.RoleState, _ bool) (bool, error) {
			v.Role, v.Paused = schema.RoleActor, paused
			v.Epoch++
			if paused {
				v.Mode, v.PauseID, v.DeadlineMs = schema.PauseWait, "pause-1", time.Now().Add(time.Minute).UnixMilli()
			}
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	put(false)
	put(true)
	f := session.NewFollower(b, bustest.Logger()) // its watch not started: as late as a watch can be
	g := f.Gate(schema.RoleActor)
	if _, done, _, ok := g.TryEnter(ctx); ok {
		done() // what a gateway serving before it read the role's state would have let through
	} else {
		t.Fatal("a gate that has read nothing is paused")
	}
	if err := f.SyncRole(ctx, schema.RoleActor); err != nil {
		t.Fatal(err)
	}
	if _, _, st, ok := g.TryEnter(ctx); ok || !st.Paused {
		t.Fatalf("after SyncRole a generation entered the gate (state %+v); the role is paused", st)
	}
	// The role's state before the pause, delivered late, changes nothing.
	g.SetStateAt(schema.RoleState{Role: schema.RoleActor, Epoch: 1}, 1)
	if _, _, st, ok := g.TryEnter(ctx); ok || !st.Paused {
		t.Fatalf("an older state opened the gate again (state %+v)", st)
	}
	// The watch starts, delivers the same pause, then the resume.
	go f.Run(ctx)
	put(false)
	for deadline := time.Now().Add(30 * time.Second); g.State().Paused; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the resume did not open the gate")
		}
	}
	if st := g.State(); st.Epoch != 3 {
		t.Errorf("the gate holds epoch %d, want the resume's 3", st.Epoch)
	}
}

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

// pauseRole writes a pause of the actor role into the bucket, as the
// session-store does, and returns the revision it wrote.
func pauseRole(t *testing.T, b *bus.Bus) (schema.RoleState, uint64) {
	t.Helper()
	st, rev, _, err := bus.MutateRev(context.Background(), b.Sessions, schema.RoleKey(schema.RoleActor), func(v *schema.RoleState, _ bool) (bool, error) {
		v.Role, v.Paused, v.Mode, v.PauseID = schema.RoleActor, true, schema.PauseWait, "pause-gone"
		v.Epoch++
		v.DeadlineMs = time.Now().Add(time.Hour).UnixMilli()
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st, rev
}

// gateIs waits until the gate's pause is paused, failing the test after a
// generous deadline.
func gateIs(t *testing.T, g *session.Gate, paused bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); g.State().Paused != paused; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the gate holds %+v, want paused=%v", what, g.State(), paused)
		}
	}
}

// removals are the ways a role's key leaves the bucket: an operator's
// delete or purge (a marker the watch delivers), and a purge of the
// stream's subject, which leaves no marker.
var removals = map[string]func(ctx context.Context, b *bus.Bus, key string) error{
	"delete": func(ctx context.Context, b *bus.Bus, key string) error { return b.Sessions.Delete(ctx, key) },
	"purge":  func(ctx context.Context, b *bus.Bus, key string) error { return b.Sessions.Purge(ctx, key) },
	"stream purge": func(ctx context.Context, b *bus.Bus, key string) error {
		return b.Purge(ctx, "KV_"+bus.BucketSession, "$KV."+bus.BucketSession+"."+key)
	},
}

// TestGateOpensWhenTheRoleKeyIsDeleted: a role whose key an operator
// deletes or purges is paused no more: the work the pause held goes on,
// and work that comes after passes the gate. The gate kept the last state
// it had read, and the work waited for a pause that no longer existed.
func TestGateOpensWhenTheRoleKeyIsDeleted(t *testing.T) {
	for _, name := range []string{"delete", "purge"} {
		t.Run(name, func(t *testing.T) {
			_, url := bustest.Server(t)
			b := bustest.Bus(t, url, "t")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := session.NewFollower(b, bustest.Logger())
			go f.Run(ctx)
			g := f.Gate(schema.RoleActor)

			st, rev := pauseRole(t, b)
			gateIs(t, g, true, "paused")
			w := waitAsync(g)
			held(t, g, 1)
			if err := removals[name](ctx, b, schema.RoleKey(schema.RoleActor)); err != nil {
				t.Fatal(err)
			}
			if err := result(t, w); err != nil {
				t.Fatalf("the wait held by the pause whose key was removed: %v, want it to go on", err)
			}
			if _, done, now, ok := g.TryEnter(ctx); !ok {
				t.Fatalf("the role's key is gone and the gate is shut (%+v)", now)
			} else {
				done()
			}
			// The pause, delivered late, does not shut it again.
			g.SetStateAt(st, rev)
			if g.State().Paused {
				t.Fatal("a put older than the removal paused the role again")
			}
			// A pause after the removal holds the role again.
			pauseRole(t, b)
			gateIs(t, g, true, "paused after the removal")
		})
	}
}

// TestSyncRoleSeesTheRoleKeyGone: a gateway that reads its role's state
// (SyncRole) after the key was removed takes the role as not paused, at a
// revision no older than the removal: a pause the watch delivers late,
// newer than what the gate held, does not shut the gate again. SyncRole gave the gate nothing when the
// key was not found, and the gate kept the pause.
func TestSyncRoleSeesTheRoleKeyGone(t *testing.T) {
	for _, name := range []string{"delete", "purge", "stream purge"} {
		t.Run(name, func(t *testing.T) {
			_, url := bustest.Server(t)
			b := bustest.Bus(t, url, "t")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := session.NewFollower(b, bustest.Logger()) // no watch: only SyncRole feeds the gate
			g := f.Gate(schema.RoleActor)

			st, rev := pauseRole(t, b)
			g.SetStateAt(st, rev) // as the watch delivered it
			// Paused again; the watch has not brought it yet.
			st, rev = pauseRole(t, b)
			if err := removals[name](ctx, b, schema.RoleKey(schema.RoleActor)); err != nil {
				t.Fatal(err)
			}
			if err := f.SyncRole(ctx, schema.RoleActor); err != nil {
				t.Fatal(err)
			}
			if _, done, now, ok := g.TryEnter(ctx); !ok {
				t.Fatalf("after SyncRole read the role's key gone, the gate is shut (%+v)", now)
			} else {
				done()
			}
			g.SetStateAt(st, rev)
			if g.State().Paused {
				t.Fatal("a put older than the removal paused the role again")
			}
		})
	}
}

// TestSyncRoleOfARoleNeverPaused: a role whose key was never written is
// not paused, and the first pause written after the read holds it.
func TestSyncRoleOfARoleNeverPaused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := session.NewFollower(b, bustest.Logger())
	g := f.Gate(schema.RoleActor)
	if err := f.SyncRole(ctx, schema.RoleActor); err != nil {
		t.Fatal(err)
	}
	if g.State().Paused {
		t.Fatal("a role never paused is paused")
	}
	st, rev := pauseRole(t, b)
	g.SetStateAt(st, rev)
	if !g.State().Paused {
		t.Fatal("the first pause, written after SyncRole, was taken as older than it")
	}
}

// TestFollowerOpensTheGateOfARoleKeyGoneWhileTheWatchWasDown: a role's key
// purged from the stream while the sessions watch was down is not in what
// the watch replays, and no update says it is gone: the gate held the
// pause for ever.
func TestFollowerOpensTheGateOfARoleKeyGoneWhileTheWatchWasDown(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	orig := b.Sessions
	kv := bustest.Restartable(orig.KeyValue)
	watched := *orig
	watched.KeyValue = kv
	b.Sessions = &watched
	ctx, cancel := context.WithCancel(context.Background())
	f := session.NewFollower(b, bustest.Logger())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	g := f.Gate(schema.RoleActor)
	<-kv.Started
	pauseRole(t, b)
	gateIs(t, g, true, "before the restart")
	w := waitAsync(g)
	held(t, g, 1)

	up := kv.Stop()
	if err := removals["stream purge"](ctx, b, schema.RoleKey(schema.RoleActor)); err != nil {
		t.Fatal(err)
	}
	up()
	<-kv.Started
	if err := result(t, w); err != nil {
		t.Fatalf("the wait held by the pause whose key went: %v, want it to go on", err)
	}
	gateIs(t, g, false, "after the restart")
}

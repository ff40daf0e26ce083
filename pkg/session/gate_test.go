package session_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// waitAsync starts g.Wait and returns where its result comes.
func waitAsync(g *session.Gate) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- g.Wait(context.Background()) }()
	return ch
}

// held waits until the pause holds k waits, failing the test after a
// generous deadline.
func held(t *testing.T, g *session.Gate, k int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); g.Waiting() != k; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pause holds %d waits, want %d", g.Waiting(), k)
		}
	}
}

// result waits for the wait's result, failing the test after a generous
// deadline: it waits for an event, it does not time anything.
func result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the wait never returned")
		return nil
	}
}

func paused(epoch int64) schema.RoleState {
	return schema.RoleState{Role: schema.RoleActor, Paused: true, Mode: schema.PauseWait, Epoch: epoch, PauseID: "pause.actor.1",
		SinceMs: 1767225700000, DeadlineMs: 1767225703000}
}

// expired is the state the session-store writes when the pause of epoch
// ends at its time-out: not paused, a new epoch, the expiry recorded.
func expired(epoch int64) schema.RoleState {
	return schema.RoleState{Role: schema.RoleActor, Epoch: epoch + 1, Expiry: &schema.PauseExpiry{Epoch: epoch, PauseID: "pause.actor.1",
		Mode: schema.PauseWait, SinceMs: 1767225700000, DeadlineMs: 1767225703000, AtMs: 1767225703100, Reason: "pause time-out (3s): no resume came"}}
}

// TestGateExpiredPause: the work that waited for a pause that expired fails,
// saying so; work that comes after goes through, without a resume.
func TestGateExpiredPause(t *testing.T) {
	g := session.NewGate(schema.RoleActor)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatalf("a role never paused: %v", err)
	}
	g.SetState(paused(1))
	w := waitAsync(g)
	held(t, g, 1)
	g.SetState(expired(1))
	err := result(t, w)
	if err == nil || !strings.Contains(err.Error(), "pause time-out (3s)") || !strings.Contains(err.Error(), "not resumed in time") {
		t.Fatalf("the wait that waited for the expired pause: %v, want it to fail naming the time-out", err)
	}
	for range 3 {
		if err := g.Wait(context.Background()); err != nil {
			t.Fatalf("a wait after the expiry: %v; the role must work again", err)
		}
	}
}

// TestGateResumedPause: a resume lets the waiting work go on.
func TestGateResumedPause(t *testing.T) {
	g := session.NewGate(schema.RoleActor)
	g.SetState(paused(1))
	w := waitAsync(g)
	held(t, g, 1)
	g.SetState(schema.RoleState{Role: schema.RoleActor, Epoch: 2, WeightVersion: "actor-v4"})
	if err := result(t, w); err != nil {
		t.Fatalf("resumed: %v", err)
	}
}

// TestGateExpiryMissed: a follower that missed the expiry (its watch
// started again) and sees the role paused anew still fails the work that
// waited for the expired pause, and holds the work that comes after.
func TestGateExpiryMissed(t *testing.T) {
	g := session.NewGate(schema.RoleActor)
	g.SetState(paused(1))
	old := waitAsync(g)
	held(t, g, 1)
	again := paused(3)
	again.Expiry = expired(1).Expiry
	g.SetState(again)
	if err := result(t, old); err == nil || !strings.Contains(err.Error(), "pause time-out") {
		t.Fatalf("the wait for the expired pause: %v, want the time-out", err)
	}
	later := waitAsync(g)
	held(t, g, 1)
	g.SetState(schema.RoleState{Role: schema.RoleActor, Epoch: 4, Expiry: again.Expiry})
	if err := result(t, later); err != nil {
		t.Fatalf("the wait for the pause resumed: %v", err)
	}
}

// TestNothingEntersAPausedGate: a generation that passes the gate is
// registered in the same step, so a pause answered as drained has none
// running and lets none start until the resume; one that entered before
// the pause is waited for (wait mode) or aborted (abort mode).
func TestNothingEntersAPausedGate(t *testing.T) {
	for _, mode := range []string{schema.PauseWait, schema.PauseAbort} {
		t.Run(mode, func(t *testing.T) {
			g := session.NewFollower(nil, zerolog.Nop()).Gate(schema.RoleActor)
			ctx := context.Background()
			// A generation inside the gate (tokenizing, say) when the pause lands.
			gctx, left, err := g.Enter(ctx)
			if err != nil {
				t.Fatal(err)
			}
			g.SetState(schema.RoleState{Role: schema.RoleActor, Paused: true, Mode: mode, Epoch: 1})
			drained := make(chan int, 1)
			go func() {
				aborted, ok := g.Drained(ctx, 1)
				if !ok {
					aborted = -1
				}
				drained <- aborted
			}()
			if mode == schema.PauseAbort {
				<-gctx.Done()
				if !errors.Is(context.Cause(gctx), session.ErrPaused) {
					t.Errorf("aborted with %v, want ErrPaused", context.Cause(gctx))
				}
			} else {
				select {
				case <-drained:
					t.Fatal("drained while a generation was inside the gate")
				case <-time.After(100 * time.Millisecond):
				}
			}
			left()
			if got := <-drained; got < 0 || (mode == schema.PauseAbort) != (got == 1) {
				t.Fatalf("drained: %d aborted", got)
			}
			// Answered: nothing gets in until the resume.
			if _, _, _, ok := g.TryEnter(ctx); ok {
				t.Fatal("a generation entered a paused gate")
			}
			var entered atomic.Bool
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, left, err := g.Enter(ctx)
				if err == nil {
					entered.Store(true)
					left()
				}
			}()
			time.Sleep(50 * time.Millisecond)
			if entered.Load() {
				t.Fatal("Enter passed a paused gate")
			}
			g.SetState(schema.RoleState{Role: schema.RoleActor, Epoch: 2})
			<-done
			if !entered.Load() {
				t.Fatal("Enter did not pass after the resume")
			}
		})
	}
}

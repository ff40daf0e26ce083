package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

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

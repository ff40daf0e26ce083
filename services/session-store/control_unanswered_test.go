package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAPauseThatExpiredUnansweredIsAnswered: a pause whose handler stopped
// before it answered (a crash near its deadline), delivered again after
// the sweep ended it at its time-out, returned with no answer: only
// control.<role>.expired named it, where its trainer does not wait, and
// Pause failed with ErrTimeout 30 s later. Now it is refused, saying it
// expired and that the role works again. One answered before it expired
// is not answered again.
func TestAPauseThatExpiredUnansweredIsAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor

	// Recorded, never answered, then expired by the sweep.
	m := storedControl(t, b, &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 1, AtMs: time.Now().UnixMilli(), Nonce: "crashed"})
	st, _, err := bus.Mutate(ctx, b.Sessions, schema.RoleKey(role), func(v *schema.RoleState, _ bool) (bool, error) {
		now := time.Now().UnixMilli()
		v.Role, v.Epoch, v.StateSeq = role, v.Epoch+1, m.Seq
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs = true, schema.PauseWait, m.ID(), now-1000, now-1
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if x, err := s.expirePause(ctx, st); err != nil || x == nil {
		t.Fatalf("the pause past its time-out: expiry %+v (%v); want it ended", x, err)
	}
	m.Delivered = 2
	if err := s.handle(ctx, m); err != nil {
		t.Fatalf("the expired pause delivered again: %v", err)
	}
	r := lastRefusal(t, b, role)
	if r == nil || r.Verb != "pause" || r.ID != m.ID() || !strings.Contains(r.Reason, "ended at its time-out") || !strings.Contains(r.Reason, "before it was answered") {
		t.Fatalf("the expired pause delivered again: refusal %+v; want one naming %s, saying it expired before it was answered", r, m.ID())
	}

	// Answered, then expired: delivered again, it is not refused.
	answered := storedControl(t, b, &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 1, AtMs: time.Now().UnixMilli(), Nonce: "answered"})
	if err := s.handle(ctx, answered); err != nil {
		t.Fatal(err)
	}
	st, _, _, err = bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
	if err != nil || !st.Paused || st.PauseID != answered.ID() || st.Answered != st.Epoch {
		t.Fatalf("role state %+v (%v): want it paused by %s, answered", st, err, answered.ID())
	}
	s.Now = func() time.Time { return time.Now().Add(2 * time.Second) }
	if x, err := s.expirePause(ctx, st); err != nil || x == nil {
		t.Fatalf("the answered pause past its time-out: expiry %+v (%v); want it ended", x, err)
	}
	answered.Delivered = 2
	if err := s.handle(ctx, answered); err != nil {
		t.Fatalf("the answered pause delivered again after it expired: %v", err)
	}
	if r := lastRefusal(t, b, role); r != nil && r.ID == answered.ID() {
		t.Errorf("an answered pause delivered again after it expired was refused: %+v", r)
	}
}

// TestAPauseThatCannotBeAnsweredIsAnswered: a pause recorded whose answer
// failed (here a gateway's presence notice cannot be read, so the gateways
// to wait for are not known) through the last delivery was given up
// without a word: its trainer waited to its time-out and 30 s more, and
// the role stayed paused to the pause's deadline. Now the delivery that
// gives it up lifts the pause (the role works again) and refuses it,
// naming the error; a delivery before it leaves it to the next.
func TestAPauseThatCannotBeAnsweredIsAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	gw := bustest.Bus(t, url, "gw")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	if _, err := gw.JS.Publish(ctx, subject.Presence(role, "gw-1"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	m := storedControl(t, b, &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: time.Now().UnixMilli(), Nonce: "unanswerable"})
	if err := s.handle(ctx, m); err == nil {
		t.Fatal("a pause whose gateways cannot be read was answered")
	}
	if r := lastRefusal(t, b, role); r != nil {
		t.Fatalf("a pause refused before its last delivery: %+v", r)
	}
	st, _, _, err := bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
	if err != nil || !st.Paused || st.PauseID != m.ID() {
		t.Fatalf("role state %+v (%v): want it paused by %s", st, err, m.ID())
	}

	m.Delivered = maxDeliveries
	if err := s.handle(ctx, m); err == nil {
		t.Fatal("the last delivery of a pause whose gateways cannot be read: no error")
	}
	r := lastRefusal(t, b, role)
	if r == nil || r.Verb != "pause" || r.ID != m.ID() || !strings.Contains(r.Reason, "could not be answered") ||
		!strings.Contains(r.Reason, "presence") || !strings.Contains(r.Reason, "it is lifted: the role works again") {
		t.Fatalf("the pause given up: refusal %+v; want one naming %s, the error, and that the pause is lifted", r, m.ID())
	}
	after, _, _, err := bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
	if err != nil || after.Paused || after.Epoch != st.Epoch+1 {
		t.Fatalf("role state after the pause was given up: %+v (%v); want it not paused, at epoch %d", after, err, st.Epoch+1)
	}
}

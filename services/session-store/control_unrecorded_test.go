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

// storedControl publishes m (a pause or a resume) on its role's trainer stream
// and returns it as the session-store's consumer delivers it the first time.
func storedControl(t *testing.T, b *bus.Bus, m schema.Message) bus.Msg {
	t.Helper()
	ctx := context.Background()
	if err := b.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	role := m.Meta().Role
	stored, err := b.LastMsg(ctx, bus.StreamTrainer(role), m.Subject())
	if err != nil || stored == nil {
		t.Fatalf("%s is not stored: %v", m.Subject(), err)
	}
	return bus.Msg{Subject: stored.Subject, Header: stored.Header, Data: stored.Data, Seq: stored.Seq, Time: stored.Time, Delivered: 1}
}

// lastRefusal is the last refusal on role's control.<role>.refused, or nil.
func lastRefusal(t *testing.T, b *bus.Bus, role string) *schema.Refused {
	t.Helper()
	m, err := b.LastMsg(context.Background(), bus.StreamControl, subject.Control(role, "refused"))
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return nil
	}
	var r schema.Refused
	if err := schema.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestAPauseOrResumeNotRecordedIsAnswered: a pause or a resume that could
// not be recorded in its role's state (here the state holds a value no
// planact wrote, an error no try mends) was given up without a word, and
// its trainer waited for an answer that never came (the pause's time-out
// and 30 s more, 2 minutes for a resume), though every pause and resume is
// answered. Now the delivery that gives it up refuses it on
// control.<role>.refused, naming it and the error; an arrival or a cancel
// given up is answered the same way.
func TestAPauseOrResumeNotRecordedIsAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	if _, err := b.Sessions.Put(ctx, schema.RoleKey(role), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		verb string
		msg  schema.Message
	}{
		{"pause", &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: time.Now().UnixMilli(), Nonce: "unrecorded"}},
		{"resume", &schema.Resume{Role: role, WeightVersion: "step-3", AtMs: time.Now().UnixMilli(), Nonce: "unrecorded"}},
	} {
		m := storedControl(t, b, c.msg)
		if err := s.handle(ctx, m); err == nil {
			t.Errorf("a %s whose role state does not read was handled", c.verb)
		}
		r := lastRefusal(t, b, role)
		if r == nil || r.Verb != c.verb || r.ID != m.ID() || !strings.Contains(r.Reason, "could not be recorded") || !strings.Contains(r.Reason, schema.RoleKey(role)) {
			t.Errorf("the %s not recorded: refusal %+v; want one naming %s, that it could not be recorded, and the key at fault", c.verb, r, m.ID())
		}
	}
}

// TestAPauseReasonTooLongIsRefused: a pause's reason is repeated on
// CONTROL when the pause expires (control.<role>.expired, and the work it
// held fails with it), and CONTROL takes small messages only. A pause with
// a reason of 100 KiB (the trainer's stream takes a megabyte) was applied,
// and at its time-out the expiry could never be said: the sweep tried to
// publish it every 2 s for good. Now it is refused, naming the field and
// its size, and the role is not paused; a reason of 1 KiB is taken.
func TestAPauseReasonTooLongIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	long := storedControl(t, b, &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 1, Reason: strings.Repeat("x", 100<<10),
		AtMs: time.Now().UnixMilli(), Nonce: "long"})
	if err := s.handle(ctx, long); err != nil {
		t.Fatalf("a pause with a reason of 100 KiB: %v; want it refused", err)
	}
	r := lastRefusal(t, b, role)
	if r == nil || r.ID != long.ID() || !strings.Contains(r.Reason, "reason of 102400 bytes: want at most 1024") {
		t.Errorf("a pause with a reason of 100 KiB: refusal %+v; want one naming %s and the reason's size", r, long.ID())
	}
	st, _, _, err := bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
	if err != nil || st.Paused {
		t.Fatalf("role paused %v by %s (%v) after the pause was refused: want the role not paused", st.Paused, st.PauseID, err)
	}

	// A reason that fits is taken: no gateway runs, so it is answered at
	// once, and at its time-out the expiry is said.
	fits := storedControl(t, b, &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 1, Reason: strings.Repeat("y", 1<<10),
		AtMs: time.Now().UnixMilli(), Nonce: "fits"})
	if err := s.handle(ctx, fits); err != nil {
		t.Fatalf("a pause with a reason of 1 KiB: %v", err)
	}
	st, _, _, err = bus.GetFresh[schema.RoleState](ctx, b.Sessions, schema.RoleKey(role))
	if err != nil || !st.Paused || st.PauseID != fits.ID() {
		t.Fatalf("role paused %v by %s (%v): want the role paused by %s", st.Paused, st.PauseID, err, fits.ID())
	}
	s.Now = func() time.Time { return time.Now().Add(2 * time.Second) } // past its time-out, as the sweep finds it
	if x, err := s.expirePause(ctx, st); err != nil || x == nil {
		t.Fatalf("the pause past its time-out: expiry %+v (%v); want it ended and said", x, err)
	}
	m, err := b.LastMsg(ctx, bus.StreamControl, subject.Control(role, "expired"))
	var said schema.PauseExpired
	if err != nil || m == nil || m.Decode(&said) != nil || said.PauseID != fits.ID() {
		t.Errorf("control.%s.expired: %+v (%v); want the expiry of %s", role, said, err, fits.ID())
	}
}

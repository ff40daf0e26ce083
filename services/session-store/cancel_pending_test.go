package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestACancelWaitsForAnArrivalSentAgainAfterIt: a cancel handled before
// the arrival stored ahead of it was recorded waits for that arrival. It
// looked only at the last arrival on each role's subject: when the role
// sent its arrival again after the cancel (or the other role did), the one
// before the cancel was missed, the cancel was answered that the rollout
// is not known, and the rollout then ran, uncancelled. Now every arrival
// stored before the cancel counts.
func TestACancelWaitsForAnArrivalSentAgainAfterIt(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	actor := func(n int64, nonce string) *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"},
			AtMs: time.Now().UnixMilli(), Nonce: nonce}
	}
	for _, c := range []struct {
		name string
		n    int64
		by   string // the role that cancels
	}{
		{"its own role's arrival", 151, schema.RoleActor},
		{"the other role's arrival", 152, schema.RolePlanner},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := delivered(t, b, actor(c.n, "first"))
			cm := cancelOf(t, b, c.n, c.by)
			_ = delivered(t, b, actor(c.n, "again")) // sent again, after the cancel
			if err := s.handle(ctx, cm); err == nil || !fail.IsRetryable(err) {
				t.Fatalf("a cancel handled before the arrival stored ahead of it (%s): %v; want an error that may pass", first.ID(), err)
			}
			if said := lastStatus(t, b, c.n); said.Event != "" {
				t.Fatalf("a cancel handled before the arrival stored ahead of it was answered: %+v", said)
			}
			if err := s.handle(ctx, first); err != nil {
				t.Fatal(err)
			}
			cm.Delivered = 2
			if err := s.handle(ctx, cm); err != nil {
				t.Fatalf("the cancel, once the arrival is recorded: %v", err)
			}
			if said := lastStatus(t, b, c.n); said.Event != "cancelled" {
				t.Fatalf("answer to the cancel: %+v; want cancelled", said)
			}
			sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(c.n))
			if err != nil || sess.State != schema.SessionAborted {
				t.Fatalf("the rollout after the cancel: %s, %v; want aborted", sess.State, err)
			}
		})
	}

	// Of two arrivals before the cancel, the later refused: the earlier
	// one still starts the rollout.
	const n = 153
	pending := delivered(t, b, actor(n, "good"))
	bad := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RoleActor, AtMs: time.Now().UnixMilli(), Nonce: "bad"})
	if err := s.handle(ctx, bad); err != nil {
		t.Fatal(err)
	}
	cm := cancelOf(t, b, n, schema.RoleActor)
	if err := s.handle(ctx, cm); err == nil || !fail.IsRetryable(err) {
		t.Fatalf("a cancel after a pending arrival (%s) and a refused one: %v; want an error that may pass", pending.ID(), err)
	}
}

// TestACancelReasonTooLongIsRefused: a cancel's reason is repeated in the
// session, in each role's result and in every answer that the rollout had
// ended, whose message id holds it. A reason of 100 KiB was taken as it
// came, and repeated everywhere. Now it is refused, as a pause's is,
// naming the field and its size, and the rollout goes on; a reason of
// 1 KiB is taken.
func TestACancelReasonTooLongIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 154
	arrival := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: time.Now().UnixMilli()})
	if err := s.handle(ctx, arrival); err != nil {
		t.Fatal(err)
	}
	cancelWith := func(reason, nonce string) bus.Msg {
		t.Helper()
		if err := b.Publish(ctx, &schema.Cancel{Rollout: n, Role: schema.RoleActor, Reason: reason, AtMs: time.Now().UnixMilli(), Nonce: nonce}); err != nil {
			t.Fatal(err)
		}
		m, err := b.LastMsg(ctx, bus.StreamTrainer(schema.RoleActor), subject.Cancel(n, schema.RoleActor))
		if err != nil || m == nil {
			t.Fatalf("the cancel is not stored: %v", err)
		}
		return bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Time: m.Time, Delivered: 1}
	}
	long := cancelWith(strings.Repeat("x", 100<<10), "long")
	if err := s.handle(ctx, long); err != nil {
		t.Fatalf("a cancel with a reason of 100 KiB: %v; want it refused", err)
	}
	said := lastStatus(t, b, n)
	if said.CancelID != long.ID() || said.CancelOutcome != schema.CancelRefused || !strings.Contains(said.Detail, "reason of 102400 bytes: want at most 1024") {
		t.Errorf("answer to a cancel with a reason of 100 KiB: %+v; want refused, naming the reason's size", said)
	}
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil || sess.State != schema.SessionWaiting {
		t.Fatalf("the rollout after a refused cancel: %s (%q), %v; want it waiting still", sess.State, clipTo(sess.Reason, 80), err)
	}

	fits := cancelWith(strings.Repeat("y", 1<<10), "fits")
	if err := s.handle(ctx, fits); err != nil {
		t.Fatalf("a cancel with a reason of 1 KiB: %v", err)
	}
	if said := lastStatus(t, b, n); said.CancelID != fits.ID() || said.CancelOutcome != schema.CancelAborted {
		t.Errorf("answer to a cancel with a reason of 1 KiB: %+v; want aborted", said)
	}
}

package sessionstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestArrivalsInOneMillisecondAreEachAnswered: an arrival refused and its
// correction, stamped in the same millisecond, each with its own nonce, are
// two messages on the trainer's stream; the refusal names the first, and
// the session records the second. An arrival with an id of the old form
// (no nonce, from a client before nonces) is answered by that id.
func TestArrivalsInOneMillisecondAreEachAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	at := s.nowMs()
	arrival := func(n int64, nonce string, temperature float64) *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: at, Nonce: nonce,
			Sampling: &schema.Sampling{Temperature: schema.Float(temperature)}}
	}
	handle := func(a *schema.Arrive) {
		t.Helper()
		m := delivered(t, b, a)
		if m.ID() != a.MsgID() {
			t.Fatalf("%s stored as %s: taken for a copy of an earlier arrival", a.MsgID(), m.ID())
		}
		if err := s.handle(ctx, m); err != nil {
			t.Fatalf("%s: %v", m.ID(), err)
		}
	}
	refusal := func(n int64) schema.Result {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, role))
		if err != nil || m == nil {
			t.Fatalf("no refusal on %s (%v)", subject.Rejected(n, role), err)
		}
		var r schema.Result
		if err := m.Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}

	const n = 180
	bad, good := arrival(n, "0f0f0f0f0f0f0f0f", 170), arrival(n, "1e1e1e1e1e1e1e1e", 0.7)
	handle(bad)
	if r := refusal(n); r.ArrivalID != bad.MsgID() {
		t.Errorf("the refusal names %q; want the bad arrival, %s", r.ArrivalID, bad.MsgID())
	}
	handle(good)
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if got := sess.Roles[role].ArrivalID; got != good.MsgID() {
		t.Errorf("the session records the %s's arrival %q; want the correction, %s", role, got, good.MsgID())
	}

	old := arrival(n+1, "", 170) // a client before nonces
	handle(old)
	if r := refusal(n + 1); r.ArrivalID != old.MsgID() || r.ArrivalID != "arrive.181.actor.."+strconv.FormatInt(at, 10) {
		t.Errorf("the refusal names %q; want the old-form id, %s", r.ArrivalID, old.MsgID())
	}
}

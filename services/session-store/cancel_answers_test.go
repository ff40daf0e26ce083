package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestEveryCancelAnswerNamesItsCancel: every answer to a cancel names it,
// in cancel_id, in cancel_outcome what became of it, and at the head of
// its detail ("cancel <id> by the <role> trainer: "), and is stored on the
// cancel's own answer subject too, where its trainer reads it when it
// missed it on the status subject. A cancel the session-store could not
// read, or whose subject and body disagree, used to be answered with the
// error alone: its trainer did not know the answer for its own and waited
// its whole patience.
func TestEveryCancelAnswerNamesItsCancel(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	seq := uint64(0)
	// msg is a cancel as a hand-written trainer sends it: body and
	// headers as given, delivered from the trainer's stream.
	msg := func(subj, id string, body []byte) bus.Msg {
		seq++
		h := nats.Header{jetstream.MsgIDHeader: {id}, schema.HdrContentType: {schema.ContentTypeJSON}}
		return bus.Msg{Subject: subj, Data: body, Header: h, Seq: seq, Delivered: 1}
	}
	stored := func(n int64, id string) schema.Status {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.CancelAnswer(n, role, id))
		if err != nil || m == nil {
			t.Fatalf("no answer on %s (%v)", subject.CancelAnswer(n, role, id), err)
		}
		var st schema.Status
		if err := m.Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	for _, c := range []struct {
		what    string
		m       bus.Msg
		outcome string
		says    string
	}{
		{"a cancel that cannot be read", msg(subject.Cancel(175, role), "cancel.175.actor.1.0f0f0f0f0f0f0f0f", []byte(`{"schema": "rollout.cancel/1", "rollout": "175"`)),
			schema.CancelRefused, ""},
		{"a cancel whose body names another rollout", msg(subject.Cancel(176, role), "cancel.176.actor.1.1e1e1e1e1e1e1e1e",
			[]byte(`{"schema": "rollout.cancel/1", "rollout": 177, "role": "actor", "at_ms": 1}`)), schema.CancelRefused, "cancel refused: "},
		{"a cancel of a rollout not known", msg(subject.Cancel(178, role), "cancel.178.actor.1",
			[]byte(`{"schema": "rollout.cancel/1", "rollout": 178, "role": "actor", "at_ms": 1}`)), schema.CancelNothingToAbort, "rollout 178 is not known"},
	} {
		p, err := subject.Parse(c.m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		n := p.Rollout
		if err := s.handle(ctx, c.m); err != nil && c.outcome != schema.CancelRefused {
			t.Fatalf("%s: %v", c.what, err)
		}
		id := c.m.ID()
		mine := "cancel " + id + " by the actor trainer: " + c.says
		for where, st := range map[string]schema.Status{"the status subject": lastStatus(t, b, n), "its answer subject": stored(n, id)} {
			if st.Event != "rejected" || st.CancelID != id || st.CancelOutcome != c.outcome || !strings.HasPrefix(st.Detail, mine) {
				t.Errorf("%s: answered on %s %s %q (cancel_id %q, %q); want rejected %s, naming %s, starting %q",
					c.what, where, st.Event, st.Detail, st.CancelID, st.CancelOutcome, c.outcome, id, mine)
			}
		}
	}

	// A cancel given up (its session does not read) and one that aborts.
	const k = 179
	arrival := delivered(t, b, &schema.Arrive{Rollout: k, Role: role, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: at})
	if err := s.handle(ctx, arrival); err != nil {
		t.Fatal(err)
	}
	ok := cancelOf(t, b, k, role)
	if err := s.handle(ctx, ok); err != nil {
		t.Fatal(err)
	}
	for where, st := range map[string]schema.Status{"the status subject": lastStatus(t, b, k), "its answer subject": stored(k, ok.ID())} {
		if st.Event != "cancelled" || st.CancelID != ok.ID() || st.CancelOutcome != schema.CancelAborted {
			t.Errorf("the cancel that aborts rollout %d: answered on %s %+v; want cancelled, naming %s, aborted", k, where, st, ok.ID())
		}
	}
	const g = 180
	_ = delivered(t, b, &schema.Arrive{Rollout: g, Role: role, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: at})
	given := cancelOf(t, b, g, role)
	given.Delivered = maxDeliveries
	if err := s.handle(ctx, given); err == nil {
		t.Fatal("a cancel given up before its arrival was recorded: no error")
	}
	for where, st := range map[string]schema.Status{"the status subject": lastStatus(t, b, g), "its answer subject": stored(g, given.ID())} {
		if st.Event != "rejected" || st.CancelID != given.ID() || st.CancelOutcome != schema.CancelNotRecorded || !strings.Contains(st.Detail, "could not be recorded") {
			t.Errorf("the cancel given up: answered on %s %+v; want rejected, naming %s, not-recorded", where, st, given.ID())
		}
	}
}

package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAnOverLongArrivalOrCancelIDIsRefused: an arrival's or a cancel's
// Nats-Msg-Id, chosen by its trainer, is held to schema.MaxControlID as a
// pause's is. One longer was copied into the session, the refusal and the
// cancel's answer (its id, subject and detail); now the message is
// refused, named seq:<n>, and nothing repeats its id.
func TestAnOverLongArrivalOrCancelIDIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, role = 190, schema.RolePlanner
	long := strings.Repeat("x", 16<<10)
	a := &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://planner:30000"}, AtMs: s.nowMs(), Nonce: long}
	m := delivered(t, b, a)
	if err := s.handle(ctx, m); err != nil {
		t.Fatalf("arrival: %v", err)
	}
	rm, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, role))
	if err != nil || rm == nil {
		t.Fatalf("the arrival is not refused: no message on %s (%v)", subject.Rejected(n, role), err)
	}
	var r schema.Result
	if err := rm.Decode(&r); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("seq:%d", m.Seq); r.ArrivalID != want || !strings.Contains(r.Reason, "Nats-Msg-Id") || len(r.Reason) > 1024 {
		t.Errorf("the refusal names %.40q, says %.300q; want %s, naming the Nats-Msg-Id, briefly", r.ArrivalID, r.Reason, want)
	}
	if _, _, found, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n)); err != nil || found {
		t.Errorf("a session was written for the refused arrival (found %v, %v)", found, err)
	}

	c := &schema.Cancel{Rollout: n, Role: role, AtMs: s.nowMs(), Nonce: long}
	msg, err := bus.NewMsg(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := b.JS.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bus.ReadBatch(ctx, b.NC, bus.StreamTrainer(role), subject.Cancel(n, role), ack.Sequence, 1)
	if err != nil || len(got.Msgs) != 1 {
		t.Fatalf("the cancel is not stored: %v", err)
	}
	sm := got.Msgs[0]
	if err := s.handle(ctx, bus.Msg{Subject: sm.Subject, Header: sm.Header, Data: sm.Data, Seq: sm.Seq, Delivered: 1}); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	st := lastStatus(t, b, n)
	if want := fmt.Sprintf("seq:%d", sm.Seq); st.Event != "rejected" || st.CancelID != want || !strings.Contains(st.Detail, "Nats-Msg-Id") || len(st.Detail) > 1024 {
		t.Errorf("the cancel is answered %s, as %.40q: %.300q; want rejected, as %s, naming the Nats-Msg-Id, briefly", st.Event, st.CancelID, st.Detail, want)
	}
}

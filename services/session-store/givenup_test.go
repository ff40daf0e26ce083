package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestRequestsGivenUpAreAnswered: an arrival or a cancel that cannot be
// recorded was given up in silence, after the consumer's last delivery
// (an error that may pass: the rollout's tasks do not read) or at once (an
// error that cannot: its session does not read), and its trainer waited for
// an answer that never came. Now the delivery that gives it up answers,
// naming the error: the arrival on its rejection subject, the cancel on
// the rollout's status subject. Earlier deliveries answer nothing: they
// may still succeed.
func TestRequestsGivenUpAreAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// An arrival that completes the barrier, when the tasks do not read.
	const n = 131
	if err := s.handle(ctx, delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}})); err != nil {
		t.Fatal(err)
	}
	read := loadTaskList
	loadTaskList = func(context.Context, *bus.Bucket, *nats.Conn, int64) (schema.TaskList, bool, error) {
		return schema.TaskList{}, false, fail.Transientf("tasks: JetStream did not answer")
	}
	defer func() { loadTaskList = read }()
	arrival := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}})
	rejection := func() *schema.Result {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, schema.RoleActor))
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			return nil
		}
		var r schema.Result
		if err := schema.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	for _, d := range []uint64{1, maxDeliveries - 1} {
		arrival.Delivered = d
		if err := s.handle(ctx, arrival); err == nil || !fail.IsRetryable(err) {
			t.Fatalf("delivery %d of an arrival whose tasks do not read: %v; want an error that may pass", d, err)
		}
		if r := rejection(); r != nil {
			t.Fatalf("rejected at delivery %d: %q", d, r.Reason)
		}
	}
	arrival.Delivered = maxDeliveries
	if err := s.handle(ctx, arrival); err == nil {
		t.Fatal("an arrival whose tasks do not read was handled")
	}
	if r := rejection(); r == nil || r.ArrivalID != arrival.ID() || !strings.Contains(r.Reason, "could not be recorded") || !strings.Contains(r.Reason, "JetStream did not answer") {
		t.Errorf("rejection after the last delivery: %+v; want one naming the arrival and the error", r)
	}

	// A cancel of a rollout whose session does not read.
	const m = 132
	if _, err := b.Sessions.Put(ctx, schema.SessionKey(m), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, &schema.Cancel{Rollout: m, Role: schema.RoleActor, AtMs: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	stored, err := b.LastMsg(ctx, bus.StreamTrainer(schema.RoleActor), subject.Cancel(m, schema.RoleActor))
	if err != nil || stored == nil {
		t.Fatalf("the cancel is not stored: %v", err)
	}
	c := bus.Msg{Subject: stored.Subject, Header: stored.Header, Data: stored.Data, Seq: stored.Seq, Delivered: 1}
	if err := s.handle(ctx, c); err == nil || fail.IsRetryable(err) {
		t.Fatalf("a cancel whose session does not read: %v; want an error that cannot pass", err)
	}
	st, err := b.LastMsg(ctx, bus.StreamRollout, subject.Status(m))
	if err != nil {
		t.Fatal(err)
	}
	var said schema.Status
	if st != nil {
		if err := schema.Unmarshal(st.Data, &said); err != nil {
			t.Fatal(err)
		}
	}
	mine := fmt.Sprintf("cancel %s by the actor trainer: ", c.ID())
	if said.Event != "rejected" || !strings.HasPrefix(said.Detail, mine) || !strings.Contains(said.Detail, "could not be recorded") || !strings.Contains(said.Detail, "msgpack") {
		t.Errorf("answer to the cancel given up: %+v; want rejected, starting %q and naming the error", said, mine)
	}
}

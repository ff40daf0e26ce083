package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// answerCancel answers the cancel m as the session-store does: on the
// rollout's status subject, and as the last message of the cancel's own
// answer subject.
func answerCancel(ctx context.Context, b *bus.Bus, m jetstream.Msg, event, outcome, why string) error {
	id := m.Headers().Get(jetstream.MsgIDHeader)
	p, err := subject.Parse(m.Subject())
	if err != nil {
		return err
	}
	st := &schema.Status{Rollout: p.Rollout, Event: event, Episode: -1, CancelID: id, CancelOutcome: outcome,
		Detail: fmt.Sprintf("cancel %s by the %s trainer: %s", id, p.Role, why)}
	if err := b.Publish(ctx, st); err != nil {
		return err
	}
	msg, err := bus.NewMsg(ctx, st)
	if err != nil {
		return err
	}
	msg.Subject = subject.CancelAnswer(p.Rollout, p.Role, id)
	msg.Header.Set(jetstream.MsgIDHeader, "answer."+st.MsgID())
	_, err = b.JS.PublishMsg(ctx, msg)
	return err
}

// TestACancelsAnswerMissedIsReadFromTheStream: planact answers a cancel
// while the trainer's connection is down (a NATS restart, a partition).
// Cancel only listened for the answer, never read it again, and waited
// its whole patience, saying planact's session-store may not be running;
// it reads the answer from the stream, as Result and Pause do.
func TestACancelsAnswerMissedIsReadFromTheStream(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact") // stands in for the session-store
	proxy := bustest.StartProxy(t, url)
	nc, err := bustest.Connect(proxy.URL, nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 50 * time.Millisecond
	// Bounds the test on the old code, which waited for the answer.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const n, role = 173, schema.RoleActor

	for _, a := range []struct {
		event, outcome, why string
		want                func(error) bool
	}{
		{"cancelled", schema.CancelAborted, "rollout 173 aborted", func(err error) bool { return err == nil }},
		{"rejected", schema.CancelNothingToAbort, "rollout 173 had already ended (aborted at 2026-01-01T00:00:00Z); nothing to abort",
			func(err error) bool {
				return errors.Is(err, client.ErrNothingToCancel) && strings.Contains(err.Error(), "had already ended")
			}},
	} {
		// The trainer's connection is down while the answer goes out.
		cons, err := b.JS.OrderedConsumer(ctx, bus.StreamTrainer(role), jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{subject.Cancel(n, role)}, DeliverPolicy: jetstream.DeliverNewPolicy})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 1)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			proxy.Cut()
			defer proxy.Restore()
			errs <- answerCancel(ctx, b, m, a.event, a.outcome, a.why)
		})
		if err != nil {
			t.Fatal(err)
		}
		got := c.Cancel(ctx, n, role, "enough")
		cc.Stop()
		select {
		case err := <-errs:
			if err != nil {
				t.Fatalf("the stand-in could not answer: %v", err)
			}
		default:
			t.Fatalf("the cancel was not stored: %v", got)
		}
		if !a.want(got) {
			t.Errorf("cancel answered %s (%s), missed on the subscription: %v", a.event, a.outcome, got)
		}
	}
}

// TestCancelNoticesAClosedConnection: a connection closed while Cancel
// waits for planact's answer can bring none. Cancel waited until its
// patience ran out and said planact's session-store may not be running;
// it says the connection closed.
func TestCancelNoticesAClosedConnection(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "provision")
	nc := bustest.Conn(t, url)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 50 * time.Millisecond
	const n, role = 174, schema.RoleActor
	// Cancel reads its answer from the stream only once the cancel is
	// stored: the connection closes then, while it waits.
	watch := bustest.Conn(t, url)
	sub, err := watch.Subscribe("$JS.API.DIRECT.GET.ROLLOUT.rollout.174.result.actor.cancel.*", func(*nats.Msg) { nc.Close() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	// Bounds the test on the old code, which waited for the answer.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = c.Cancel(ctx, n, role, "enough")
	if !errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancel over a connection closed while it waits: %v; want it to say the connection closed", err)
	}
}

// TestCancelKnowsItsAnswerByItsID: planact's answer names the cancel in
// cancel_id and says what became of it in cancel_outcome; Cancel goes by
// those, not by the detail's words: a cancel planact could not read is
// ErrRefused, one it could not record says so, however the detail reads.
// An answer to another cancel is passed over.
func TestCancelKnowsItsAnswerByItsID(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const role = schema.RoleActor
	for n, a := range map[int64]struct {
		outcome string
		want    func(error) bool
	}{
		181: {schema.CancelRefused, func(err error) bool {
			return errors.Is(err, client.ErrRefused) && strings.Contains(err.Error(), "a reason")
		}},
		182: {schema.CancelNotRecorded, func(err error) bool {
			return err != nil && !errors.Is(err, client.ErrNothingToCancel) && strings.Contains(err.Error(), "not done")
		}},
		183: {schema.CancelNothingToAbort, func(err error) bool { return errors.Is(err, client.ErrNothingToCancel) }},
		184: {schema.CancelAborted, func(err error) bool { return err == nil }},
	} {
		errs := standIn(t, b, role, []string{subject.Cancel(n, role)}, func(m jetstream.Msg, _ uint64) schema.Message {
			id := m.Headers().Get(jetstream.MsgIDHeader)
			// Another cancel's answer first: its words would do for this one.
			other := &schema.Status{Rollout: n, Event: "cancelled", Episode: -1, CancelID: id + "-other", CancelOutcome: schema.CancelAborted,
				Detail: fmt.Sprintf("cancel %s by the %s trainer: rollout %d aborted", id, role, n)}
			if err := b.Publish(ctx, other); err != nil {
				t.Error(err)
			}
			event := "rejected"
			if a.outcome == schema.CancelAborted {
				event = "cancelled"
			}
			return &schema.Status{Rollout: n, Event: event, Episode: -1, CancelID: id, CancelOutcome: a.outcome, Detail: "a reason"}
		})
		err := c.Cancel(ctx, n, role, "enough")
		select {
		case err := <-errs:
			t.Fatalf("the stand-in could not answer: %v", err)
		default:
		}
		if !a.want(err) {
			t.Errorf("cancel answered %s: %v", a.outcome, err)
		}
	}
}

// TestCancelAnswerSubject: the subject of a cancel's stored answer is
// what every client computes (the Node and Python ones too): the first 32
// hex digits of the SHA-256 of the cancel's Nats-Msg-Id.
func TestCancelAnswerSubject(t *testing.T) {
	if got, want := subject.CancelAnswer(5, schema.RoleActor, "cancel.5.actor.1"), "rollout.5.result.actor.cancel.ff55fd3d8e12ce392dbad1acff06967d"; got != want {
		t.Errorf("CancelAnswer: %s; want %s", got, want)
	}
}

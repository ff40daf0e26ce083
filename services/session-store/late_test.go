package sessionstore

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// delivered publishes the arrival a and returns it as the session-store's
// consumer delivers it the first time.
func delivered(t *testing.T, b *bus.Bus, a *schema.Arrive) bus.Msg {
	t.Helper()
	ctx := context.Background()
	if err := b.Publish(ctx, a); err != nil {
		t.Fatal(err)
	}
	m, err := b.LastMsg(ctx, bus.StreamTrainer(a.Role), subject.Arrive(a.Rollout, a.Role))
	if err != nil || m == nil {
		t.Fatalf("the %s arrival is not stored: %v", a.Role, err)
	}
	return bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Delivered: 1}
}

// TestALateAnswerIsNotALaterRolloutsResult: a role that arrives after its
// rollout timed out waiting for it is told so on its result subject. That
// answer named no arrival and was published after the session's last
// write, so it could outlive the session; a new training run that used the
// rollout number again then found it where its result goes: the
// session-store took it for the result it had published, published
// nothing, and gave its status to the new rollout (a result with the
// answer's message id would have been dropped as its duplicate anyway),
// and the trainer took it as its result. Now the answer names the late
// arrival, the session records it after the answer, and a result found on
// the subject counts only if it answers the session's arrival.
func TestALateAnswerIsNotALaterRolloutsResult(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	now := time.Now()
	s.Now = func() time.Time { return now }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 81
	planner := func() *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}, AtMs: now.UnixMilli()}
	}
	actor := func() *schema.Arrive {
		return &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: now.UnixMilli()}
	}
	first := planner()
	first.Tasks, first.Config = []schema.Task{{Prompt: "q", Label: "a"}}, &schema.Config{BarrierTimeoutS: 1}
	if err := s.handle(ctx, delivered(t, b, first)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Second)
	if err := s.timeOut(ctx, n, schema.TimeoutBarrier); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	late := delivered(t, b, actor())
	// The order of the answer and of the session's writes, as the server
	// handed them on: one channel gets both subjects in the order they
	// came (not the stored timestamps, which a clock stepped back between
	// the two writes would put out of order).
	seen := make(chan *nats.Msg, 64)
	nc := bustest.Conn(t, url)
	for _, subj := range []string{subject.Result(n, schema.RoleActor), "$KV." + bus.BucketSession + "." + schema.SessionKey(n)} {
		if _, err := nc.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.handle(ctx, late); err != nil {
		t.Fatal(err)
	}
	r := resultOf(t, s, n, schema.RoleActor)
	if r == nil || r.Status != schema.ResultTimeout || r.ArrivalID != late.ID() || r.Stats.FinishedMs == 0 {
		t.Fatalf("answer to the late actor: %+v; want a timeout naming arrival %s and when the rollout ended", r, late.ID())
	}
	entry, err := b.Sessions.Get(ctx, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	var sess schema.Session
	if err := schema.Unmarshal(entry.Value(), &sess); err != nil {
		t.Fatal(err)
	}
	// The answer must come before the session's last write, the entry
	// read above.
	var order []string
	for last := false; !last; {
		select {
		case m := <-seen:
			what := "answer"
			if m.Subject != subject.Result(n, schema.RoleActor) {
				what = "session"
				last = bytes.Equal(m.Data, entry.Value())
			}
			order = append(order, what)
		case <-ctx.Done():
			t.Fatalf("the session's last write never came to the subscription (saw %v)", order)
		}
	}
	if sess.Late[schema.RoleActor].ArrivalID != late.ID() || !slices.Contains(order, "answer") {
		t.Errorf("session late arrivals %+v, writes and answer in the order %v: want the late arrival recorded after its answer", sess.Late, order)
	}

	// The history passes: the session goes. The messages stay here (the
	// planner's result, published before the session's last write, would
	// have gone before it), and the actor's subject holds an answer as a
	// session-store before this one left it: after the session's last
	// write, naming no arrival, under the result's own message id.
	if err := b.Sessions.Purge(ctx, schema.SessionKey(n)); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultTimeout,
		Reason: "arrived after the rollout ended: barrier time-out: the other role never arrived"}); err != nil {
		t.Fatal(err)
	}

	// A new training run uses the number again; its rollout ends at once
	// (no tasks), and each role must get its own result.
	now = now.Add(time.Second)
	p, a := delivered(t, b, planner()), delivered(t, b, actor())
	for _, m := range []bus.Msg{p, a} {
		if err := s.handle(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	got, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schema.ResultInvalid || len(got.Outbox) > 0 {
		t.Errorf("new rollout's session: %s (%q), outbox %v; want invalid (no tasks), settled", got.Status, got.Reason, got.Outbox)
	}
	for role, id := range map[string]string{schema.RolePlanner: p.ID(), schema.RoleActor: a.ID()} {
		r := resultOf(t, s, n, role)
		if r == nil || r.ArrivalID != id || r.Status != schema.ResultInvalid {
			t.Errorf("new rollout's %s result: %+v; want invalid, answering arrival %s", role, r, id)
		}
	}
}

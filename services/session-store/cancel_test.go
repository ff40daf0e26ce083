package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestARecordedCancelIsAnsweredThoughItsResultsWait: a cancel that aborted
// its rollout was answered only once the rollout's results were out. When
// they could not be assembled yet (the rollout's tasks did not read), every
// delivery of the cancel failed, and the last one gave it up without a
// word: the rollout was aborted, the sweep published its results later,
// and the trainer that cancelled was told nothing ("no answer from
// planact"). Now the cancel is answered as soon as the abort is recorded,
// and its results follow.
func TestARecordedCancelIsAnsweredThoughItsResultsWait(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n = 141
	now := s.nowMs()
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1, Trace: bus.NewTraceID(),
		Roles:     map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p", ArrivedMs: now}, schema.RoleActor: {ArrivalID: "a", ArrivedMs: now}},
		CreatedMs: now, StartedMs: now}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	// No task list: the results cannot be assembled (an error that may pass).
	if err := b.Publish(ctx, &schema.Cancel{Rollout: n, Role: schema.RoleActor, Reason: "preempted", AtMs: now}); err != nil {
		t.Fatal(err)
	}
	stored, err := b.LastMsg(ctx, bus.StreamTrainer(schema.RoleActor), subject.Cancel(n, schema.RoleActor))
	if err != nil || stored == nil {
		t.Fatalf("the cancel is not stored: %v", err)
	}
	c := bus.Msg{Subject: stored.Subject, Header: stored.Header, Data: stored.Data, Seq: stored.Seq, Delivered: maxDeliveries}
	if err := s.handle(ctx, c); err == nil || !fail.IsRetryable(err) {
		t.Fatalf("a cancel whose results cannot be assembled yet: %v; want the settle's error, which may pass", err)
	}
	mine := fmt.Sprintf("cancel %s by the actor trainer: ", c.ID())
	st, err := b.LastMsg(ctx, bus.StreamRollout, subject.Status(n))
	if err != nil {
		t.Fatal(err)
	}
	var said schema.Status
	if st != nil {
		if err := schema.Unmarshal(st.Data, &said); err != nil {
			t.Fatal(err)
		}
	}
	if said.Event != "cancelled" || !strings.HasPrefix(said.Detail, mine) {
		t.Fatalf("answer to a recorded cancel whose results wait: %+v; want cancelled, starting %q", said, mine)
	}

	// The results follow, from whoever settles next (the sweep).
	tl := &schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "a"}}, From: schema.RolePlanner}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(n), tl); err != nil {
		t.Fatal(err)
	}
	if err := s.settleFresh(ctx, n); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if r := resultOf(t, s, n, role); r == nil || r.Status != schema.ResultAborted || !strings.Contains(r.Reason, "preempted") {
			t.Errorf("%s's result after the cancel: %+v; want aborted, naming the cancel's reason", role, r)
		}
	}
}

// cancelOf publishes the cancel of rollout n by role and returns it as the
// session-store's consumer delivers it the first time.
func cancelOf(t *testing.T, b *bus.Bus, n int64, role string) bus.Msg {
	t.Helper()
	ctx := context.Background()
	if err := b.Publish(ctx, &schema.Cancel{Rollout: n, Role: role, Reason: "preempted", AtMs: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	m, err := b.LastMsg(ctx, bus.StreamTrainer(role), subject.Cancel(n, role))
	if err != nil || m == nil {
		t.Fatalf("the cancel is not stored: %v", err)
	}
	return bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Time: m.Time, Delivered: 1}
}

// lastStatus is the last event on rollout n's status subject that answers
// a cancel (cancelled or rejected); the zero Status when there is none.
func lastStatus(t *testing.T, b *bus.Bus, n int64) schema.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := b.JS.OrderedConsumer(ctx, bus.StreamRollout, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject.Status(n)}})
	if err != nil {
		t.Fatal(err)
	}
	var said schema.Status
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var st schema.Status
			if err := schema.Unmarshal(m.Data(), &st); err != nil {
				t.Fatal(err)
			}
			if st.Event == "cancelled" || st.Event == "rejected" {
				said = st
			}
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
		if got == 0 {
			return said
		}
	}
}

// TestACancelWaitsForItsRolesArrival: a trainer's arrival and its cancel
// right after it are on one stream, in that order, but handled at once; a
// cancel handled before its arrival was recorded found no session and was
// answered that the rollout is not known ("never arrived"), and the
// rollout then waited and ran, uncancelled. Now a cancel whose role's
// arrival is stored before it, and neither recorded nor refused, waits for
// it; one whose arrival was refused is answered at once.
func TestACancelWaitsForItsRolesArrival(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n = 142
	arrival := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}})
	c := cancelOf(t, b, n, schema.RoleActor)
	mine := fmt.Sprintf("cancel %s by the actor trainer: ", c.ID())
	if err := s.handle(ctx, c); err == nil || !fail.IsRetryable(err) {
		t.Fatalf("a cancel handled before its arrival: %v; want an error that may pass", err)
	}
	if said := lastStatus(t, b, n); said.Event != "" {
		t.Fatalf("a cancel handled before its arrival was answered: %+v", said)
	}
	if err := s.handle(ctx, arrival); err != nil {
		t.Fatal(err)
	}
	c.Delivered = 2
	if err := s.handle(ctx, c); err != nil {
		t.Fatalf("the cancel, once its arrival is recorded: %v", err)
	}
	if said := lastStatus(t, b, n); said.Event != "cancelled" || !strings.HasPrefix(said.Detail, mine) {
		t.Fatalf("answer to the cancel: %+v; want cancelled, starting %q", said, mine)
	}
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil || sess.State != schema.SessionAborted {
		t.Fatalf("the rollout after the cancel: %s, %v; want aborted", sess.State, err)
	}

	// So too the other role's arrival, stored before the cancel on its own
	// stream: the planner cancels the rollout the actor's arrival starts.
	const o = 145
	other := delivered(t, b, &schema.Arrive{Rollout: o, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}})
	c = cancelOf(t, b, o, schema.RolePlanner)
	if err := s.handle(ctx, c); err == nil || !fail.IsRetryable(err) {
		t.Fatalf("a planner's cancel handled before the actor's arrival: %v; want an error that may pass", err)
	}
	if err := s.handle(ctx, other); err != nil {
		t.Fatal(err)
	}
	c.Delivered = 2
	if err := s.handle(ctx, c); err != nil {
		t.Fatalf("the planner's cancel, once the actor's arrival is recorded: %v", err)
	}
	if said := lastStatus(t, b, o); said.Event != "cancelled" {
		t.Fatalf("answer to the planner's cancel: %+v; want cancelled", said)
	}

	// An arrival that was refused starts nothing: its cancel is told so at once.
	const m = 143
	refused := delivered(t, b, &schema.Arrive{Rollout: m, Role: schema.RoleActor})
	if err := s.handle(ctx, refused); err != nil {
		t.Fatal(err)
	}
	c = cancelOf(t, b, m, schema.RoleActor)
	if err := s.handle(ctx, c); err != nil {
		t.Fatalf("a cancel after a refused arrival: %v", err)
	}
	if said := lastStatus(t, b, m); said.Event != "rejected" || !strings.Contains(said.Detail, "is not known") {
		t.Fatalf("answer to a cancel after a refused arrival: %+v; want rejected, not known", said)
	}

	// Given up while its arrival is still not recorded, it says so.
	const k = 144
	_ = delivered(t, b, &schema.Arrive{Rollout: k, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}})
	c = cancelOf(t, b, k, schema.RoleActor)
	c.Delivered = maxDeliveries
	if err := s.handle(ctx, c); err == nil {
		t.Fatal("a cancel given up before its arrival was recorded: no error")
	}
	if said := lastStatus(t, b, k); said.Event != "rejected" || !strings.HasPrefix(said.Detail, fmt.Sprintf("cancel %s by the actor trainer: could not be recorded", c.ID())) {
		t.Fatalf("answer to a cancel given up: %+v; want rejected, could not be recorded", said)
	}
}

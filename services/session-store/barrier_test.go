package sessionstore

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestArrivalVersionNotedBeforeTheStart: the weight version an arrival
// brings becomes the role's newest (what staleness is counted from) before
// its rollout starts, even when recording it fails after the arrival was
// written to the session. Here the role's state cannot be read at first:
// the arrival that completes the barrier is written, and nothing starts;
// delivered again once the state reads, it records the version and then
// starts the rollout. (Before, the version was noted by the handler after
// the write, and a delivery that found the arrival written skipped it: the
// rollout started with staleness counted from the older version.)
func TestArrivalVersionNotedBeforeTheStart(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 41
	arrival := func(a *schema.Arrive) bus.Msg {
		t.Helper()
		if err := b.Publish(ctx, a); err != nil {
			t.Fatal(err)
		}
		m, err := b.LastMsg(ctx, bus.StreamTrainer(a.Role), subject.Arrive(n, a.Role))
		if err != nil || m == nil {
			t.Fatalf("the %s arrival is not stored: %v", a.Role, err)
		}
		return bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Delivered: 1}
	}
	planner := arrival(&schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}, WeightVersion: "planner-v7",
		Tasks: []schema.Task{{Prompt: "p", Label: "l"}}})
	actor := arrival(&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}, WeightVersion: "actor-v5"})

	if err := s.handle(ctx, planner); err != nil {
		t.Fatalf("planner arrival: %v", err)
	}
	if v := newest(t, s, schema.RolePlanner); v != "planner-v7" {
		t.Fatalf("planner's newest %q after its arrival, want planner-v7", v)
	}
	// The actor's role state does not read (a value no planact wrote).
	if _, err := b.Sessions.Put(ctx, schema.RoleKey(schema.RoleActor), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	if err := s.handle(ctx, actor); err == nil {
		t.Fatal("the actor's arrival was handled while its role state could not be read")
	}
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil || sess.State != schema.SessionRunning || sess.Roles[schema.RoleActor].WeightVersion != "actor-v5" {
		t.Fatalf("session %+v (%v): want the actor's arrival written, the rollout running", sess, err)
	}
	if m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Start(n)); err != nil || m != nil {
		t.Fatalf("rollout.%d.start published (%v) before the actor's version was recorded", n, err)
	}

	// The state reads again; the arrival is delivered again.
	if err := b.Sessions.Delete(ctx, schema.RoleKey(schema.RoleActor)); err != nil {
		t.Fatal(err)
	}
	actor.Delivered = 2
	if err := s.handle(ctx, actor); err != nil {
		t.Fatalf("actor arrival delivered again: %v", err)
	}
	if v := newest(t, s, schema.RoleActor); v != "actor-v5" {
		t.Errorf("actor's newest %q after its arrival was handled, want actor-v5", v)
	}
	if m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Start(n)); err != nil || m == nil {
		t.Errorf("rollout.%d.start not published after the arrival was handled (%v)", n, err)
	}
	sess, _, _, err = bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil || len(sess.Outbox) != 0 {
		t.Errorf("session outbox %v (%v), want every effect settled", sess.Outbox, err)
	}
}

// newest reads role's newest weight version from its leader.
func newest(t *testing.T, s *Service, role string) string {
	t.Helper()
	st, _, _, err := bus.GetFresh[schema.RoleState](context.Background(), s.Bus.Sessions, schema.RoleKey(role))
	if err != nil {
		t.Fatal(err)
	}
	return st.WeightVersion
}

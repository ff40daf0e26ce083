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

// TestCancelsInOneMillisecondAreEachAnswered: two cancels of a rollout by
// one role in one millisecond, each with its own nonce, are two messages
// on the trainer's stream; the first aborts the rollout and is answered
// so, the second is answered by its own id that the rollout had already
// ended. A cancel with an id of the old form (no
// nonce, from a client before nonces) is answered by that id.
func TestCancelsInOneMillisecondAreEachAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n, role = 152, schema.RoleActor
	now := s.nowMs()
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Episodes: 1, Trace: bus.NewTraceID(),
		Roles:     map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p", ArrivedMs: now}, schema.RoleActor: {ArrivalID: "a", ArrivedMs: now}},
		CreatedMs: now, StartedMs: now}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	tl := &schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "a"}}, From: schema.RolePlanner}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(n), tl); err != nil {
		t.Fatal(err)
	}
	sent := []*schema.Cancel{
		{Rollout: n, Role: role, Reason: "enough", AtMs: now, Nonce: "0f0f0f0f0f0f0f0f"},
		{Rollout: n, Role: role, Reason: "enough", AtMs: now, Nonce: "1e1e1e1e1e1e1e1e"},
		{Rollout: n, Role: role, Reason: "enough", AtMs: now}, // a client before nonces
	}
	// handle publishes c, hands the stored message to the session-store
	// and returns its answer.
	handle := func(c *schema.Cancel) schema.Status {
		t.Helper()
		msg, err := bus.NewMsg(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := b.JS.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		if ack.Duplicate {
			t.Fatalf("%s taken for a copy of an earlier cancel", c.MsgID())
		}
		got, err := bus.ReadBatch(ctx, b.NC, bus.StreamTrainer(role), subject.Cancel(n, role), ack.Sequence, 1)
		if err != nil || len(got.Msgs) != 1 {
			t.Fatalf("%s is not stored: %v", c.MsgID(), err)
		}
		sm := got.Msgs[0]
		m := bus.Msg{Subject: sm.Subject, Header: sm.Header, Data: sm.Data, Seq: sm.Seq, Delivered: 1}
		if m.ID() != c.MsgID() {
			t.Errorf("stored %s as %s", c.MsgID(), m.ID())
		}
		if err := s.handle(ctx, m); err != nil {
			t.Fatalf("%s: %v", m.ID(), err)
		}
		return lastStatus(t, b, n)
	}
	for _, c := range []struct {
		what   string
		cancel *schema.Cancel
		event  string
		says   string
	}{
		{"the first cancel", sent[0], "cancelled", "rollout 152 aborted"},
		{"the second, in the same millisecond", sent[1], "rejected", "rollout 152 had already ended"},
		{"one of the old id form", sent[2], "rejected", "rollout 152 had already ended"},
	} {
		st := handle(c.cancel)
		if mine := "cancel " + c.cancel.MsgID() + " by the actor trainer: " + c.says; st.Event != c.event || !strings.HasPrefix(st.Detail, mine) {
			t.Errorf("%s: answered %s %q; want %s, starting %q", c.what, st.Event, st.Detail, c.event, mine)
		}
	}
}

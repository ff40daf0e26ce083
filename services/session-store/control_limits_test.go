package sessionstore

import (
	"fmt"
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

// controlMsg is a pause or resume of role as a hand-written trainer sends
// it (JSON, with Nats-Msg-Id id), delivered once from its stream at seq.
func controlMsg(role, verb, id string, seq uint64, body string) bus.Msg {
	return bus.Msg{Subject: subject.Control(role, verb), Data: []byte(body), Seq: seq, Delivered: 1,
		Header: nats.Header{jetstream.MsgIDHeader: {id}, schema.HdrContentType: {schema.ContentTypeJSON}}}
}

// lastAnswer decodes the last message on control.<role>.<verb> into v,
// false when there is none.
func lastAnswer(t *testing.T, b *bus.Bus, role, verb string, v schema.Message) bool {
	t.Helper()
	m, err := b.LastMsg(t.Context(), bus.StreamControl, subject.Control(role, verb))
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return false
	}
	if err := schema.Unmarshal(m.Data, v); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestOneTrainerCannotFillControl: the refusals one trainer provokes
// used to land in CONTROL without bound. Both roles' answers share that
// stream, which refuses new messages when full: trainer-planner, sending
// invalid pauses as fast as its own stream takes them (each with a 4 KiB
// id and an unknown field of 8 KiB, repeated in its refusal), filled it, and then the
// actor's pauses could not be answered, nor a gateway say it drained. A
// trainer's answers now push out only its own older ones (a few per
// subject), each small: however many it provokes, the other role's pause
// is answered.
func TestOneTrainerCannotFillControl(t *testing.T) {
	_, url := bustest.Server(t)
	p := bus.Provisioning{Storage: bus.MinStorage} // CONTROL: its smallest
	if err := bus.Provision(t.Context(), bustest.Conn(t, url), bustest.Logger(), p); err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(t.Context(), bus.ConnOptions{URL: url}, "ss", bustest.Logger(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.NC.Close)
	s := newTestService(b)
	ctx := t.Context()
	at := time.Now().UnixMilli()
	limit := p.Bytes(bus.StreamControl)
	// Enough to fill CONTROL twice over, were each kept (a refusal
	// repeats 4 KiB of the unknown field's name at most).
	n := int(2*limit/(4<<10)) + 1
	failed := 0
	for i := range n {
		id := fmt.Sprintf("flood-%06d-%s", i, strings.Repeat("i", 4<<10))
		body := fmt.Sprintf(`{"schema": "control.pause/1", "role": "planner", "%s": 1, "at_ms": %d}`, strings.Repeat("k", 8<<10), at)
		if err := s.handleControl(ctx, controlMsg(schema.RolePlanner, "pause", id, uint64(i+1), body)); err != nil {
			if failed++; failed == 1 {
				t.Errorf("invalid pause %d of the planner's flood: %v; want it answered", i, err)
			}
		}
	}
	// Then small ones, to take what room is left.
	for i := range 200 {
		body := fmt.Sprintf(`{"schema": "control.pause/1", "role": "planner", "timeout_s": -1, "at_ms": %d}`, at)
		if err := s.handleControl(ctx, controlMsg(schema.RolePlanner, "pause", fmt.Sprintf("small-%d", i), uint64(n+i+1), body)); err != nil {
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d refusals could not be published", failed, n+200)
	}
	var r schema.Refused
	if !lastAnswer(t, b, schema.RolePlanner, "refused", &r) || r.ID != "small-199" {
		t.Errorf("the last refusal on control.planner.refused is of %.20q, want the flood's last pause", r.ID)
	}

	// The actor's trainer pauses: answered.
	pause := &schema.Pause{Role: schema.RoleActor, Mode: schema.PauseWait, AtMs: at}
	data, err := schema.Marshal(pause)
	if err != nil {
		t.Fatal(err)
	}
	m := bus.Msg{Subject: pause.Subject(), Data: data, Seq: 1, Delivered: 1, Header: nats.Header{jetstream.MsgIDHeader: {pause.MsgID()}}}
	if err := s.handleControl(ctx, m); err != nil {
		t.Errorf("the actor's pause, after the planner's flood: %v; want it answered", err)
	}
	var paused schema.Paused
	if !lastAnswer(t, b, schema.RoleActor, "paused", &paused) || paused.PauseID != pause.MsgID() {
		t.Errorf("no answer to the actor's pause on control.actor.paused (last: %+v)", paused)
	}
	st, err := b.JS.Stream(ctx, bus.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CONTROL: %d messages, %d of %d bytes", info.State.Msgs, info.State.Bytes, limit)
}

// TestASupersededPauseIsAnswered: the session-store takes up to 32 of a
// trainer's messages at once, so a pause can be handled after a later
// pause or resume of its role was applied. It is not applied then (the
// later one wins), and used to be given up without an answer: a trainer
// that sent two pauses back to back waited on the first until its own
// time-out. It is now refused, saying so; a pause delivered again after it
// was answered is not answered a second time, even after a later pause
// was answered (it used to be refused then, after its own answer).
func TestASupersededPauseIsAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := t.Context()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	body := func(at int64) string {
		return fmt.Sprintf(`{"schema": "control.pause/1", "role": "actor", "mode": "wait", "timeout_s": 60, "at_ms": %d}`, at)
	}
	// The second pause (stream sequence 2) is handled first.
	late := controlMsg(role, "pause", "p-late", 2, body(at+1))
	if err := s.handleControl(ctx, late); err != nil {
		t.Fatal(err)
	}
	var paused schema.Paused
	if !lastAnswer(t, s.Bus, role, "paused", &paused) || paused.PauseID != "p-late" {
		t.Fatalf("the later pause is not answered: %+v", paused)
	}
	if err := s.handleControl(ctx, controlMsg(role, "pause", "p-early", 1, body(at))); err != nil {
		t.Fatal(err)
	}
	var r schema.Refused
	if !lastAnswer(t, s.Bus, role, "refused", &r) || r.ID != "p-early" || r.Verb != "pause" || !strings.Contains(r.Reason, "later") {
		t.Errorf("refusal %+v: want the earlier pause p-early refused, saying a later one was applied", r)
	}
	if !lastAnswer(t, s.Bus, role, "paused", &paused) || paused.PauseID != "p-late" {
		t.Errorf("last answer on control.actor.paused: %+v; want p-late's still", paused)
	}

	// p-late delivered again after a resume (its ack lost): answered once.
	resume := controlMsg(role, "resume", "r-1", 3, fmt.Sprintf(`{"schema": "control.resume/1", "role": "actor", "at_ms": %d}`, at+2))
	if err := s.handleControl(ctx, resume); err != nil {
		t.Fatal(err)
	}
	again := late
	again.Delivered = 2
	if err := s.handleControl(ctx, again); err != nil {
		t.Fatal(err)
	}
	if lastAnswer(t, s.Bus, role, "refused", &r) && r.ID == "p-late" {
		t.Errorf("p-late, answered on control.actor.paused and delivered again, was refused too: %+v", r)
	}

	// Another pause, applied and answered; then p-late delivered once more.
	// The last answer on control.actor.paused is p-next's now, and p-late
	// was refused after its own answer: the role's state records it.
	if err := s.handleControl(ctx, controlMsg(role, "pause", "p-next", 4, body(at+3))); err != nil {
		t.Fatal(err)
	}
	if !lastAnswer(t, s.Bus, role, "paused", &paused) || paused.PauseID != "p-next" {
		t.Fatalf("the third pause is not answered: %+v", paused)
	}
	again.Delivered = 3
	if err := s.handleControl(ctx, again); err != nil {
		t.Fatal(err)
	}
	if lastAnswer(t, s.Bus, role, "refused", &r) && r.ID == "p-late" {
		t.Errorf("p-late, answered, then followed by p-next and delivered again, was refused after its answer: %+v", r)
	}
}

// TestAControlIDTooLongIsRefused: every answer to a pause or resume
// repeats its Nats-Msg-Id, and CONTROL takes messages of 64 KiB at most. A
// valid pause or resume with an id longer than that (a trainer's stream
// takes 1 MiB) used to be applied, the role paused or its version changed,
// and then its answer could not be published: never answered, delivered
// again and again. It is now refused, naming the id's length, and nothing
// of the role changes.
func TestAControlIDTooLongIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := t.Context()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	long := strings.Repeat("x", 70<<10)
	for i, c := range []struct{ verb, body string }{
		{"resume", fmt.Sprintf(`{"schema": "control.resume/1", "role": "actor", "weight_version": "actor-v9", "at_ms": %d}`, at)},
		{"pause", fmt.Sprintf(`{"schema": "control.pause/1", "role": "actor", "mode": "wait", "timeout_s": 60, "at_ms": %d}`, at)},
	} {
		id := c.verb + long
		if err := s.handleControl(ctx, controlMsg(role, c.verb, id, uint64(i+1), c.body)); err != nil {
			t.Errorf("a %s with a Nats-Msg-Id of %d bytes: %v; want it answered", c.verb, len(id), err)
		}
		var r schema.Refused
		if !lastAnswer(t, s.Bus, role, "refused", &r) || r.Verb != c.verb || !strings.HasPrefix(r.ID, c.verb+"xxx") || !strings.Contains(r.Reason, "Nats-Msg-Id") {
			t.Errorf("a %s with a Nats-Msg-Id of %d bytes: refusal %.200q; want it refused, naming the id", c.verb, len(id), r.Reason)
		}
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
		if err != nil {
			t.Fatal(err)
		}
		if st.Paused || st.WeightVersion != "" {
			t.Errorf("after the refused %s: paused %v, version %q; want the role as it was", c.verb, st.Paused, st.WeightVersion)
		}
	}
}

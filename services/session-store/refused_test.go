package sessionstore

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestEveryPauseAndResumeIsAnswered: a pause or a resume the session-store
// will not apply (a mode or a time-out out of range, a role its subject
// does not name, a body it cannot read), as a trainer that writes its own
// messages sends them, used to be given up without a word: its trainer
// waited for an answer that never came. Each is now answered on
// control.<role>.refused of the role its subject names, naming its id, what
// was refused and the field at fault with its value, once however often it
// is delivered; nothing of the role changes. A valid pause is still
// answered on control.<role>.paused, and a resume on control.<role>.resumed.
func TestEveryPauseAndResumeIsAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := t.Context()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	seq := uint64(0)
	// msg is a control message as a hand-written trainer sends it: body
	// and headers as given, delivered from the trainer's stream.
	msg := func(verb string, body []byte, h nats.Header) bus.Msg {
		seq++
		return bus.Msg{Subject: subject.Control(role, verb), Data: body, Header: h, Seq: seq, Delivered: 1}
	}
	asJSON := func(id, body string) nats.Header {
		return nats.Header{jetstream.MsgIDHeader: {id}, schema.HdrContentType: {schema.ContentTypeJSON}}
	}
	packed := func(v map[string]any) []byte {
		t.Helper()
		data, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	pause := func(extra string) []byte {
		return []byte(fmt.Sprintf(`{"schema": "control.pause/1", "role": "actor", "at_ms": %d%s}`, at, extra))
	}
	refusal := func() *schema.Refused {
		t.Helper()
		m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "refused"))
		if err != nil || m == nil {
			t.Fatalf("no refusal on %s (%v)", subject.Control(role, "refused"), err)
		}
		var r schema.Refused
		if err := schema.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	roleState := func() schema.RoleState {
		t.Helper()
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	for _, c := range []struct {
		what, verb, id string
		body           []byte
		header         nats.Header
		want           []string // in the reason
	}{
		{what: "an unknown mode", verb: "pause", id: "p-mode", body: pause(`, "mode": "later"`),
			want: []string{`mode "later"`, "want wait or abort"}},
		{what: "a negative time-out", verb: "pause", id: "p-neg", body: pause(`, "timeout_s": -5`),
			want: []string{"timeout_s -5", "from 1 to 604800"}},
		{what: "a mode of 100 KiB", verb: "pause", id: "p-huge", body: pause(`, "mode": "` + strings.Repeat("x", 100<<10) + `"`),
			want: []string{`mode "xxxx`, "(102400 bytes): want wait or abort"}},
		{what: "a time-out over a week", verb: "pause", id: "p-long", body: pause(`, "timeout_s": 1e9`),
			want: []string{"timeout_s 1e+09", "from 1 to 604800"}},
		{what: "a time-out that is not a number", verb: "pause", id: "p-nan",
			body:   packed(map[string]any{"schema": "control.pause/1", "role": role, "timeout_s": math.NaN(), "at_ms": at}),
			header: nats.Header{jetstream.MsgIDHeader: {"p-nan"}},
			want:   []string{"timeout_s NaN"}},
		{what: "a time-out as a string", verb: "pause", id: "p-str", body: pause(`, "timeout_s": "60"`),
			want: []string{"timeout_s", `"60"`}},
		{what: "a role that does not exist", verb: "pause", id: "p-critic",
			body: []byte(fmt.Sprintf(`{"schema": "control.pause/1", "role": "critic", "at_ms": %d}`, at)),
			want: []string{`role "critic"`}},
		{what: "another role than its subject's", verb: "pause", id: "p-planner",
			body: []byte(fmt.Sprintf(`{"schema": "control.pause/1", "role": "planner", "at_ms": %d}`, at)),
			want: []string{"control.actor.pause", "body role planner"}},
		{what: "no role", verb: "pause", id: "p-norole",
			body: []byte(fmt.Sprintf(`{"schema": "control.pause/1", "at_ms": %d}`, at)),
			want: []string{"role"}},
		{what: "an unknown field", verb: "pause", id: "p-field", body: pause(`, "timeout": 60`),
			want: []string{"timeout"}},
		{what: "a body that is no JSON", verb: "pause", id: "p-garbage", body: []byte(`{"schema": "control.pause/1", `),
			want: []string{"decode control.pause/1"}},
		{what: "no message id", verb: "pause", body: pause(`, "mode": "stop"`),
			header: nats.Header{schema.HdrContentType: {schema.ContentTypeJSON}},
			want:   []string{`mode "stop"`}},
		{what: "a resume as another role", verb: "resume", id: "r-planner",
			body: []byte(fmt.Sprintf(`{"schema": "control.resume/1", "role": "planner", "weight_version": "v2", "at_ms": %d}`, at)),
			want: []string{"control.actor.resume", "body role planner"}},
		{what: "a resume of an unknown version", verb: "resume", id: "r-v2",
			body: []byte(fmt.Sprintf(`{"schema": "control.resume/2", "role": "actor", "at_ms": %d}`, at)),
			want: []string{"control.resume/2"}},
		{what: "a resume with a version that is a number", verb: "resume", id: "r-num",
			body: []byte(fmt.Sprintf(`{"schema": "control.resume/1", "role": "actor", "weight_version": 7, "at_ms": %d}`, at)),
			want: []string{"weight_version"}},
	} {
		t.Run(c.what, func(t *testing.T) {
			h := c.header
			if h == nil {
				h = asJSON(c.id, string(c.body))
			}
			m := msg(c.verb, c.body, h)
			before := roleState()
			// Delivered twice (an ack lost): answered once.
			for delivered := uint64(1); delivered <= 2; delivered++ {
				m.Delivered = delivered
				if err := s.handleControl(ctx, m); err != nil {
					t.Fatalf("delivery %d: %v; want the message answered and taken (no error)", delivered, err)
				}
			}
			r := refusal()
			t.Logf("refused: %.200s", r.Reason)
			id := c.id
			if id == "" {
				id = fmt.Sprintf("seq:%d", m.Seq)
			}
			if r.Role != role || r.Verb != c.verb || r.ID != id || r.AtMs == 0 {
				t.Errorf("refusal %+v: want role %s, verb %s, id %s", r, role, c.verb, id)
			}
			for _, w := range c.want {
				if !strings.Contains(r.Reason, w) {
					t.Errorf("reason %q does not say %q", r.Reason, w)
				}
			}
			if n := refusals(t, s.Bus, r); n != 1 {
				t.Errorf("%d refusals of %s, want 1", n, id)
			}
			if after := roleState(); after.Paused != before.Paused || after.Epoch != before.Epoch || after.WeightVersion != before.WeightVersion {
				t.Errorf("a refused %s changed the role: %+v, was %+v", c.verb, after, before)
			}
		})
	}

	// A valid pause and resume, from the same trainer: answered as ever.
	p := &schema.Pause{Role: role, Mode: schema.PauseWait, AtMs: at + 1}
	pm := msg("pause", mustMarshal(t, p), nats.Header{jetstream.MsgIDHeader: {p.MsgID()}})
	if err := s.handleControl(ctx, pm); err != nil {
		t.Fatal(err)
	}
	m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "paused"))
	if err != nil || m == nil {
		t.Fatalf("no answer to a valid pause (%v)", err)
	}
	var paused schema.Paused
	if err := schema.Unmarshal(m.Data, &paused); err != nil || paused.PauseID != p.MsgID() || !roleState().Paused {
		t.Fatalf("paused %+v (%v), role paused %v; want the answer to %s", paused, err, roleState().Paused, p.MsgID())
	}
	r := &schema.Resume{Role: role, WeightVersion: "actor-v2", AtMs: at + 2}
	if err := s.handleControl(ctx, msg("resume", mustMarshal(t, r), nats.Header{jetstream.MsgIDHeader: {r.MsgID()}})); err != nil {
		t.Fatal(err)
	}
	m, err = s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "resumed"))
	if err != nil || m == nil {
		t.Fatalf("no answer to a valid resume (%v)", err)
	}
	var resumed schema.Resumed
	if err := schema.Unmarshal(m.Data, &resumed); err != nil || resumed.ResumeID != r.MsgID() || resumed.WeightVersion != "actor-v2" || resumed.Paused {
		t.Errorf("resumed %+v (%v); want the answer to %s, on actor-v2, not paused", resumed, err, r.MsgID())
	}
	if st := roleState(); st.Paused || st.WeightVersion != "actor-v2" {
		t.Errorf("after the resume: paused %v, version %q", st.Paused, st.WeightVersion)
	}
}

// TestAPauseOfNoRoleIsGivenUp: a control subject that names no role
// planact has (no trainer's stream holds one, so only a test delivers it)
// leaves nobody to answer: the message is given up as invalid, and nothing
// is published on that role's subjects.
func TestAPauseOfNoRoleIsGivenUp(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := t.Context()
	p := &schema.Pause{Role: "critic", Mode: schema.PauseWait, AtMs: time.Now().UnixMilli()}
	err := s.handleControl(ctx, bus.Msg{Subject: p.Subject(), Data: mustMarshal(t, p), Seq: 1, Delivered: 1,
		Header: nats.Header{jetstream.MsgIDHeader: {p.MsgID()}}})
	if fail.KindOf(err) != fail.Invalid {
		t.Errorf("a pause of critic: %v; want it given up as invalid", err)
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control("critic", "refused")); err != nil || m != nil {
		t.Errorf("a refusal was published for critic (%v)", err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := schema.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// refusals counts the refusals of r's message in the CONTROL stream.
func refusals(t *testing.T, b *bus.Bus, r *schema.Refused) int {
	t.Helper()
	st, err := b.JS.Stream(t.Context(), bus.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	info, err := st.Info(t.Context(), jetstream.WithSubjectFilter(r.Subject()))
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq <= last && seq > 0; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil || m.Subject != r.Subject() {
			continue
		}
		var got schema.Refused
		if schema.Unmarshal(m.Data, &got) == nil && got.ID == r.ID && got.Verb == r.Verb {
			n++
		}
	}
	return n
}

// TestClipKeepsARefusalSmall: what a refusal repeats of a hand-written
// message is cut to fit the CONTROL stream, at a rune's start, saying how
// long it was.
func TestClipKeepsARefusalSmall(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"mode \"later\"", "mode \"later\""},
		{strings.Repeat("é", 3<<10), strings.Repeat("é", 2<<10) + "… (6144 bytes)"},
		{"a" + strings.Repeat("é", 3<<10), "a" + strings.Repeat("é", 2<<10-1) + "… (6145 bytes)"},
	} {
		if got := clip(c.in); got != c.want {
			t.Errorf("clip of %d bytes: %d bytes %.20q…, want %d bytes", len(c.in), len(got), got, len(c.want))
		}
	}
}

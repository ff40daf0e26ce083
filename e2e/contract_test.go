package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestContractIsStrict: what a trainer in another language writes wrong is
// refused with an answer that names the mistake, on the subject the
// documentation gives, matched by the arrival's own Nats-Msg-Id. Each of
// these used to run as something else, or to get no answer at all.
func TestContractIsStrict(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 81}, actor: sim.Config{Seed: 82}})
	nc := bustest.Conn(t, e.url)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	arrival := func(n int64, role string) map[string]any {
		return map[string]any{
			"schema": "rollout.arrive/1", "rollout": n, "role": role, "at_ms": time.Now().UnixMilli(),
			"engine": map[string]any{"url": e.planner.URL},
			"tasks":  []any{map[string]any{"prompt": "What is the capital of France?", "label": "Paris"}},
		}
	}
	cases := []struct {
		name    string
		n       int64
		subject string // where the arrival goes
		edit    func(body map[string]any, h nats.Header)
		role    string // whose rejection subject answers
		want    []string
	}{
		{"misspelt config field", 801, "rollout.801.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"max_turn": 2}
		}, "planner", []string{`unknown field "config.max_turn"`}},
		{"misspelt sampling field", 802, "rollout.802.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"planner_sampling": map[string]any{"temprature": 0}}
		}, "planner", []string{`"config.planner_sampling.temprature"`}},
		{"misspelt task field", 803, "rollout.803.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["tasks"] = []any{map[string]any{"prompt": "q", "lable": "a"}}
		}, "planner", []string{`"tasks[0].lable"`}},
		{"subject and body disagree on the rollout", 804, "rollout.804.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["rollout"] = 805
		}, "planner", []string{"rollout 804", "rollout 805", "must agree"}},
		{"subject and body disagree on the role", 806, "rollout.806.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["role"] = "actor"
		}, "planner", []string{"as planner", "as actor"}},
		{"header names another version", 807, "rollout.807.arrive.planner", func(_ map[string]any, h nats.Header) {
			h.Set(schema.HdrSchema, "rollout.arrive/2")
		}, "planner", []string{"rollout.arrive/2", "rollout.arrive/1"}},
		// A role planact does not know has no stream: NATS itself refuses
		// the publish (no stream takes the subject).
		{"unknown role", 808, "rollout.808.arrive.plannner", func(b map[string]any, _ nats.Header) {
			b["role"] = "plannner"
		}, "plannner", nil},
		{"undecodable body", 809, "rollout.809.arrive.actor", func(b map[string]any, _ nats.Header) {
			b["schema"] = "rollout.arrive/9"
		}, "actor", []string{"rollout.arrive/9"}},
		// A value of the wrong type was refused as "msgpack: invalid
		// code=cb decoding int64", naming nothing; 2^64-1 ran as -1.
		{"a float for an integer", 813, "rollout.813.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"max_turns": 2.5}
		}, "planner", []string{"config.max_turns is the float 2.5: want an integer"}},
		{"a string for an integer", 814, "rollout.814.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"max_turns": "4"}
		}, "planner", []string{`config.max_turns is the string "4": want an integer`}},
		{"an integer beyond int64", 815, "rollout.815.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"max_turns": uint64(1<<64 - 1)}
		}, "planner", []string{"config.max_turns is the integer 18446744073709551615: want an integer from"}},
		{"at_ms as Python's time.time()*1000", 816, "rollout.816.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["at_ms"] = 1712345678901.25
		}, "planner", []string{"at_ms is the float 1.71234567890125e+12: want an integer"}},
		{"a task's prompt a number", 817, "rollout.817.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["tasks"] = []any{map[string]any{"prompt": 42}}
		}, "planner", []string{"tasks[0].prompt is the integer 42: want a string"}},
		// Bounds on both sides: 1e-300 was taken and timed out at once.
		{"a barrier time-out of 1e-300 s", 818, "rollout.818.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["config"] = map[string]any{"barrier_timeout_s": 1e-300}
		}, "planner", []string{"barrier_timeout_s 1e-300: want a number of seconds from 1"}},
		// Headers are compared with the subject as bodies are: logs take
		// the rollout and role from them.
		{"header names another rollout", 819, "rollout.819.arrive.planner", func(_ map[string]any, h nats.Header) {
			h.Set(schema.HdrRollout, "999")
		}, "planner", []string{`header Planact-Rollout "999" disagrees with the subject rollout.819.arrive.planner`}},
		{"header names another role", 820, "rollout.820.arrive.planner", func(_ map[string]any, h nats.Header) {
			h.Set(schema.HdrRole, "actor")
		}, "planner", []string{`header Planact-Role "actor" disagrees`}},
		{"header names an episode", 821, "rollout.821.arrive.planner", func(_ map[string]any, h nats.Header) {
			h.Set(schema.HdrEpisode, "0")
		}, "planner", []string{`header Planact-Episode "0": a rollout.arrive/1 names no episode`}},
		{"a JSON body without its Content-Type", 822, "rollout.822.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["json"] = true // sent as JSON, below
		}, "planner", []string{"the body is JSON, and planact reads msgpack", "Content-Type: application/json"}},
		// 37 bytes that claimed 2^32 tasks: the session-store allocated
		// 240 GB and died.
		{"a body claiming 2^32 tasks", 823, "rollout.823.arrive.planner", func(b map[string]any, _ nats.Header) {
			b["claim"] = true // written by hand, below
		}, "planner", []string{"not a msgpack body", "4294967295 elements"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			role := c.role
			sub, err := nc.SubscribeSync(fmt.Sprintf("rollout.%d.result.%s.rejected", c.n, role))
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			body := arrival(c.n, "planner")
			msg := nats.NewMsg(c.subject)
			msg.Header.Set(schema.HdrSchema, "rollout.arrive/1")
			id := fmt.Sprintf("my-arrival-%d", c.n)
			msg.Header.Set(nats.MsgIdHdr, id)
			c.edit(body, msg.Header)
			switch {
			case body["json"] == true:
				delete(body, "json")
				msg.Data, err = json.Marshal(body)
			case body["claim"] == true:
				msg.Data = append([]byte("\x82\xa6schema\xb0rollout.arrive/1\xa5tasks\xdd\xff\xff\xff\xff"), 0xc0)
			default:
				msg.Data, err = msgpack.Marshal(body)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = js.PublishMsg(msg)
			if c.want == nil {
				if !errors.Is(err, nats.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
					t.Fatalf("publish to %s: %v, want it refused for want of a stream", c.subject, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m, err := sub.NextMsg(patience)
			if err != nil {
				t.Fatalf("no answer on the rejection subject: %v", err)
			}
			var r schema.Result
			if err := schema.Unmarshal(m.Data, &r); err != nil {
				t.Fatal(err)
			}
			if r.Status != schema.ResultInvalid || r.ArrivalID != id {
				t.Errorf("answer %+v, want invalid with arrival_id %q", r, id)
			}
			for _, w := range c.want {
				if !strings.Contains(r.Reason, w) {
					t.Errorf("reason %q does not say %q", r.Reason, w)
				}
			}
		})
	}
}

// TestResubmittingAFinishedRollout: arriving again for a rollout that has
// ended is refused and says so, instead of handing the old result back as
// if it were new; the result itself can still be read.
func TestResubmittingAFinishedRollout(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 83}, actor: sim.Config{Seed: 84}})
	const n = 811
	tasks := e.tasks(1, 1, n)
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, nil, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatal(o.perr, o.aerr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks}, 0)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "already ended") {
		t.Fatalf("re-submission: %v, want ErrRejected saying the rollout already ended", err)
	}
	res, err := e.trainer(t).Result(ctx, n, schema.RolePlanner)
	if err != nil || res.Status != schema.ResultOK || len(res.Samples) != 1 {
		t.Fatalf("the result of the rollout: %v %+v", err, res)
	}
}

// TestTimeoutsAreNeverEarly: a barrier time-out of 2 s answers no sooner
// than 2 s after the arrival (scheduled messages fire on whole seconds, and
// fired up to a second early).
func TestTimeoutsAreNeverEarly(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 85}, actor: sim.Config{Seed: 86}})
	const n = 812
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 3 {
		arrived := time.Now()
		res, err := e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: n + int64(i), Role: schema.RolePlanner, Engine: e.planner,
			Tasks: e.tasks(1, 1, n), Config: &schema.Config{BarrierTimeoutS: 2}}, 0)
		if !errors.Is(err, client.ErrTimeout) || res == nil {
			t.Fatalf("alone: %v, want the barrier time-out", err)
		}
		m, err := bustest.Bus(t, e.url, "observer").LastMsg(ctx, bus.StreamRollout, fmt.Sprintf("rollout.%d.result.planner", n+int64(i)))
		if err != nil || m == nil {
			t.Fatalf("the time-out result: %v", err)
		}
		// The stream's own time of the result against the trainer's clock
		// (one machine): the time-out is a lower bound, never an upper one.
		if early := arrived.Add(2 * time.Second).Sub(m.Time); early > 0 {
			t.Errorf("barrier time-out of 2s answered %v early", early)
		}
	}
}

// TestCancelsThatDisagreeAreRefused: a cancel on rollout.N.cancel.critic (a
// role planact does not have) aborted rollout N; a cancel whose headers
// name another rollout or role than its subject, or whose body cannot be
// read, must not abort it either. Each is answered on rollout.N.status
// (event rejected, saying why), and the rollout waits on until a cancel
// that holds together ends it.
func TestCancelsThatDisagreeAreRefused(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 87}, actor: sim.Config{Seed: 88}})
	const n = 830
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	nc := bustest.Conn(t, e.url)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	statuses, err := nc.SubscribeSync(fmt.Sprintf("rollout.%d.status", n))
	if err != nil {
		t.Fatal(err)
	}
	actor := e.trainer(t)
	if err := actor.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor}); err != nil {
		t.Fatal(err)
	}
	body := func(role string, edit func(map[string]any)) []byte {
		b := map[string]any{"schema": "rollout.cancel/1", "rollout": n, "role": role, "reason": "wrong", "at_ms": time.Now().UnixMilli()}
		if edit != nil {
			edit(b)
		}
		data, err := msgpack.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	bad := []struct {
		subject string
		header  nats.Header
		data    []byte
		want    string
	}{
		{fmt.Sprintf("rollout.%d.cancel.actor", n), nats.Header{schema.HdrRollout: {"831"}}, body("actor", nil), `header Planact-Rollout "831" disagrees`},
		{fmt.Sprintf("rollout.%d.cancel.actor", n), nats.Header{schema.HdrRole: {"planner"}}, body("actor", nil), `header Planact-Role "planner" disagrees`},
		{fmt.Sprintf("rollout.%d.cancel.actor", n), nil, body("actor", func(b map[string]any) { b["at_ms"] = "now" }), `at_ms is the string "now": want an integer`},
		{fmt.Sprintf("rollout.%d.cancel.actor", n), nil, body("planner", nil), "the subject names rollout 830 as actor, the body rollout 830 as planner"},
	}
	// A role planact does not know has no stream: NATS refuses the cancel
	// itself (no stream takes rollout.N.cancel.critic).
	critic := nats.NewMsg(fmt.Sprintf("rollout.%d.cancel.critic", n))
	critic.Data = body("critic", nil)
	if _, err := js.PublishMsg(critic); !errors.Is(err, nats.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a cancel as critic: %v, want it refused for want of a stream", err)
	}
	for i, c := range bad {
		msg := nats.NewMsg(c.subject)
		for k, v := range c.header {
			msg.Header[k] = v
		}
		msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("bad-cancel-%d", i))
		msg.Data = c.data
		if _, err := js.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	// Every bad cancel is answered, in whatever order the consumer takes
	// them; and the arrival is recorded (the session-store may take a
	// cancel published after it first, and answer that it knows no such
	// rollout).
	want := map[string]bool{}
	for _, c := range bad {
		want[c.want] = true
	}
	arrived := false
	for len(want) > 0 || !arrived {
		m, err := statuses.NextMsg(patience)
		if err != nil {
			t.Fatalf("no answer for %v: %v", want, err)
		}
		var st schema.Status
		if err := schema.Unmarshal(m.Data, &st); err != nil {
			t.Fatal(err)
		}
		if st.Event == "aborted" || strings.Contains(st.Detail, "aborted by") {
			t.Fatalf("a bad cancel aborted the rollout: %+v", st)
		}
		if st.Event == "arrived" {
			arrived = true
		}
		if st.Event != "rejected" {
			continue
		}
		for w := range want {
			if strings.Contains(st.Detail, w) {
				delete(want, w)
			}
		}
	}
	// Only now does a cancel that holds together end it, with its reason.
	if err := e.trainer(t).Cancel(ctx, n, schema.RoleActor, "enough"); err != nil {
		t.Fatal(err)
	}
	res, err := actor.Result(ctx, n, schema.RoleActor)
	if err != nil || res.Status != schema.ResultAborted || res.Reason != "aborted by the actor trainer: enough" {
		t.Fatalf("actor: %v %+v, want aborted by the actor's own cancel", err, res)
	}
}

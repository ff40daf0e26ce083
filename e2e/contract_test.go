package e2e

import (
	"context"
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
			if msg.Data, err = msgpack.Marshal(body); err != nil {
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

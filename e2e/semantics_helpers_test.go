package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// semEnv is an env whose services can be stopped and started again on the
// same server, whose actor engine can be inspected, and whose planner can be
// a script instead of the simulated planner.
type semEnv struct {
	*env
	actorEngine *sim.Engine
	bus         *bus.Bus // the test's own view of the streams and buckets
	names       []string
	ackWait     time.Duration
	stall       time.Duration
	slack       time.Duration
	keep        bus.Provisioning
	inline      int
	stop        func()
	runs        *kvRecorder[schema.Run]
}

// kvRecorder keeps the last value of every key of the runs bucket it saw
// that decodes as a T: run states and claims are removed when their rollout
// ends, and the tests look at them after.
type kvRecorder[T any] struct {
	mu   sync.Mutex
	last map[string]T
}

// recordKV records the keys of the runs bucket that match keys (">": all).
func recordKV[T any](t *testing.T, b *bus.Bus, keys string) *kvRecorder[T] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := b.Runs.Watch(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	rec := &kvRecorder[T]{last: map[string]T{}}
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var v T
			if schema.Unmarshal(e.Value(), &v) == nil {
				rec.mu.Lock()
				rec.last[e.Key()] = v
				rec.mu.Unlock()
			}
		}
	}()
	return rec
}

// get returns the last value recorded for key.
func (r *kvRecorder[T]) get(key string) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.last[key]
	return v, ok
}

type semOptions struct {
	planner  sim.Config
	actor    sim.Config
	scripted bool // no planner-gateway: the test answers plan requests
	ackWait  time.Duration
	stall    time.Duration    // the watchdog's; default: an hour, so it stays out of the way
	slack    time.Duration    // the watchdog's planner slack; default: the act-dispatcher's
	keep     bus.Provisioning // retention of the services (the test's own bus keeps the default)
	inline   int              // the session-store's inline limit
}

func startSem(t *testing.T, o semOptions) *semEnv {
	t.Helper()
	_, url := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o.planner.Role, o.actor.Role = schema.RolePlanner, schema.RoleActor
	o.planner.WeightVersion, o.actor.WeightVersion = "planner-v7", "actor-v3"
	pu, err := sim.Serve(ctx, "127.0.0.1:0", o.planner)
	if err != nil {
		t.Fatal(err)
	}
	ae := sim.New(o.actor)
	au, _, err := sim.ServeEngine(ctx, "127.0.0.1:0", ae)
	if err != nil {
		t.Fatal(err)
	}
	e := &semEnv{
		env: &env{
			url:     url,
			planner: schema.Engine{URL: pu, Protocol: "sglang"},
			actor:   schema.Engine{URL: au, Protocol: "sglang"},
			world:   sim.DefaultWorld(),
		},
		actorEngine: ae,
		bus:         bustest.Bus(t, url, "semantics-test"),
		names:       stack.Services,
		ackWait:     o.ackWait,
		stall:       o.stall,
		slack:       o.slack,
		keep:        o.keep,
		inline:      o.inline,
	}
	if e.stall == 0 {
		e.stall = time.Hour
	}
	e.runs = recordKV[schema.Run](t, e.bus, ">")
	if o.scripted {
		e.names = slices.DeleteFunc(slices.Clone(stack.Services), func(n string) bool { return n == plannergateway.Name })
	}
	e.serve(t)
	t.Cleanup(func() { e.stop() })
	return e
}

// serve starts the services; e.stop stops them and waits until they are gone.
func (e *semEnv) serve(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- stack.Serve(ctx, e.names, stack.Options{Provision: true, Conn: bus.ConnOptions{URL: e.url}, Log: bustest.TestLogger(t, "debug"), ActRetryBase: 5 * time.Millisecond,
			ActAckWait: e.ackWait, Stall: e.stall, PlannerSlack: e.slack, Provisioning: e.keep, InlineLimit: e.inline, SweepEvery: 200 * time.Millisecond})
	}()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			// Stopped while still starting, a service reports the
			// cancelled context: that is not a failure.
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("services: %v", err)
			}
		})
	}
}

// question is a task of the world with its label; markers are appended to
// the prompt (they do not change the question the planner reads).
func (e *semEnv) question(index int, q string, markers ...string) schema.Task {
	label, ok := e.world.Answer(q)
	if !ok {
		panic("not a question of the world: " + q)
	}
	prompt := strings.TrimSpace(q + " " + strings.Join(markers, " "))
	return schema.Task{GroupIndex: index, Index: index, Prompt: prompt, Label: label}
}

func population(country string) string {
	return fmt.Sprintf("What is the population of the capital of %s?", country)
}

// dones returns the last outcome of every act of rollout n, by "E/K".
func (e *semEnv) dones(t *testing.T, n int64) map[string]schema.ActDone {
	t.Helper()
	out := map[string]schema.ActDone{}
	for _, data := range lastPerSubject(t, e.bus.JS, bus.StreamAct, subject.ActDoneFilter(n)) {
		var d schema.ActDone
		if err := schema.Unmarshal(data, &d); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%d/%s", d.Episode, d.Key)] = d
	}
	return out
}

// lastPerSubject reads the last message of every subject that matches
// filter, as a person inspecting the stream would.
func lastPerSubject(t *testing.T, js jetstream.JetStream, stream, filter string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for pending := info.NumPending; pending > 0; {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m.Data())
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		pending = md.NumPending
	}
	return out
}

// count is the number of messages the stream holds on subj (all of them,
// not only the last).
func (e *semEnv) count(t *testing.T, stream, subj string) uint64 {
	t.Helper()
	st, err := e.bus.JS.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// run is the last state of a finished run, as recorded while it ran.
func (e *semEnv) run(t *testing.T, n int64, ep, turn int) schema.Run {
	t.Helper()
	key := schema.RunKey(n, ep, turn)
	for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
		r, found := e.runs.get(key)
		if found && r.Finished {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: found %v, finished %v", key, found, r.Finished)
		}
	}
}

func (e *semEnv) session(t *testing.T, n int64) (schema.Session, bool) {
	t.Helper()
	s, _, found, err := bus.Get[schema.Session](context.Background(), e.bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	return s, found
}

func (e *semEnv) episodeEnded(t *testing.T, n int64, ep int) bool {
	t.Helper()
	m, err := e.bus.LastMsg(context.Background(), bus.StreamRollout, subject.EpisodeEnd(n, ep))
	if err != nil {
		t.Fatal(err)
	}
	return m != nil
}

// turnConsumer describes the act-dispatcher's consumer of plans: a turn's
// plan stays pending (in progress) while the turn runs.
func (e *semEnv) turnConsumer(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := e.bus.JS.Consumer(context.Background(), bus.StreamPlan, "act-dispatcher-plan")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// eventually polls cond until it holds, failing the test after a generous
// deadline: it waits for an event, it does not time anything.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	// Asked often at first, then less: a condition that takes seconds (a
	// retention, a history) is not asked hundreds of times, each asking
	// the server of every stream's state.
	for pause := 10 * time.Millisecond; !cond(); pause = min(pause*3/2, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
		time.Sleep(pause)
	}
}

// start has both roles arrive for rollout n and returns a channel that
// delivers both results.
func (e *semEnv) start(t *testing.T, n int64, tasks []schema.Task, cfg *schema.Config) <-chan outcome {
	ch := make(chan outcome, 1)
	planner, actor := e.trainer(t), e.trainer(t)
	go func() { ch <- e.rollout(t, planner, actor, n, tasks, cfg, false) }()
	return ch
}

func sampleOf(res *schema.Result, n int64, ep int) (schema.Sample, bool) {
	id := fmt.Sprintf("%d-%d", n, ep)
	for _, s := range res.Samples {
		if s.RolloutID == id {
			return s, true
		}
	}
	return schema.Sample{}, false
}

// actorKeys lists "E/K" of every actor sample.
func actorKeys(res *schema.Result) []string {
	var out []string
	for _, s := range res.Samples {
		var ep int
		fmt.Sscanf(s.RolloutID[strings.LastIndex(s.RolloutID, "-")+1:], "%d", &ep)
		out = append(out, fmt.Sprintf("%d/%v", ep, s.Metadata["key"]))
	}
	slices.Sort(out)
	return out
}

// scriptPlanner plays the planner-gateway for rollout n: every plan request
// is answered with what script writes for that episode and turn (given the
// observation the request carries), as a token-exact trajectory in the
// simulated engines' byte tokens.
func (e *semEnv) scriptPlanner(t *testing.T, n int64, script func(ep, turn int, observation string) string) {
	t.Helper()
	var mu sync.Mutex
	segs := map[int][]schema.Segment{}
	last := map[int]int{}
	sub, err := e.bus.NC.Subscribe(fmt.Sprintf("plan.%d.req.*", n), func(m *nats.Msg) {
		var req schema.PlanRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		if req.Turn <= last[req.Episode] {
			mu.Unlock()
			return
		}
		last[req.Episode] = req.Turn
		s := segs[req.Episode]
		if req.Turn == 1 {
			prompt := fmt.Sprintf("Scripted planner, episode %d.\n", req.Episode)
			s = []schema.Segment{{Kind: schema.SegPrompt, Turn: 1, Text: prompt, IDs: sim.Encode(prompt)}}
		} else {
			s = append(s, schema.Segment{Kind: schema.SegObservation, Turn: req.Turn, Text: req.Observation, IDs: sim.Encode(req.Observation)})
		}
		text := script(req.Episode, req.Turn, req.Observation)
		ids := sim.Encode(text)
		lps := make([]float64, len(ids))
		for i := range lps {
			lps[i] = -0.5
		}
		s = append(s, schema.Segment{Kind: schema.SegGenerated, Turn: req.Turn, Text: text, Version: "planner-v7", IDs: ids, LogProbs: lps})
		segs[req.Episode] = s
		out := &schema.PlanOutput{Rollout: n, Episode: req.Episode, Turn: req.Turn, Text: text,
			Segments: slices.Clone(s), FinishReason: "stop", WeightVersion: "planner-v7"}
		mu.Unlock()
		if err := e.bus.Publish(context.Background(), out); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.bus.NC.Flush(); err != nil {
		t.Fatal(err)
	}
}

package actdispatcher

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// testService is a replica on a fresh server, not consuming: a test hands
// its handler the plan messages a consumer would.
func testService(t *testing.T) (*Service, string) {
	t.Helper()
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "dispatcher")
	log := bustest.TestLogger(t, "debug")
	s := newService(Deps{Bus: b, Log: log, ActConcurrency: 16, RetryBase: 10 * time.Millisecond, RunAckWait: bus.DefaultAckWait,
		UnavailablePatience: time.Minute, Stall: 5 * time.Minute, PlannerSlack: 30 * time.Second})
	return s, url
}

// testInfo is a running rollout 1 of one episode, whose acts go to the
// actor (tool search).
func testInfo() *session.Info {
	cfg := schema.Config{MaxTurns: 5, ActTimeoutS: 30, ActRetries: 3, Tools: []schema.Tool{{Name: "search"}}}.WithDefaults()
	return &session.Info{
		Session: schema.Session{Rollout: 1, State: schema.SessionRunning, Episodes: 1, Config: cfg,
			Roles: map[string]schema.RoleInfo{schema.RoleActor: {Engine: schema.Engine{URL: "http://actor.invalid"}}}},
		Tasks: []schema.Task{{Prompt: "what is x?"}},
	}
}

func search(id, q string, deps ...string) plan.Node {
	return plan.Node{ID: id, Tool: "search", Args: map[string]any{"query": q}, Deps: deps}
}

func planDAG(turn int, partial bool, seq int, nodes ...plan.Node) *schema.PlanDAG {
	return &schema.PlanDAG{Rollout: 1, Episode: 0, Turn: turn, Partial: partial, Seq: seq, Plan: plan.Plan{Nodes: nodes}}
}

// msg is plan message seq as the consumer hands it to the handler.
func msg(seq uint64) bus.Msg {
	return bus.Msg{Subject: "plan.1.dag.0", Header: nats.Header{}, Seq: seq, Delivered: 2, Time: time.Now()}
}

// record writes a run as its runner (plan message runner) would have, the
// plans applied in order and released as far as they allow.
func record(t *testing.T, s *Service, info *session.Info, runner uint64, ds ...*schema.PlanDAG) *schema.Run {
	t.Helper()
	ctx := context.Background()
	cfg := info.Session.Config
	var r schema.Run
	for i, d := range ds {
		applyPlan(&r, i > 0, d, cfg.Schedule, cfg.FailurePolicy)
	}
	r.Runner = runner
	prior, err := s.priorActs(ctx, info, 0, r.Turn)
	if err != nil {
		t.Fatal(err)
	}
	newly, cached := advance(&r, prior)
	stamp(newly, cached)
	if created, err := bus.Create(ctx, s.Bus.Runs, schema.RunKey(1, 0, r.Turn), &r); err != nil || !created {
		t.Fatalf("run: created %v, %v", created, err)
	}
	return &r
}

// done publishes the outcome of node key as the act that ran it did.
func done(t *testing.T, s *Service, turn int, n plan.Node) {
	t.Helper()
	d := &schema.ActDone{Rollout: 1, Episode: 0, Turn: turn, Key: subject.NodeKey(turn, n.ID), NodeID: n.ID, Tool: n.Tool,
		Input: n.Input(), Status: schema.ActDoneOK, Output: "out of " + n.ID}
	if _, err := s.Bus.PublishOnce(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

func runOf(t *testing.T, s *Service, turn int) (schema.Run, uint64) {
	t.Helper()
	r, rev, found, err := bus.GetFresh[schema.Run](context.Background(), s.Bus.Runs, schema.RunKey(1, 0, turn))
	if err != nil || !found {
		t.Fatalf("run of turn %d: found %v, %v", turn, found, err)
	}
	return r, rev
}

// A node answered from the cache is recorded in the run before its outcome
// is published. When that publish is lost (the runner's process died, the
// ACT stream had no leader), the runner that takes the turn up publishes
// it: else the episode's end lists an act whose outcome the stream never
// holds, and the session-store fails the whole rollout. Before, only a run
// found finished published its cached nodes again.
func TestCachedOutcomeIsPublishedByTheRunnerThatTakesTheTurnUp(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Turn 1 called search x; turn 2 calls it again (cached) and once
	// more within the turn (a waiter, answered with it).
	first := search("a", "x")
	r1 := record(t, s, info, 3, planDAG(1, false, 0, first))
	done(t, s, 1, first)
	r1.Nodes[0].Status, r1.Nodes[0].Output, r1.Finished = schema.NodeDone, "out of a", true
	if _, _, err := bus.Mutate(ctx, s.Bus.Runs, schema.RunKey(1, 0, 1), func(r *schema.Run, _ bool) (bool, error) { *r = *r1; return true, nil }); err != nil {
		t.Fatal(err)
	}
	d := planDAG(2, false, 0, search("b", "x"), search("c", "x"))
	r2 := record(t, s, info, 7, d)
	for _, n := range r2.Nodes {
		if n.Status != schema.NodeCached {
			t.Fatalf("turn 2's node %s is %s, want cached: the test does not set up what it means to", n.Key, n.Status)
		}
	}
	// The runner wrote the run and died before it published the outcomes;
	// its plan message comes again.
	if err := s.handleDAG(ctx, info, msg(7), d); err != nil {
		t.Fatalf("redelivered plan: %v", err)
	}
	for _, n := range r2.Nodes {
		o, err := s.outcome(ctx, 1, 0, n.Key)
		if err != nil {
			t.Fatal(err)
		}
		if o == nil || o.Status != schema.ActCached || o.Output != "out of a" {
			t.Errorf("outcome of cached node %s: %+v, want cached with the output of t1-a", n.Key, o)
		}
	}
	if r, _ := runOf(t, s, 2); !r.Finished {
		t.Errorf("turn 2 not finished: %+v", r)
	}
}

// A cached node's outcome, published again (the finished turn handled
// once more, by its plan or the watchdog, after the duplicate window), is
// not stored a second time: an act has one outcome.
func TestCachedOutcomeIsStoredOnce(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := schema.Run{Rollout: 1, Episode: 0, Turn: 2, Complete: true, Finished: true, Nodes: []*schema.NodeState{
		{Node: search("b", "x"), Key: subject.NodeKey(2, "b"), Status: schema.NodeCached, Output: "out of a", CachedFrom: "t1-a"},
	}}
	first := &schema.ActDone{Rollout: 1, Turn: 2, Key: "t2-b", NodeID: "b", Tool: "search", Status: schema.ActCached, Output: "out of a"}
	// Published under another id: as the duplicate window forgot it.
	if err := s.Bus.PublishAs(ctx, first, "earlier"); err != nil {
		t.Fatal(err)
	}
	was, err := s.Bus.LastMsg(ctx, bus.StreamAct, subject.ActDone(1, 0, "t2-b"))
	if err != nil || was == nil {
		t.Fatalf("first outcome: %v, %v", was, err)
	}
	if err := s.publishOutcome(ctx, info, &run); err != nil {
		t.Fatal(err)
	}
	now, err := s.Bus.LastMsg(ctx, bus.StreamAct, subject.ActDone(1, 0, "t2-b"))
	if err != nil || now == nil {
		t.Fatalf("outcome: %v, %v", now, err)
	}
	if now.Seq != was.Seq {
		t.Errorf("a second outcome of t2-b was stored (seq %d after %d)", now.Seq, was.Seq)
	}
}

// With streamed plans the first partial plan's message runs the turn. When
// its replica dies after the final plan was merged, that partial message,
// delivered again, must take the turn up (the final output is there, but
// the message still owns the run); before, it was dropped as a late
// partial, and nothing ran the turn until the watchdog, minutes later. A
// partial that owns nothing is still dropped. The owner of a turn whose
// final output was an answer, not a plan, records the turn abandoned and
// runs again only the acts left without an outcome (here none; see
// TestAnAbandonedTurnsActIsTakenUpByItsPlanMessageDeliveredAgain).
func TestRedeliveredPartialTakesItsStreamedTurnUp(t *testing.T) {
	t.Parallel()
	s, url := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var requests atomic.Int32
	fakeGateway(t, url, func(*nats.Conn, []*nats.Msg) { requests.Add(1) })
	a, b := search("a", "x"), search("b", "y")
	partial := planDAG(1, true, 1, a)
	record(t, s, info, 5, partial, planDAG(1, false, 0, a, b))
	if err := s.Bus.Publish(ctx, &schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 1, Text: "a, b"}); err != nil {
		t.Fatal(err)
	}
	done(t, s, 1, a)
	done(t, s, 1, b)
	_, rev := runOf(t, s, 1)
	if err := s.handleDAG(ctx, info, msg(6), partial); err != nil {
		t.Fatalf("a late partial: %v", err)
	}
	if r, now := runOf(t, s, 1); now != rev || r.Finished {
		t.Fatalf("a late partial that owns nothing changed the run (rev %d → %d)", rev, now)
	}
	if err := s.handleDAG(ctx, info, msg(5), partial); err != nil {
		t.Fatalf("the runner's partial, delivered again: %v", err)
	}
	if r, _ := runOf(t, s, 1); !r.Finished {
		t.Fatalf("the runner's partial, delivered again, did not run the turn: %+v", r)
	}
	req, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0))
	if err != nil || req == nil {
		t.Fatalf("no plan request for the next turn: %v", err)
	}

	// Turn 2 ends in an answer: its runner's partial owns a run that no
	// final plan completes, whose act has its outcome: nothing runs again.
	c := search("c", "z")
	partial = planDAG(2, true, 1, c)
	record(t, s, info, 9, partial)
	done(t, s, 2, c)
	if err := s.Bus.Publish(ctx, &schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 2, Text: "done"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Bus.Publish(ctx, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 2, Answers: []string{"z"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.handleDAG(ctx, info, msg(9), partial); err != nil {
		t.Fatalf("the runner's partial of an answered turn: %v", err)
	}
	if r, _ := runOf(t, s, 2); r.Abandoned == nil || r.Finished || requests.Load() != 0 {
		t.Errorf("the partial of an answered turn: abandoned %+v, finished %v, %d act requests; want it abandoned, no act run again",
			r.Abandoned, r.Finished, requests.Load())
	}
}

// The runner's own plan message delivered again to its replica (its
// progress signals were lost, a NATS restart) must not be acknowledged
// while the turn runs: that would end the claim of the delivery that runs
// it, and nothing would be delivered again if the replica died. It waits
// for the runner, and takes the turn up itself if the runner handed it
// back.
func TestRedeliveryToTheRunnerWaitsForIt(t *testing.T) {
	t.Parallel()
	s, _ := testService(t) // no actor-gateway: the act waits for one
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := planDAG(1, false, 0, search("a", "x"))
	key := schema.RunKey(1, 0, 1)
	first := make(chan error, 1)
	go func() { first <- s.handleDAG(ctx, info, msg(5), d) }()
	runner := waitRunner(t, s, key, nil)
	again := make(chan error, 1)
	go func() { again <- s.handleDAG(ctx, info, msg(5), d) }()
	select {
	case err := <-again:
		t.Fatalf("the redelivery of the running turn's message was answered (%v) while the turn runs", err)
	case <-time.After(300 * time.Millisecond):
	}
	handedBack := fail.Transientf("act a: outcome not published")
	runner.stop(handedBack)
	if err := <-first; !errors.Is(err, handedBack) {
		t.Fatalf("the runner: %v, want it handed back", err)
	}
	// The turn is handed back: the redelivery runs it now.
	next := waitRunner(t, s, key, runner)
	select {
	case err := <-again:
		t.Fatalf("the redelivery ended (%v) with its turn running", err)
	default:
	}
	next.stop(handedBack)
	if err := <-again; !errors.Is(err, handedBack) {
		t.Fatalf("the redelivery's runner: %v, want it handed back", err)
	}
}

// waitRunner waits until a runner other than not runs the turn key.
func waitRunner(t *testing.T, s *Service, key string, not *runner) *runner {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if r := s.runners.get(key); r != nil && r != not {
			return r
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no runner of %s", key)
	return nil
}

// An act that waited for an actor-gateway and then reached one waits its
// whole patience again if gateways go away later in its life; before, the
// first wait counted on, and the act failed as unavailable at once. The
// patience's clock is the test's: each postponement is seen, and the
// clock moved between them, so that no margin of real time decides.
func TestUnavailableAgainWaitsAgain(t *testing.T) {
	s, url := testService(t)
	const patience = time.Minute
	s.UnavailablePatience = patience
	var mu sync.Mutex
	now := time.Now()
	clock := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	read := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	postponements := make(chan time.Time, 64)
	patienceClock = read
	postponed = func(_ string, at time.Time) { postponements <- at }
	t.Cleanup(func() { patienceClock, postponed = time.Now, func(string, time.Time) {} })
	s.RetryBase = time.Millisecond
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := &act{Rollout: 1, Episode: 0, Turn: 1, Key: "t1-a", Node: search("a", "x")}
	result := make(chan *schema.ActDone, 1)
	go func() {
		d, err := s.execute(ctx, info, a)
		if err != nil {
			t.Errorf("execute: %v", err)
		}
		result <- d
	}()
	// postponedOnce waits for a postponement decided at the clock's
	// reading now or later (one decided before is passed over).
	postponedOnce := func(when string) {
		t.Helper()
		from := read()
		for {
			select {
			case at := <-postponements:
				if !at.Before(from) {
					return
				}
			case d := <-result:
				t.Fatalf("%s: the act ended (%s %s: %s) instead of waiting for a gateway", when, d.Status, d.ErrorKind, d.Error)
			}
		}
	}
	// No gateway: postponed; most of the patience passes.
	postponedOnce("no gateway yet")
	clock(patience * 7 / 10)
	postponedOnce("no gateway, 0.7 of the patience gone")

	// A gateway that fails the attempt (it reached one) and goes.
	nc := bustest.Conn(t, url)
	answered := make(chan struct{})
	_, err := nc.Subscribe(schema.ActorSubject, func(m *nats.Msg) {
		_ = m.Sub.Unsubscribe()
		r := &nats.Msg{Subject: m.Reply, Header: nats.Header{}}
		r.Header.Set(schema.HdrActorGateway, "flaky")
		r.Header.Set(micro.ErrorCodeHeader, "500")
		r.Header.Set(micro.ErrorHeader, "engine restarting")
		_ = nc.PublishMsg(r)
		close(answered)
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case d := <-result:
		t.Fatalf("the act ended (%+v) before any gateway answered", d)
	}
	// None again: a postponement begins its patience anew; then half the
	// patience passes (0.7 + 0.5 of it since the first), and the act is
	// postponed still. (The clock is moved by a nanosecond first, so that
	// the postponement waited for is one decided after the answer.)
	clock(time.Nanosecond)
	postponedOnce("no gateway after one answered")
	clock(patience / 2)
	postponedOnce("no gateway, half the patience after one answered")

	fakeGateway(t, url, func(nc *nats.Conn, copies []*nats.Msg) {
		reply, _ := schema.Marshal(&schema.ActorReply{Generation: schema.Generation{Text: "x is 1"}})
		m := &nats.Msg{Subject: copies[len(copies)-1].Reply, Header: nats.Header{}, Data: reply}
		m.Header.Set(schema.HdrActorGateway, "fake")
		_ = nc.PublishMsg(m)
	})
	var d *schema.ActDone
	for d == nil {
		select {
		case d = <-result:
		case <-postponements:
		}
	}
	if d.Status != schema.ActDoneOK || d.Output != "x is 1" {
		t.Fatalf("the act: %+v, want it done by the gateway that came", d)
	}
}

// The runner of a streamed turn whose final output turns out an answer
// ends without an error, however soon it finds out: the answer moves the
// episode on. Before, finding it out on its first look at the stream
// returned the finding as an error, and the plan message was delivered
// again for nothing.
func TestPartialRunnerOfAnAnsweredTurnEndsQuietly(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Bus.Publish(ctx, &schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 1, Answers: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.handleDAG(ctx, info, msg(4), planDAG(1, true, 1, search("a", "x"))); err != nil {
		t.Fatalf("the runner of an answered turn: %v", err)
	}
}

// A redelivery waiting for its runner does not take the turn up when the
// watchdog handed the turn to another message meanwhile: that one runs it.
func TestRedeliveryWaitingForAHandedOverRunnerStandsDown(t *testing.T) {
	t.Parallel()
	s, _ := testService(t) // no actor-gateway: the act waits for one
	info := testInfo()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := planDAG(1, false, 0, search("a", "x"))
	key := schema.RunKey(1, 0, 1)
	first := make(chan error, 1)
	go func() { first <- s.handleDAG(ctx, info, msg(5), d) }()
	runner := waitRunner(t, s, key, nil)
	again := make(chan error, 1)
	go func() { again <- s.handleDAG(ctx, info, msg(5), d) }()
	select {
	case err := <-again:
		t.Fatalf("the redelivery of the running turn's message was answered (%v) while the turn runs", err)
	case <-time.After(300 * time.Millisecond):
	}
	runner.stop(errHandedOver)
	if err := <-first; err != nil {
		t.Fatalf("the runner handed over: %v", err)
	}
	if err := <-again; err != nil {
		t.Fatalf("the redelivery: %v, want it dropped", err)
	}
	if r := s.runners.get(key); r != nil {
		t.Errorf("the redelivery took the handed-over turn up")
		r.stop(errHandedOver)
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
	actorgateway "github.com/planact/planact/services/actor-gateway"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// countedEnv is an env whose engines count every request they see.
type countedEnv struct {
	*env
	plannerEngine, actorEngine *enginetest.Engine
	bus                        *bus.Bus // the test's own view of the streams and buckets
	// proxy is the act-dispatcher's way to NATS, with proxied.
	proxy *bustest.Proxy
}

type countedOptions struct {
	planner, actor         sim.Config
	plannerLoad, actorLoad enginetest.Options
	// services configures the services; Conn and Log are set here.
	services stack.Options
	names    []string // default: every service
	// proxied: the act-dispatcher connects through a proxy the test can cut.
	proxied bool
}

func startCounted(t *testing.T, o countedOptions) *countedEnv {
	t.Helper()
	_, url := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	o.planner.Role, o.actor.Role = schema.RolePlanner, schema.RoleActor
	o.planner.WeightVersion, o.actor.WeightVersion = "planner-v7", "actor-v3"
	pe := enginetest.New(sim.New(o.planner), o.plannerLoad)
	ae := enginetest.New(sim.New(o.actor), o.actorLoad)
	pu, err := enginetest.Serve(ctx, pe)
	if err != nil {
		t.Fatal(err)
	}
	au, err := enginetest.Serve(ctx, ae)
	if err != nil {
		t.Fatal(err)
	}
	names := o.names
	if names == nil {
		names = stack.Services
	}
	so := o.services
	so.Conn, so.Log = bus.ConnOptions{URL: url}, bustest.TestLogger(t, "debug")
	// Provisioned once, as `planact provision` does; the services open it.
	if err := stack.Provision(ctx, so); err != nil {
		t.Fatal(err)
	}
	// Every replica of every service, the proxied act-dispatcher's too.
	want := map[string]int{}
	for _, n := range names {
		want[n] = max(so.Replicas[n], 1)
	}
	var proxy *bustest.Proxy
	served := 1
	done := make(chan error, 2)
	if o.proxied {
		names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == actdispatcher.Name })
		proxy = bustest.StartProxy(t, url)
		po := so
		po.Conn = bus.ConnOptions{URL: proxy.URL}
		served++
		go func() { done <- stack.Serve(ctx, []string{actdispatcher.Name}, po) }()
	}
	go func() { done <- stack.Serve(ctx, names, so) }()
	// Every replica answering before the test goes on: a replica still
	// starting when generations begin leaves its peers sharing an engine
	// among fewer than will be (TestEnginesKeptFull saw 94 of 96 once).
	answered := serviceReplies(t, bustest.Conn(t, url), "$SRV.PING", want, func(p micro.Ping) string { return p.Name })
	// A replica that answers may not be counted by its peers yet: it
	// counts them before it takes work, and they count it when they hear
	// its next peer round (bus.PeerEvery), which a loaded machine may
	// hold up past any fixed wait; an act queued at a replica over its new
	// share waits there until that share frees (the limit named in
	// docs/engines.md). So the test waits until every replica of a gateway
	// has been counted by every other.
	peersCounted(t, bustest.Conn(t, url), answered, want)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for range served {
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("services: %v", err)
				}
			}
		})
	}
	t.Cleanup(stop)
	return &countedEnv{
		env: &env{
			url:     url,
			planner: schema.Engine{URL: pu, Protocol: "sglang"},
			actor:   schema.Engine{URL: au, Protocol: "sglang"},
			world:   sim.DefaultWorld(),
			stop:    stop,
		},
		plannerEngine: pe,
		actorEngine:   ae,
		bus:           bustest.Bus(t, url, "genonce-test"),
		proxy:         proxy,
	}
}

// dones returns the outcome of every act of rollout n, by "E/K".
func (e *countedEnv) dones(t *testing.T, n int64) map[string]schema.ActDone {
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

// checkOnce fails the test for every planner turn and act that reached its
// engine more than once, and for generations that named none.
func checkOnce(t *testing.T, e *countedEnv) (turns, acts int) {
	t.Helper()
	for _, c := range []struct {
		role string
		eng  *enginetest.Engine
		gens func(enginetest.Counts) map[string]int
	}{
		{schema.RolePlanner, e.plannerEngine, enginetest.Counts.Turns},
		{schema.RoleActor, e.actorEngine, enginetest.Counts.Acts},
	} {
		counts := c.eng.Counts()
		gens := c.gens(counts)
		if _, unnamed := counts.Duplicates(); unnamed > 0 {
			t.Errorf("%s engine: %d generations named no turn or act", c.role, unnamed)
		}
		var twice []string
		for g, k := range gens {
			if k != 1 {
				twice = append(twice, fmt.Sprintf("%s×%d", g, k))
			}
		}
		sort.Strings(twice)
		if len(twice) > 0 {
			t.Errorf("%s engine: %d of %d generations called more than once: %v", c.role, len(twice), len(gens), twice)
		}
		if c.role == schema.RolePlanner {
			turns = len(gens)
		} else {
			acts = len(gens)
		}
	}
	return turns, acts
}

// TestEveryGenerationOnce: engines slower than the consumers' ack wait, and
// engines that serve fewer generations at once than planact's width, are
// called once per planner turn and once per act: a message waiting for a
// free slot is never handed out a second time.
func TestEveryGenerationOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		planner, actor sim.Config
		load           enginetest.Options
		services       stack.Options
	}{
		{
			// Generations three times the ack wait.
			name:    "slower than the ack wait",
			planner: sim.Config{Seed: 161, TTFT: 900 * time.Millisecond},
			actor:   sim.Config{Seed: 162, TTFT: 900 * time.Millisecond},
			services: stack.Options{PlannerAckWait: 300 * time.Millisecond, ActAckWait: 300 * time.Millisecond,
				PlannerConcurrency: 3, ActTurns: 3},
		},
		{
			// The engines serve two at once; planact's width is larger.
			name:    "engine limit below the width",
			planner: sim.Config{Seed: 163, TTFT: 150 * time.Millisecond},
			actor:   sim.Config{Seed: 164, TTFT: 150 * time.Millisecond},
			load:    enginetest.Options{Limit: 2},
			services: stack.Options{PlannerAckWait: 300 * time.Millisecond, ActAckWait: 300 * time.Millisecond,
				PlannerConcurrency: 4, ActTurns: 4, EngineLimit: 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startCounted(t, countedOptions{planner: tc.planner, actor: tc.actor, plannerLoad: tc.load, actorLoad: tc.load, services: tc.services})
			const n = 1600
			tasks := e.tasks(12, 1, n)
			o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, nil, false)
			if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != len(tasks) {
				t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
			}
			turns, acts := checkOnce(t, e)
			if turns == 0 || acts == 0 {
				t.Fatalf("%d turns and %d acts reached the engines", turns, acts)
			}
			t.Logf("%d turns, %d acts; most generations at once: planner %d, actor %d", turns, acts,
				e.plannerEngine.Counts().MaxInFlight, e.actorEngine.Counts().MaxInFlight)
		})
	}
}

// TestATurnAskedAgainWaitsForItsHolder: while a slow planner turn is being
// generated, its plan request is published again (as the watchdog does, or
// a redelivery after a NATS restart). The copies, on either of two
// planner-gateway replicas, find the turn claimed by a live holder and wait
// for its output: the engine generates the turn once.
func TestATurnAskedAgainWaitsForItsHolder(t *testing.T) {
	const n = 1610
	// The first turn is held on the engine until the copies wait for it,
	// however slow the machine.
	hold, release := holdUntil(t)
	e := startCounted(t, countedOptions{
		planner:     sim.Config{Seed: 165},
		plannerLoad: enginetest.Options{Hold: hold, HoldIf: func(g string) bool { return g == fmt.Sprintf("%d-0-t1", n) }},
		actor:       sim.Config{Seed: 166},
		services:    stack.Options{Replicas: map[string]int{plannergateway.Name: 2}},
	})
	ctx := context.Background()
	claims := recordKV[schema.Claim](t, e.bus, "*.*.*.planner")
	awaited := testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RolePlanner))
	results := make(chan outcome, 1)
	go func() { results <- e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(1, 1, n), nil, false) }()
	eventually(t, "the first turn on the engine", func() bool { return e.plannerEngine.Counts().InFlight > 0 })
	req, err := e.bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(n, 0))
	if err != nil || req == nil {
		t.Fatalf("plan request: %v", err)
	}
	for i := range 4 {
		if err := e.bus.Republish(ctx, req, fmt.Sprintf("again%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the copies waiting for the holder", func() bool {
		return testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RolePlanner)) > awaited
	})
	release()
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	checkOnce(t, e)
	if c, ok := claims.get(schema.ClaimKey(n, 0, 1)); !ok || c.Holder == "" || len(c.Retries) != 0 {
		t.Errorf("claim of turn 1: %+v (found %v), want a holder and no retry", c, ok)
	}
}

// TestATurnWhoseHolderIsGoneIsTakenOver: the first turn of an episode is
// claimed by an instance that is gone: it answers nothing (its process died
// or is stopped), or answers that it no longer generates the turn. Another
// instance takes the turn over, generates it once, and the claim records
// the retry: by whom, from whom, why.
func TestATurnWhoseHolderIsGoneIsTakenOver(t *testing.T) {
	for _, tc := range []struct {
		name, answer, why string
	}{
		{"silent", "", "answered nothing"},
		{"gave up", "no", "no longer generates it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startCounted(t, countedOptions{planner: sim.Config{Seed: 167}, actor: sim.Config{Seed: 168}})
			ctx := context.Background()
			claims := recordKV[schema.Claim](t, e.bus, "*.*.*.planner")
			const n, gone = 1620, "gone-instance"
			if tc.answer != "" {
				sub, err := bustest.Conn(t, e.url).Subscribe("planact.planner-gateway."+gone+".holds", func(m *nats.Msg) { _ = m.Respond([]byte(tc.answer)) })
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Unsubscribe()
			}
			key := schema.ClaimKey(n, 0, 1)
			if _, err := bus.Create(ctx, e.bus.Runs, key, &schema.Claim{Rollout: n, Turn: 1, Holder: gone, Replica: "elsewhere:1/0", SinceMs: time.Now().UnixMilli()}); err != nil {
				t.Fatal(err)
			}
			retried := testutil.ToFloat64(telemetry.GenerationRetries.WithLabelValues(schema.RolePlanner, map[string]string{"": "holder_gone", "no": "gave_up"}[tc.answer]))
			o := e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(1, 1, n), nil, false)
			if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
				t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
			}
			checkOnce(t, e)
			c, _ := claims.get(key)
			if c.Holder == gone || c.Holder == "" || len(c.Retries) != 1 || c.Retries[0].From != gone || c.Retries[0].By != c.Holder ||
				!strings.Contains(c.Retries[0].Why, tc.why) {
				t.Errorf("claim %+v: want it taken over from %s, the retry recorded (%q)", c, gone, tc.why)
			}
			if testutil.ToFloat64(telemetry.GenerationRetries.WithLabelValues(schema.RolePlanner, map[string]string{"": "holder_gone", "no": "gave_up"}[tc.answer])) <= retried {
				t.Error("the retry was not counted")
			}
		})
	}
}

// TestAnActWhoseGatewayIsGoneIsSentAgain: an act's request reaches an
// actor-gateway that then dies, after acknowledging it, or that never says
// a word (the request, or every answer, lost). Within seconds, not at the
// act's time-out, the act is sent to another gateway: one attempt, one
// engine call, and the retry recorded in its outcome (by, from, why).
func TestAnActWhoseGatewayIsGoneIsSentAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ack, from, why string
	}{
		{"acknowledged", "dead-gateway", "dead-gateway", "answered nothing"},
		{"silent", "", "", "no actor-gateway acknowledged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startCounted(t, countedOptions{planner: sim.Config{Seed: 171}, actor: sim.Config{Seed: 172},
				names: slices.DeleteFunc(slices.Clone(stack.Services), func(n string) bool { return n == actorgateway.Name })})
			// The gateway that takes the first requests and goes.
			fake := bustest.Conn(t, e.url)
			var mu sync.Mutex
			caught := map[string]bool{}
			sub, err := fake.QueueSubscribe(schema.ActorSubject, actorgateway.QueueGroup, func(m *nats.Msg) {
				var req schema.ActorRequest
				if schema.Unmarshal(m.Data, &req) != nil {
					return
				}
				mu.Lock()
				caught[fmt.Sprintf("%d/%s", req.Episode, req.Key)] = true
				mu.Unlock()
				if tc.ack != "" {
					ack := nats.NewMsg(m.Reply)
					ack.Header.Set(schema.HdrActorGateway, tc.ack)
					ack.Header.Set(schema.HdrActorProgress, schema.ActorStarted)
					_ = fake.PublishMsg(ack)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			const n = 1630
			results := make(chan outcome, 1)
			go func() {
				results <- e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(2, 1, n), &schema.Config{ActTimeoutS: 20}, false)
			}()
			eventually(t, "an act caught by the gateway that goes", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(caught) > 0
			})
			// The real gateway first, answering, so that the act sent again
			// (after 3 s of silence) finds it however slow the machine.
			defer startService(t, e.url, actorgateway.Name)()
			eventually(t, "the real gateway answering pings", func() bool {
				_, err := fake.Request("$SRV.PING."+actorgateway.Name, nil, time.Second)
				return err == nil
			})
			// Drained, every request that reached it is seen (and caught).
			if err := sub.Drain(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the gateway that goes gone", func() bool { return !sub.IsValid() })
			o := <-results
			if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
				t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
			}
			checkOnce(t, e)
			mu.Lock()
			defer mu.Unlock()
			for k, d := range e.dones(t, n) {
				if d.Status != schema.ActDoneOK || d.Attempts != 1 {
					t.Errorf("act %s: %s after %d attempts (%s), want done at the first", k, d.Status, d.Attempts, d.Error)
				}
				if !caught[k] {
					if len(d.Retries) != 0 {
						t.Errorf("act %s: retries %+v, none expected", k, d.Retries)
					}
					continue
				}
				if len(d.Retries) == 0 || d.Retries[0].From != tc.from || d.Retries[0].By == "" || !strings.Contains(d.Retries[0].Why, tc.why) {
					t.Errorf("act %s, sent to the gateway that went: retries %+v, want one from %q (%q)", k, d.Retries, tc.from, tc.why)
				}
			}
		})
	}
}

// TestALostActorReplyIsAnsweredAgain: the act-dispatcher's connection is
// cut while an act generates, and the gateway's reply is lost with it (a
// NATS restart does the same). Within seconds the dispatcher, hearing
// nothing, sends the request again to the gateway that has the act, which
// answers from the generation it ran: one attempt, one engine call, no
// retry, the act done long before its time-out.
func TestALostActorReplyIsAnsweredAgain(t *testing.T) {
	// The acts are held on the engine until the connection is cut, so
	// that the answer comes while the dispatcher is away.
	hold, release := holdUntil(t)
	e := startCounted(t, countedOptions{planner: sim.Config{Seed: 173}, actor: sim.Config{Seed: 174}, actorLoad: enginetest.Options{Hold: hold}, proxied: true})
	// The gateway's answers to the dispatcher, as they are published.
	watch := bustest.Conn(t, e.url)
	answered := make(chan struct{}, 64)
	if _, err := watch.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if m.Header.Get(schema.HdrActorGateway) != "" && m.Header.Get(schema.HdrActorProgress) == "" {
			answered <- struct{}{}
		}
	}); err != nil {
		t.Fatal(err)
	}
	awaited := testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor))
	const n = 1640
	results := make(chan outcome, 1)
	go func() {
		results <- e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(1, 1, n), &schema.Config{ActTimeoutS: 20}, false)
	}()
	eventually(t, "an act on the engine", func() bool { return e.actorEngine.Counts().InFlight > 0 })
	e.proxy.Cut()
	release()
	select {
	case <-answered: // published while the dispatcher is away: lost
	case <-time.After(time.Minute):
		t.Fatal("the gateway never answered")
	}
	e.proxy.Restore()
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	checkOnce(t, e)
	for k, d := range e.dones(t, n) {
		if d.Status != schema.ActDoneOK || d.Attempts != 1 || len(d.Retries) != 0 {
			t.Errorf("act %s: %s after %d attempts, retries %+v; want done at the first, no retry", k, d.Status, d.Attempts, d.Retries)
		}
	}
	if testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor)) <= awaited {
		t.Error("the request sent again was not answered from the generation that ran")
	}
}

// TestAPauseHoldsATurnThatIsTokenizing: the planner's turn tokenizes its
// prompt (slowly) before it generates. A pause that lands meanwhile answers
// only once that turn can start no generation: in wait mode after the
// turn's generation ended, in abort mode at once, the turn aborted. From
// the pause's answer to the resume, no generation reaches the engine.
func TestAPauseHoldsATurnThatIsTokenizing(t *testing.T) {
	t.Parallel()
	for _, abort := range []bool{false, true} {
		name := "wait"
		if abort {
			name = "abort"
		}
		t.Run(name, func(t *testing.T) {
			e := startCounted(t, countedOptions{planner: sim.Config{Seed: 175}, actor: sim.Config{Seed: 176},
				plannerLoad: enginetest.Options{Latency: map[string]time.Duration{"/tokenize": 1500 * time.Millisecond}}})
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			n := int64(1650)
			if abort {
				n++
			}
			results := make(chan outcome, 1)
			go func() { results <- e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(1, 1, n), nil, false) }()
			eventually(t, "a planner turn tokenizing", func() bool {
				for _, r := range e.plannerEngine.Requests() {
					if r.Path == "/tokenize" && r.End.IsZero() {
						return true
					}
				}
				return false
			})
			trainer := e.trainer(t)
			paused, err := trainer.Pause(ctx, schema.RolePlanner, client.PauseOptions{Abort: abort, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			answered := time.Now()
			if len(paused.Drained) == 0 || len(paused.Missing) != 0 {
				t.Errorf("paused: drained %v, missing %v; want the planner-gateway drained", paused.Drained, paused.Missing)
			}
			// Past the end of the tokenize that was running: its turn may
			// not generate while the role is paused.
			time.Sleep(2 * time.Second)
			resumed := time.Now()
			if err := trainer.Resume(ctx, schema.RolePlanner, "planner-v8"); err != nil {
				t.Fatal(err)
			}
			o := <-results
			if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
				t.Fatalf("after the resume: %v %v %+v", o.perr, o.aerr, o.planner)
			}
			for _, r := range e.plannerEngine.Requests() {
				if enginetest.IsGeneration(r.Path) && r.Start.After(answered) && r.Start.Before(resumed) {
					t.Errorf("a generation (%s) started %v after the pause answered, before the resume", r.Generation, r.Start.Sub(answered).Round(time.Millisecond))
				}
			}
		})
	}
}

// TestAFrozenDispatchersActMovesOnOnce: the act-dispatcher replica running
// a turn stops (its connection goes silent, as SIGSTOP does) while the
// turn's act generates. Within its ack wait the turn goes to another
// replica, which sends the act again; the actor-gateway attaches that
// request to the generation it runs, so the engine is called once, and the
// act ends done at its first attempt, run by the replica that took over.
func TestAFrozenDispatchersActMovesOnOnce(t *testing.T) {
	so := stack.Options{ActAckWait: 500 * time.Millisecond}
	e := startCounted(t, countedOptions{planner: sim.Config{Seed: 177}, actor: sim.Config{Seed: 178, TTFT: 3 * time.Second}, proxied: true, services: so})
	const n = 1660
	awaited := testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor))
	results := make(chan outcome, 1)
	go func() { results <- e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(1, 1, n), nil, false) }()
	eventually(t, "an act on the engine", func() bool { return e.actorEngine.Counts().InFlight > 0 })
	e.proxy.Freeze()
	// The replica that takes the turn over.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	so.Conn, so.Log = bus.ConnOptions{URL: e.url}, bustest.TestLogger(t, "debug")
	go func() { done <- stack.Serve(ctx, []string{actdispatcher.Name}, so) }()
	defer func() { cancel(); <-done }()
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	checkOnce(t, e)
	dones := e.dones(t, n)
	first, ok := dones["0/t1-s1"]
	if !ok {
		t.Fatalf("no outcome of the first act: %v", dones)
	}
	if first.Status != schema.ActDoneOK || first.Attempts != 1 || len(first.Retries) != 0 {
		t.Errorf("first act: %s after %d attempts, retries %+v; want done at the first, no retry", first.Status, first.Attempts, first.Retries)
	}
	if testutil.ToFloat64(telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor)) <= awaited {
		t.Error("the replica that took over did not attach to the running generation")
	}
}

// holdUntil returns a channel for enginetest.Options.Hold and the release
// that closes it (at the latest when the test ends, so nothing stays held).
func holdUntil(t *testing.T) (<-chan struct{}, func()) {
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	return hold, release
}

// peersCounted waits until every replica of each engine-sharing gateway
// (bus.Peers) that runs several has answered a peer round of every other
// replica of its service. A replica counts the asker of such a round
// before it answers (bus.HdrPeer), so an answer seen is a count made. The
// services connect without a user: their rounds' replies come under
// nats.go's _INBOX.
func peersCounted(t *testing.T, nc *nats.Conn, answered map[string][]micro.Ping, want map[string]int) {
	t.Helper()
	var mu sync.Mutex
	asker := map[string]string{}         // reply subject of a peer round -> the replica asking
	answers := map[string][]micro.Ping{} // reply subject -> the answers heard on it
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	subscribe := func(subj string, f nats.MsgHandler) {
		s, err := nc.Subscribe(subj, f)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	subscribe("_INBOX.>", func(m *nats.Msg) {
		var p micro.Ping
		if json.Unmarshal(m.Data, &p) == nil && p.Type == micro.PingResponseType {
			mu.Lock()
			answers[m.Subject] = append(answers[m.Subject], p)
			mu.Unlock()
		}
	})
	var shared []string
	for _, name := range []string{plannergateway.Name, actorgateway.Name} {
		if want[name] < 2 {
			continue
		}
		shared = append(shared, name)
		subscribe("$SRV.PING."+name, func(m *nats.Msg) {
			if id := m.Header.Get(bus.HdrPeer); id != "" && m.Reply != "" {
				mu.Lock()
				asker[m.Reply] = id
				mu.Unlock()
			}
		})
	}
	if len(shared) == 0 {
		return
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	uncounted := func() []string {
		mu.Lock()
		defer mu.Unlock()
		counted := map[[2]string]bool{} // {asker, answerer}
		for reply, id := range asker {
			for _, p := range answers[reply] {
				counted[[2]string{id, p.ID}] = true
			}
		}
		var missing []string
		for _, name := range shared {
			for _, x := range answered[name] {
				for _, y := range answered[name] {
					if x.ID != y.ID && !counted[[2]string{x.ID, y.ID}] {
						missing = append(missing, fmt.Sprintf("%s %s by %s", name, x.ID, y.ID))
					}
				}
			}
		}
		return missing
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		missing := uncounted()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas not counted by their peers: %v", missing)
		}
	}
}

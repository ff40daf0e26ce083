package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/freeport"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
	plannergateway "github.com/planact/planact/services/planner-gateway"
	sessionstore "github.com/planact/planact/services/session-store"
)

// TestResultsOwedAfterACrash: the session-store decided that a rollout was
// done and crashed before its results were out; on restart the JetStream
// consumer's delivery counts start again from 1 (a NATS crash loses them).
// Deciding from a delivery count, the results were never published; the
// decision is now recorded with its effects, and they are published by
// whoever reads the session next.
func TestResultsOwedAfterACrash(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 61}, actor: sim.Config{Seed: 62}, inline: 1})
	ctx := context.Background()
	// Every service is up (each provisions what is missing when it starts);
	// then the result object stores go, so results cannot be published.
	waitServices(t, bustest.Conn(t, e.url))
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if err := e.bus.JS.DeleteObjectStore(ctx, bus.ObjectResults(role)); err != nil {
			t.Fatal(err)
		}
	}
	const n = 701
	tasks := e.tasks(2, 1, n)
	results := e.start(t, n, tasks, nil)
	eventually(t, "the rollout decided done, results owed", func() bool {
		s, found := e.session(t, n)
		return found && s.State == schema.SessionDone && s.Owes(schema.EffectResults)
	})
	e.stop()
	// What a NATS crash does to the consumer: its delivery counts are gone.
	if err := e.bus.JS.DeleteConsumer(ctx, bus.StreamRollout, sessionstore.Name); err != nil {
		t.Fatal(err)
	}
	e.serve(t) // provisioning creates the object stores again
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != len(tasks) {
		t.Fatalf("after the restart: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	eventually(t, "the session records its results published", func() bool {
		s, _ := e.session(t, n)
		return len(s.Outbox) == 0 && len(s.Objects) == 2
	})
}

// TestClientRidesOutNATSRestart: a trainer waiting for its result while
// NATS restarts gets the result, not "nats: no heartbeat received" ten
// seconds after the restart.
func TestClientRidesOutNATSRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A port below the ephemeral range: while NATS is down, no outgoing
	// connection may take it as its own (internal/freeport).
	portNum, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: portNum, Name: "restarting"})
	if err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	t.Cleanup(func() { srv.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A slow planner: the rollout is still running when NATS restarts.
	pu, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 63, TTFT: 1500 * time.Millisecond, WeightVersion: "p"})
	if err != nil {
		t.Fatal(err)
	}
	au, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 64, WeightVersion: "a"})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{Provision: true, Conn: bus.ConnOptions{URL: url}, Log: bustest.TestLogger(t, "debug")})
	}()
	if err := stack.WaitReady(ctx, bus.ConnOptions{URL: url}, stack.Services); err != nil {
		t.Fatal(err)
	}
	e := &env{url: url, planner: schema.Engine{URL: pu}, actor: schema.Engine{URL: au}, world: sim.DefaultWorld()}
	const n = 702
	tasks := e.tasks(2, 1, n)
	results := make(chan outcome, 1)
	go func() { results <- e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, nil, false) }()
	// Restart NATS once the rollout has started, on the same port and store.
	b := bustest.Bus(t, url, "observer")
	eventually(t, "the rollout started", func() bool {
		m, err := b.LastMsg(ctx, bus.StreamRollout, fmt.Sprintf("rollout.%d.start", n))
		return err == nil && m != nil
	})
	srv.Stop()
	time.Sleep(2 * time.Second) // down long enough for every client to notice
	srv, err = embedded.Start(embedded.Options{Dir: dir, Port: portNum, Name: "restarting"})
	if err != nil {
		t.Fatal(err)
	}
	var o outcome
	select {
	case o = <-results:
	case err := <-served:
		// A service that fails stops the others: nothing would end the rollout.
		t.Fatalf("the services stopped across the restart: %v", err)
	}
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != len(tasks) {
		bustest.DumpGoroutines(t)
		t.Fatalf("across the restart: planner %v, actor %v, %+v", o.perr, o.aerr, o.planner)
	}
	cancel()
	<-served
}

// TestNoConsumerPerWait: waiting for results and assembling them creates no
// JetStream consumer, so back-to-back rollouts do not run into the
// server's limit of consumers per stream (it did after ~430).
func TestNoConsumerPerWait(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 65}, actor: sim.Config{Seed: 66}})
	ctx := context.Background()
	consumers := func() map[string][]string {
		out := map[string][]string{}
		for _, stream := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamTimeout, bus.StreamTrainer(schema.RolePlanner), bus.StreamTrainer(schema.RoleActor)} {
			st, err := e.bus.JS.Stream(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			for name := range st.ConsumerNames(ctx).Name() {
				out[stream] = append(out[stream], name)
			}
			slices.Sort(out[stream])
		}
		return out
	}
	for i := range 12 {
		n := int64(710 + i)
		o := <-e.start(t, n, e.tasks(2, 1, n), nil)
		if o.perr != nil || o.aerr != nil {
			t.Fatalf("rollout %d: %v %v", n, o.perr, o.aerr)
		}
	}
	want := map[string][]string{
		bus.StreamRollout:                     {sessionstore.Name},
		bus.StreamPlan:                        {actdispatcher.Name + "-plan", "plan-parser", plannergateway.Name},
		bus.StreamTimeout:                     {sessionstore.Name + "-timeout"},
		bus.StreamTrainer(schema.RolePlanner): {sessionstore.Name + "-planner"},
		bus.StreamTrainer(schema.RoleActor):   {sessionstore.Name + "-actor"},
	}
	if got := consumers(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("consumers after 12 rollouts: %v, want only the services' durables %v", got, want)
	}
}

// TestNothingLeftAfterRetention: when a rollout ends its run state, task
// list and task object go; its result objects go after the result
// retention; its session (the record of how it ended) and its messages go
// after the history. Nothing is left.
func TestNothingLeftAfterRetention(t *testing.T) {
	t.Parallel()
	// The history outlasts the rollout's deadlines (barrier + rollout <
	// history), which leave a healthy rollout time on a loaded machine.
	keep := bus.Provisioning{History: 16 * time.Second, ResultRetention: 2 * time.Second, DupeWindow: time.Second}
	e := startSem(t, semOptions{planner: sim.Config{Seed: 67}, actor: sim.Config{Seed: 68}, keep: keep, inline: 1})
	ctx := context.Background()
	const n = 720
	planner, actor := e.trainer(t), e.trainer(t)
	planner.InlineTasksLimit = 1 // the task list goes through the object store
	cfg := &schema.Config{BarrierTimeoutS: 3, RolloutTimeoutS: 12}
	o := e.rollout(t, planner, actor, n, e.tasks(3, 1, n), cfg, false)
	if o.perr != nil || o.aerr != nil || o.planner.SamplesObject == "" {
		t.Fatalf("rollout: %v %v (samples object %q)", o.perr, o.aerr, o.planner.SamplesObject)
	}
	// A listing whose messages age out or are deleted while it runs never
	// ends: nats.go's watcher waits for as many as were pending when it
	// began (it hung a hunt run for 12 minutes). So each listing has 5 s,
	// and one cut short says so (ok false): the condition asks again.
	keys := func(kv *bus.Bucket) (out []string, ok bool) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ks, err := kv.ListKeys(lctx)
		if err != nil {
			return nil, false
		}
		for k := range ks.Keys() {
			out = append(out, k)
		}
		return out, lctx.Err() == nil
	}
	// counts adds up the objects of the stores, or says it could not.
	counts := func(stores ...jetstream.ObjectStore) (int, bool) {
		n := 0
		for _, store := range stores {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			list, err := store.List(lctx)
			cancel()
			switch {
			case errors.Is(err, jetstream.ErrNoObjectsFound):
			case err != nil:
				return 0, false
			default:
				n += len(list)
			}
		}
		return n, true
	}
	// At once: run state, tasks and task object are gone; the session and
	// the results remain.
	eventually(t, "the run state and the tasks removed", func() bool {
		// The roles' states (role.planner, role.actor: their newest weights,
		// a pause) outlive rollouts.
		all, ok1 := keys(e.bus.Sessions)
		runs, ok2 := keys(e.bus.Runs)
		tasks, ok3 := counts(e.bus.Tasks[schema.RolePlanner], e.bus.Tasks[schema.RoleActor])
		sessions := slices.DeleteFunc(all, func(k string) bool { return strings.HasPrefix(k, "role.") })
		return ok1 && ok2 && ok3 && len(runs) == 0 && tasks == 0 && slices.Equal(sessions, []string{fmt.Sprint(n)})
	})
	// The result objects stay until the retention has passed since the
	// rollout ended (retire refuses earlier). Under load the cleanup above
	// can itself take longer than the retention, and so can the count: it
	// is held only while the clock, read after it, says the retention is
	// not over (read before it, the retention could pass while the stores
	// were listed).
	sess, _, found, err := bus.GetFresh[schema.Session](ctx, e.bus.Sessions, schema.SessionKey(n))
	if err != nil || !found || sess.FinishedMs == 0 {
		t.Fatalf("session %d: found %v, finished at %d ms: %v", n, found, sess.FinishedMs, err)
	}
	got, ok := counts(e.bus.Results[schema.RolePlanner], e.bus.Results[schema.RoleActor])
	if counted := time.Now(); ok && got != 2 && counted.Before(time.UnixMilli(sess.FinishedMs).Add(keep.ResultRetention)) {
		t.Errorf("%d result objects %v after the rollout ended, want 2 until the retention (%v) has passed", got, counted.Sub(time.UnixMilli(sess.FinishedMs)), keep.ResultRetention)
	}
	// After the result retention, the result objects.
	eventually(t, "the result objects removed", func() bool {
		got, ok := counts(e.bus.Results[schema.RolePlanner], e.bus.Results[schema.RoleActor])
		return ok && got == 0
	})
	// After the history, the session and every message.
	// messages adds up the messages of the streams, or says it could not
	// (a stream's info not answered within its 5 s, under a CPU hog once).
	messages := func(streams ...string) (uint64, bool) {
		n := uint64(0)
		for _, stream := range streams {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := e.bus.JS.Stream(lctx, stream)
			var info *jetstream.StreamInfo
			if err == nil {
				info, err = st.Info(lctx)
			}
			cancel()
			if err != nil {
				return 0, false
			}
			n += info.State.Msgs
		}
		return n, true
	}
	eventually(t, "the session and the history expired", func() bool {
		msgs, ok1 := messages(bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamTimeout, bus.StreamTrainer(schema.RolePlanner),
			bus.StreamTrainer(schema.RoleActor), "KV_"+bus.BucketSession, "KV_"+bus.BucketRuns)
		left, ok2 := keys(e.bus.Sessions)
		return ok1 && ok2 && msgs == 0 && len(left) == 0
	})
}

// TestWatchdogAsksThePlannerAgain: the first plan request of an episode is
// lost (the planner-gateway's consumer passes over it: PLAN itself cannot
// be purged). Nothing would ever happen to the episode; the watchdog sees
// it make no progress and asks the planner again, logged and counted.
func TestWatchdogAsksThePlannerAgain(t *testing.T) {
	e := startSem(t, semOptions{planner: sim.Config{Seed: 69}, actor: sim.Config{Seed: 70}, scripted: true, stall: time.Second, slack: time.Second})
	ctx := context.Background()
	const n = 730
	before := testutil.ToFloat64(telemetry.Recoveries.WithLabelValues(actdispatcher.Name, "plan-request"))
	// A request in the stream is a planner turn that may be running: the
	// watchdog gives it the planner's time-out (3 s: the turn asked again
	// ends within it on a loaded machine) and its slack (here 1s).
	results := e.start(t, n, e.tasks(1, 1, n), &schema.Config{PlannerTimeoutS: 3})
	eventually(t, "the first plan request", func() bool { return e.count(t, bus.StreamPlan, fmt.Sprintf("plan.%d.req.0", n)) == 1 })
	gwc := plannergateway.Consumers(plannergateway.Deps{})[0]
	if err := e.bus.JS.DeleteConsumer(ctx, gwc.Stream, gwc.Durable); err != nil {
		t.Fatal(err)
	}
	cfg := gwc.Config()
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	if _, err := e.bus.JS.CreateConsumer(ctx, gwc.Stream, cfg); err != nil {
		t.Fatal(err)
	}
	gw := startService(t, e.url, plannergateway.Name)
	defer gw()
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != 1 {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	if after := testutil.ToFloat64(telemetry.Recoveries.WithLabelValues(actdispatcher.Name, "plan-request")); after <= before {
		t.Errorf("the watchdog's recoveries were not counted (%v -> %v)", before, after)
	}
}

// TestWatchdogTakesOverALostTurn: the act-dispatcher recorded a turn's
// first nodes as released and crashed, and the plan that made it the
// turn's runner was acknowledged (lost): nothing would ever run the acts.
// The watchdog finds the episode without progress and hands the turn over;
// the episode ends, with one outcome and one sample per act.
func TestWatchdogTakesOverALostTurn(t *testing.T) {
	e := startSem(t, semOptions{planner: sim.Config{Seed: 71}, actor: sim.Config{Seed: 72}, stall: time.Second})
	ctx := context.Background()
	const n = 731
	e.stop()
	e.names = slices.DeleteFunc(slices.Clone(stack.Services), func(s string) bool { return s == actdispatcher.Name })
	e.serve(t)
	// Short acts: the watchdog gives acts in flight their time-out and
	// retries before it calls them lost (3 s: a healthy act, run again,
	// ends within it on a loaded machine).
	results := e.start(t, n, e.tasks(1, 1, n), &schema.Config{ActTimeoutS: 3, ActRetries: -1})
	dag := fmt.Sprintf("plan.%d.dag.0", n)
	eventually(t, "a plan", func() bool { return e.count(t, bus.StreamPlan, dag) == 1 })
	m, err := e.bus.LastMsg(ctx, bus.StreamPlan, dag)
	if err != nil {
		t.Fatal(err)
	}
	var d schema.PlanDAG
	if err := schema.Unmarshal(m.Data, &d); err != nil {
		t.Fatal(err)
	}
	// What the crashed dispatcher left: the run state with the plan's first
	// nodes released...
	run := schema.Run{Rollout: n, Episode: 0, Turn: d.Turn, Schedule: schema.ScheduleEager, Complete: true}
	released := 0
	for _, node := range d.Plan.Nodes {
		ns := &schema.NodeState{Node: node, Key: subject.NodeKey(d.Turn, node.ID), Status: schema.NodePending}
		if len(node.Deps) == 0 {
			ns.Status, ns.Input = schema.NodeReleased, node.Input()
			released++
		}
		run.Nodes = append(run.Nodes, ns)
	}
	if released == 0 {
		t.Fatalf("plan %+v has no node to release", d.Plan)
	}
	if _, err := bus.Create(ctx, e.bus.Runs, schema.RunKey(n, 0, d.Turn), &run); err != nil {
		t.Fatal(err)
	}
	// ...and the plan acknowledged, so it is not handled again.
	cons, err := e.bus.JS.CreateOrUpdateConsumer(ctx, bus.StreamPlan, jetstream.ConsumerConfig{
		Durable: actdispatcher.Name + "-plan", AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubjects: []string{subject.AllPlanDAG, subject.AllPlanAnswer, subject.AllPlanError},
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := testutil.ToFloat64(telemetry.Recoveries.WithLabelValues(actdispatcher.Name, "run"))
	e.stop()
	e.names = stack.Services
	e.serve(t)
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	if after := testutil.ToFloat64(telemetry.Recoveries.WithLabelValues(actdispatcher.Name, "run")); after <= before {
		t.Errorf("the watchdog did not drive the run on (recoveries %v -> %v)", before, after)
	}
	seen := map[string]bool{}
	for _, s := range o.actor.Samples {
		key := fmt.Sprint(s.Metadata["key"])
		if seen[key] {
			t.Errorf("act %s has two samples", key)
		}
		seen[key] = true
	}
	for _, ns := range run.Nodes {
		if ns.Status == schema.NodeReleased && !seen[ns.Key] {
			t.Errorf("the lost act %s has no sample", ns.Key)
		}
	}
}

// startService runs one more service against url; the returned function
// stops it.
func startService(t *testing.T, url, name string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// What it needs is provisioned: it only opens it, as `planact
		// serve` does.
		done <- stack.Serve(ctx, []string{name}, stack.Options{Conn: bus.ConnOptions{URL: url}, Log: bustest.Logger()})
	}()
	return func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

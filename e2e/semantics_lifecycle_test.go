package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// TestSemanticsBarrierTimeout: a role whose partner never arrives gets a
// timeout result and the client reports client.ErrTimeout, also when the
// services were down while the deadline passed.
func TestSemanticsBarrierTimeout(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	c := e.trainer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := &schema.Config{BarrierTimeoutS: 1}
	res, err := c.Rollout(ctx, &schema.Arrive{Rollout: 261, Role: schema.RolePlanner, Engine: e.planner,
		Tasks: []schema.Task{e.question(0, population("France"))}, Config: cfg}, 0)
	if !errors.Is(err, client.ErrTimeout) || res == nil || res.Status != schema.ResultTimeout {
		t.Fatalf("planner alone: %v, %+v; want a timeout result and client.ErrTimeout", err, res)
	}
	// The actor never arrived: no result is published for it.
	if k := e.count(t, bus.StreamRollout, subject.Result(261, schema.RoleActor)); k != 0 {
		t.Errorf("the role that never arrived got %d results", k)
	}
	// When it does arrive, late, it is told at once that the rollout is over.
	res, err = c.Rollout(ctx, &schema.Arrive{Rollout: 261, Role: schema.RoleActor, Engine: e.actor}, 0)
	if !errors.Is(err, client.ErrTimeout) || res == nil || res.Status != schema.ResultTimeout || !strings.Contains(res.Reason, "arrived after") {
		t.Fatalf("late actor: %v, %+v; want a timeout result saying it came late", err, res)
	}

	// The session-store is down when the deadline passes; the scheduled
	// message waits in the stream and the restarted services act on it.
	// The services must stop before the 1 s deadline passes; on a loaded
	// machine they may not, and then the live session-store rightly times
	// the rollout out first: the scenario is run again with twice the time.
	n := int64(262)
	for barrier := 1.0; ; barrier, n = barrier*2, n+1 {
		a := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, Config: &schema.Config{BarrierTimeoutS: barrier}}
		if err := c.Arrive(ctx, a); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the arrival to be recorded and its time-out scheduled", func() bool {
			s, found := e.session(t, n)
			return found && s.State == schema.SessionWaiting &&
				e.count(t, bus.StreamTimeout, subject.TimeoutSchedule(n, schema.TimeoutBarrier)) > 0
		})
		e.stop()
		s, _ := e.session(t, n)
		if s.State == schema.SessionWaiting {
			break
		}
		// Only the barrier time-out may have moved it on. Which it was is
		// the session's word, not a comparison of this process's clock
		// with the deadline the session-store stored: a clock stepped
		// between the two would make that fail.
		if s.State != schema.SessionTimeout || !strings.HasPrefix(s.Reason, "barrier time-out") || barrier >= 16 {
			t.Fatalf("session %d %s (%q) when the services stopped; want it waiting, or timed out at its barrier", n, s.State, s.Reason)
		}
		t.Logf("rollout %d: the services stopped after its barrier deadline (%s); again with a %gs barrier", n, s.State, barrier*2)
		e.serve(t)
	}
	eventually(t, "the barrier time-out to fire while the services are down", func() bool {
		return e.count(t, bus.StreamTimeout, subject.Timeout(n, schema.TimeoutBarrier)) > 0
	})
	if s, _ := e.session(t, n); s.State != schema.SessionWaiting {
		t.Fatalf("session %s while the services were down", s.State)
	}
	e.serve(t)
	res, err = c.Result(ctx, n, schema.RoleActor)
	if !errors.Is(err, client.ErrTimeout) || res.Status != schema.ResultTimeout {
		t.Fatalf("after a restart: %v, %+v", err, res)
	}
}

// TestSemanticsRolloutTimeout: a rollout past its deadline ends with the
// samples of the episodes that ended (partial), or timeout when none did;
// the acts still hanging are abandoned.
func TestSemanticsRolloutTimeout(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	none := e.start(t, 272, []schema.Task{e.question(0, population("Spain"), sim.FaultActorHang)}, &schema.Config{RolloutTimeoutS: 2})
	// Episode 0 must end before the deadline for the result to be partial.
	// On a loaded machine it may not: then the rollout is a timeout with
	// nothing in it (checked to say so), and a longer deadline is tried.
	var p outcome
	var n int64
	for timeout := 2; ; timeout *= 2 {
		n = int64(2700 + timeout)
		p = <-e.start(t, n, []schema.Task{e.question(0, population("France")), e.question(1, population("Germany"), sim.FaultActorHang)}, &schema.Config{RolloutTimeoutS: float64(timeout)})
		if p.planner.Status != schema.ResultTimeout || timeout >= 32 {
			break
		}
		if len(p.planner.Samples) != 0 || p.planner.Stats.Ended != 0 || p.planner.Stats.EpisodeStatus["unfinished"] != 2 {
			t.Fatalf("rollout %d timed out, yet: samples %d, stats %+v", n, len(p.planner.Samples), p.planner.Stats)
		}
		t.Logf("rollout %d: no episode ended within its %ds (a loaded machine); trying a longer deadline", n, timeout)
	}
	if p.perr != nil || p.planner.Status != schema.ResultPartial || p.actor.Status != schema.ResultPartial {
		t.Fatalf("partial: %v %+v", p.perr, p.planner)
	}
	if len(p.planner.Samples) != 1 || p.planner.Samples[0].RolloutID != fmt.Sprintf("%d-0", n) || p.planner.Stats.EpisodeStatus["unfinished"] != 1 {
		t.Errorf("partial: samples %d, stats %v", len(p.planner.Samples), p.planner.Stats.EpisodeStatus)
	}
	for _, s := range p.actor.Samples {
		if s.RolloutID != fmt.Sprintf("%d-0", n) {
			t.Errorf("partial: actor sample of unfinished episode %s", s.RolloutID)
		}
	}
	if o := <-none; !errors.Is(o.perr, client.ErrTimeout) || !errors.Is(o.aerr, client.ErrTimeout) || o.planner.Status != schema.ResultTimeout {
		t.Errorf("no episode ended: %v %v %+v", o.perr, o.aerr, o.planner)
	}
	eventually(t, "the hanging acts to be abandoned", func() bool { return e.turnConsumer(t).NumAckPending == 0 })
	d := e.dones(t, n)
	if _, ok := d["1/t1-s1"]; ok {
		t.Errorf("the abandoned act published an outcome")
	}
}

// TestSemanticsCancelWhileNextRuns: rollout N is running (one act hangs)
// when rollout N+1 arrives and completes; eager scheduling runs a node whose
// dependency is done while its sibling still hangs; then the trainer cancels
// N: both roles get aborted with the finished episode's samples, and the
// hanging act is abandoned, not retried.
func TestSemanticsCancelWhileNextRuns(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	const n = 281
	compare := "Which capital has the larger population, the capital of Japan or the capital of China?"
	running := e.start(t, n, []schema.Task{e.question(0, population("Norway")), e.question(1, compare, sim.FaultActorHang)},
		&schema.Config{Schedule: schema.ScheduleEager, ActTimeoutS: 30, ActRetries: 3})
	eventually(t, "episode 0 to end and episode 1's other branch to finish", func() bool {
		_, ok := e.dones(t, n)["1/t1-s4"]
		return ok && e.episodeEnded(t, n, 0)
	})
	if _, ok := e.dones(t, n)["1/t1-s1"]; ok {
		t.Fatal("the hanging act finished")
	}
	// Eager: s4 (after s2) ran while s1, of the same level as s2, still runs.

	next := e.question(0, population("Egypt"))
	o := e.rollout(t, e.trainer(t), e.trainer(t), n+1, []schema.Task{next}, nil, true)
	checkResults(t, n+1, []schema.Task{next}, o, true)
	if s, _ := e.session(t, n); s.State != schema.SessionRunning {
		t.Fatalf("rollout %d is %s; it should still run while %d completed", n, s.State, n+1)
	}

	if err := e.trainer(t).Cancel(context.Background(), n, schema.RolePlanner, "trainer stopped"); err != nil {
		t.Fatal(err)
	}
	r := <-running
	if r.perr != nil || r.aerr != nil {
		t.Fatalf("cancel: %v %v", r.perr, r.aerr)
	}
	for _, res := range []*schema.Result{r.planner, r.actor} {
		if res.Status != schema.ResultAborted || !strings.Contains(res.Reason, "trainer stopped") {
			t.Errorf("%s: %s (%s), want aborted", res.Role, res.Status, res.Reason)
		}
	}
	if len(r.planner.Samples) != 1 || r.planner.Samples[0].RolloutID != "281-0" {
		t.Errorf("aborted: %d planner samples", len(r.planner.Samples))
	}
	for _, s := range r.actor.Samples {
		if s.RolloutID != "281-0" {
			t.Errorf("aborted: actor sample of unfinished episode %s", s.RolloutID)
		}
	}
	eventually(t, "the hanging act to be abandoned", func() bool { return e.turnConsumer(t).NumAckPending == 0 })
	if _, ok := e.dones(t, n)["1/t1-s1"]; ok {
		t.Errorf("the abandoned act published an outcome")
	}
}

// TestSemanticsTurnRedelivery: a turn's plan published again after the
// turn finished runs nothing again, and a turn whose dispatcher stops while
// an act runs is taken over on redelivery, its act run again; either way
// one outcome, one sample.
func TestSemanticsTurnRedelivery(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	const n = 291
	running := e.start(t, n, []schema.Task{e.question(0, population("Egypt")), e.question(1, population("Kenya"), sim.FaultActorHang)},
		&schema.Config{ActTimeoutS: 30})
	eventually(t, "episode 0 to end", func() bool { return e.episodeEnded(t, n, 0) })

	st, err := e.bus.JS.Stream(context.Background(), bus.StreamPlan)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := st.GetLastMsgForSubject(context.Background(), subject.PlanDAG(n, 0))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := e.actorEngine.Stats()
	again := nats.NewMsg(plan.Subject)
	again.Data, again.Header = plan.Data, plan.Header
	again.Header.Set(jetstream.MsgIDHeader, "published-again")
	if _, err := e.bus.JS.PublishMsg(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the plan to be handled", func() bool {
		info := e.turnConsumer(t)
		return info.NumPending == 0 && info.NumAckPending == 1 // only the hanging act's turn
	})
	if after, _ := e.actorEngine.Stats(); after != before {
		t.Errorf("the act ran again: %d generations", after-before)
	}
	if k := e.count(t, bus.StreamAct, subject.ActDone(n, 0, "t1-s1")); k != 1 {
		t.Errorf("%d outcomes for one act", k)
	}
	if err := e.trainer(t).Cancel(context.Background(), n, schema.RoleActor, ""); err != nil {
		t.Fatal(err)
	}
	r := <-running
	if r.aerr != nil || r.actor.Status != schema.ResultAborted {
		t.Fatalf("%v %+v", r.aerr, r.actor)
	}
	checkOnePerAct(t, r.actor)

	// The services stop while the act hangs (its first call only); the
	// restarted dispatcher gets the turn's plan again and takes it over.
	const m = 292
	generations, _ := e.actorEngine.Stats()
	finished := e.start(t, m, []schema.Task{e.question(0, population("Poland"), sim.FaultTimes(sim.FaultActorHang, 1))}, &schema.Config{ActTimeoutS: 30})
	eventually(t, "the act to hang in the actor engine", func() bool {
		info := e.turnConsumer(t)
		started, _ := e.actorEngine.Stats()
		return info.NumAckPending == 1 && started > generations
	})
	e.stop()
	e.serve(t)
	o := <-finished
	checkResults(t, m, []schema.Task{e.question(0, population("Poland"))}, o, true)
	checkOnePerAct(t, o.actor)
	if k := e.count(t, bus.StreamAct, subject.ActDone(m, 0, "t1-s1")); k != 1 {
		t.Errorf("%d outcomes for one act", k)
	}
	if x := e.dones(t, m)["0/t1-s1"]; x.Status != schema.ActDoneOK {
		t.Errorf("the act of the turn taken over: %s (%s)", x.Status, x.Error)
	}
}

func checkOnePerAct(t *testing.T, res *schema.Result) {
	t.Helper()
	seen := map[string]bool{}
	for _, k := range actorKeys(res) {
		if seen[k] {
			t.Errorf("act %s has two samples", k)
		}
		seen[k] = true
	}
}

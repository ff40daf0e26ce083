package actdispatcher

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// runnerClosed waits until this replica's runner of turn 1 has stopped
// taking plans (an abandoned turn's runner does once it only lets its acts
// run to their end), and returns it.
func runnerClosed(t *testing.T, s *Service) *runner {
	t.Helper()
	key := schema.RunKey(1, 0, 1)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if r := s.runners.get(key); r != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed {
				return r
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the runner of the abandoned turn did not stop taking plans")
	return nil
}

// The runner of an abandoned turn lets its acts run to their end. When its
// replica stops meanwhile (a rolling restart: the handler's context ends),
// the acts are cut without an outcome, and the plan message must go back
// to JetStream (the handler returns an error: nak), so that it is delivered
// again and another replica takes them up, as the abandonment's design
// says. Before, finishAbandoned returned nil once the cut acts had
// returned: the message was acknowledged, nothing took the acts up, their
// generations were lost, and the episode's end waited the whole deadline
// to record them failed (timeout).
func TestAnAbandonedTurnsRunnerThatStopsHandsItsMessageBack(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)
	replica, stop := context.WithCancel(ctx)
	defer stop()

	running := make(chan error, 1)
	go func() {
		running <- s.handleDAG(replica, info, msg(5), planDAG(1, true, 1, search("a", "x")))
	}()
	if key := <-g.started; key != "t1-a" {
		t.Fatalf("the gateway was asked for %s, want t1-a", key)
	}
	finalOutput(t, s, 1)
	if err := s.abandonTurn(ctx, info, 1, 0, 1, "the turn's final output is an answer"); err != nil {
		t.Fatal(err)
	}
	runnerClosed(t, s)
	stop() // the replica stops while t1-a generates
	var err error
	select {
	case err = <-running:
	case <-ctx.Done():
		t.Fatal("the runner of the abandoned turn did not return when its replica stopped")
	}
	if o, oerr := s.outcome(ctx, 1, 0, "t1-a"); oerr != nil || o != nil {
		t.Fatalf("t1-a has outcome %+v (%v); the test means it to be cut without one", o, oerr)
	}
	if err == nil {
		t.Error("the handler of the abandoned turn's plan message returned nil when its replica stopped with t1-a cut without an outcome: " +
			"the message is acknowledged, and nothing takes t1-a up")
	}
}

// A node of a partial plan that repeats a call of another node of its turn
// still running waits for that act's result (it is released, cached from
// it). When the turn is abandoned and the act ends after, the waiter must
// get its outcome as it would have in a turn that finished (cached, with
// the act's output) and be listed: the episode's end lists every act
// released (docs/architecture.md), and the session-store counts it among
// the cached acts. Before, only a runner that happened to take the act's
// outcome before it saw the abandonment published the waiter's; otherwise
// the waiter never had an outcome and the end left it out: what the end
// listed depended on timing.
func TestAnAbandonedTurnsWaiterGetsItsOutcomeAndIsListed(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)

	running := make(chan error, 1)
	go func() {
		running <- s.handleDAG(ctx, info, msg(5), planDAG(1, true, 1, search("a", "x"), search("b", "x")))
	}()
	if key := <-g.started; key != "t1-a" {
		t.Fatalf("the gateway was asked for %s, want t1-a", key)
	}
	if r, _ := runOf(t, s, 1); r.Nodes[1].Status != schema.NodeReleased || r.Nodes[1].CachedFrom != "t1-a" {
		t.Fatalf("t1-b is %s from %q, want released waiting on t1-a: the test does not set up what it means to", r.Nodes[1].Status, r.Nodes[1].CachedFrom)
	}
	finalOutput(t, s, 1)
	ended := make(chan error, 1)
	go func() { ended <- handleLast(ctx, s, subject.PlanAnswer(1, 0)) }()
	endDecided(t, s, 1, ended)
	runnerClosed(t, s) // the runner saw the abandonment: it resolves no waiter any more
	g.release()
	if err := <-ended; err != nil {
		t.Fatalf("the answer: %v", err)
	}
	if err := <-running; err != nil {
		t.Fatalf("the runner of the abandoned turn: %v", err)
	}
	end := episodeEnd(t, s)
	if want := []string{"t1-a", "t1-b"}; !slices.Equal(end.Acts, want) {
		t.Errorf("the episode's end lists %v, want %v", end.Acts, want)
	}
	o, err := s.outcome(ctx, 1, 0, "t1-b")
	if err != nil {
		t.Fatal(err)
	}
	if o == nil || o.Status != schema.ActCached || o.Output != "out of t1-a" {
		t.Errorf("outcome of t1-b: %+v, want cached with the output of t1-a", o)
	}
}

// An episode whose streamed turn ended in an answer or a parse error waits
// for the acts of its abandoned run, legitimately, until the run's
// deadline: an act's whole budget plus the ack wait from the final output.
// The watchdog must give it that long (as it gives a turn's acts their
// budget), or, when the budget exceeds its stall, it drives the episode on
// while nothing stalled: a recovery counted and warned about at every
// sweep until the deadline, each a handler run that reads the runs and
// publishes the cached outcomes again, for nothing. Without stream_plans
// nothing is abandoned, and the stall stays as it was.
func TestTheWatchdogGivesAnAbandonedTurnsActsTheirDeadline(t *testing.T) {
	s := &Service{Deps: Deps{Stall: time.Minute, RunAckWait: 5 * time.Second, RetryBase: 10 * time.Millisecond}}
	cfg := schema.Config{StreamPlans: true, ActTimeoutS: 120, ActRetries: 3, Tools: []schema.Tool{{Name: "search"}}}.WithDefaults()
	for _, subj := range []string{subject.PlanAnswer(1, 0), subject.PlanError(1, 0)} {
		last := &bus.StoredMsg{Subject: subj}
		if got, want := s.stallFor(cfg, last), s.abandonedFor(cfg); got < want {
			t.Errorf("last message %s of a streamed rollout: the watchdog drives it on after %v, before its abandoned acts' deadline (%v)", subj, got, want)
		}
		plain := cfg
		plain.StreamPlans = false
		if got := s.stallFor(plain, last); got != s.Stall {
			t.Errorf("last message %s without stream_plans: stall %v, want %v as before", subj, got, s.Stall)
		}
	}
}

// The runner of an abandoned turn stops the acts still running at the
// turn's deadline, and is done with the turn then: the episode's end
// records those acts failed (timeout), so the plan message is acknowledged
// (the handler returns nil), not handed back to run them again past it.
func TestAnAbandonedTurnsRunnerIsDoneAtTheDeadline(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)

	running := make(chan error, 1)
	go func() {
		running <- s.handleDAG(ctx, info, msg(5), planDAG(1, true, 1, search("a", "x")))
	}()
	if key := <-g.started; key != "t1-a" {
		t.Fatalf("the gateway was asked for %s, want t1-a", key)
	}
	// The abandonment, with a short deadline, is recorded before the
	// final output is there: the runner, finding that output, takes the
	// abandonment recorded. (The other way round, a runner that looked in
	// between would record its own, with an act's whole budget.)
	now := time.Now()
	if _, _, err := bus.Mutate(ctx, s.Bus.Runs, schema.RunKey(1, 0, 1), func(r *schema.Run, _ bool) (bool, error) {
		r.Abandoned = &schema.Abandonment{AtMs: now.UnixMilli(), UntilMs: now.Add(300 * time.Millisecond).UnixMilli(), Why: "the turn's final output is an answer"}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	finalOutput(t, s, 1)
	select {
	case err := <-running:
		if err != nil {
			t.Errorf("the runner of the abandoned turn at its deadline: %v, want nil (done with the turn)", err)
		}
	case <-ctx.Done():
		t.Fatal("the runner of the abandoned turn did not stop at its deadline")
	}
}

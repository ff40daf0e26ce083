package actdispatcher

import (
	"errors"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// A plan of a turn handled on the replica that runs the turn is handed to
// its runner, and its message is acknowledged. When the runner stops
// before it has recorded that plan (an act's outcome could not be
// published, the replica stops), the plan must still be recorded: the
// turn's plan message, delivered again, goes on from the run, and the
// stream's last plan message may be a partial one parsed after the final
// plan. Before, the handler acknowledged the plan as soon as the runner
// took it: the final plan was lost with the runner, the run never
// completed, and the watchdog handed the turn over again and again with
// the partial plan until the rollout's deadline.
func TestAPlanHandedToARunnerThatStopsIsRecorded(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)
	a, b := search("a", "x"), search("b", "y")
	running := make(chan error, 1)
	go func() { running <- s.handleDAG(ctx, info, msg(5), planDAG(1, true, 1, a)) }()
	if key := <-g.started; key != "t1-a" {
		t.Fatalf("the gateway was asked for %s first, want t1-a", key)
	}
	r := s.runners.get(schema.RunKey(1, 0, 1))
	if r == nil {
		t.Fatal("no runner of the turn")
	}
	// The runner stops at its next step, as when an act's outcome could
	// not be published: before it merges the final plan handed to it.
	lost := errors.New("an act's outcome could not be published")
	r.mu.Lock()
	r.halt = lost
	r.mu.Unlock()
	if err := s.handleDAG(ctx, info, msg(6), planDAG(1, false, 0, a, b)); err != nil {
		t.Fatalf("the final plan's handler: %v", err)
	}
	if err := <-running; !errors.Is(err, lost) {
		t.Fatalf("the runner ended with %v, want %v (the turn handed back)", err, lost)
	}
	run, _ := runOf(t, s, 1)
	if !run.Complete || byID(&run)["b"] == nil {
		t.Errorf("the final plan's message was acknowledged, and the run is complete %v with nodes %v: the final plan is lost", run.Complete, keys(run.Nodes))
	}
}

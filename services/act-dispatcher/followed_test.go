package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A streamed turn's final plan merged into its run by another replica's
// handler after this runner read the run, and before it followed the
// turn's plan subject, reaches it by no subscription; and the stream's last
// plan may be a partial one, parsed after the final plan. The runner reads
// the run from the leader once it follows: before, it went on with the
// run it had read, incomplete, and waited for the rest of the turn until
// the watchdog handed the turn over (holding its plan message, and its
// slot, until its rollout ended).
func TestARunnerFindsThePlanMergedBeforeItFollowed(t *testing.T) {
	t.Parallel()
	s, info, g, ctx := streamedTurn(t)
	g.release() // the gateway answers at once
	cfg := info.Session.Config
	key := schema.RunKey(1, 0, 1)
	a, b := search("a", "x"), search("b", "y")
	r := record(t, s, info, 5, planDAG(1, true, 1, a)) // as runner 5 read it
	_, rev := runOf(t, s, 1)
	if _, _, err := bus.Mutate(ctx, s.Bus.Runs, key, func(v *schema.Run, _ bool) (bool, error) {
		changed, _ := applyPlan(v, true, planDAG(1, false, 0, a, b), cfg.Schedule, cfg.FailurePolicy)
		return changed, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []schema.Message{
		&schema.PlanRequest{Rollout: 1, Episode: 0, Turn: 1},
		&schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 1, Text: "a, b"},
		planDAG(1, false, 0, a, b), planDAG(1, true, 2, a),
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	done(t, s, 1, a)
	log := s.Log
	runner := &runner{s: s, info: info, key: key, seq: 5, prior: map[string]priorAct{}, log: &log, run: *r, rev: rev,
		known: map[string]*schema.ActDone{}, mine: map[string]bool{}, wake: make(chan struct{}, 1), ended: make(chan struct{})}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- runner.runTurn(rctx, nil) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if run, _ := runOf(t, s, 1); run.Finished {
			break
		}
		if time.Now().After(deadline) {
			run, _ := runOf(t, s, 1)
			t.Fatalf("the runner has not finished the turn, its final plan merged by another replica (run complete %v, nodes %v)", run.Complete, keys(run.Nodes))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-ran; err != nil {
		t.Errorf("the runner: %v", err)
	}
}

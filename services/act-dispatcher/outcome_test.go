package actdispatcher_test

import (
	"testing"

	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
)

// An act whose outcome cannot be published (the stream did not answer: a
// NATS leader crashed) must not leave its turn waiting for ever: the runner
// hands the turn back, the plan message comes again, and the act runs
// again. (Seen in chaos runs: the runner waited, holding the turn in
// progress, until the rollout's deadline.)
func TestLostOutcomeIsRunAgain(t *testing.T) {
	failed, undo := actdispatcher.FailOutcomePublishes(1)
	defer undo()
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	tasks := stacktest.Tasks(1, 1, 3)
	env.Begin(t, 1, tasks, &schema.Config{MaxTurns: 3, RolloutTimeoutS: 60})
	res := env.Wait(t, 1)
	if failed() != 1 {
		t.Fatalf("%d outcome publishes failed, want 1: the test did not break what it meant to", failed())
	}
	if res.Status != schema.ResultOK || res.Stats.EpisodeStatus[schema.EpisodeCompleted] != 1 {
		t.Fatalf("rollout: %s (%s), episodes %v; want ok with its episode completed", res.Status, res.Reason, res.Stats.EpisodeStatus)
	}
}

package e2e

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestDeadActorEngine: the actor's engine does not answer, so no act
// produces a sample. The planner's episodes still end (its acts failed,
// the planner answered without them) and its result is ok with its
// samples; the actor's result is failed, says why (the act failures), and
// no task is trained for it: each failed, naming its acts' failure.
func TestDeadActorEngine(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 41}, actor: sim.Config{Seed: 42}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 971
	tasks := e.tasks(4, 1, n)
	cfg := &schema.Config{ActRetries: -1, MaxTurns: 2}
	dead := schema.Engine{URL: "http://127.0.0.1:1", Protocol: "sglang"} // nothing listens on port 1
	var o outcome
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		o.planner, o.perr = e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks, Config: cfg}, 0)
	}()
	go func() {
		defer wg.Done()
		o.actor, o.aerr = e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: dead}, 0)
	}()
	wg.Wait()
	if o.perr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != len(tasks) || o.planner.Stats.TaskStates[schema.TaskTrained] != len(tasks) {
		t.Fatalf("planner: %v, %s (%s), %d samples, tasks %v", o.perr, o.planner.Status, o.planner.Reason, len(o.planner.Samples), o.planner.Stats.TaskStates)
	}
	a := o.actor
	t.Logf("actor: %s (%s); task 0: %s", a.Status, a.Reason, a.Tasks[0].Reason)
	if !errors.Is(o.aerr, client.ErrFailed) || a.Status != schema.ResultFailed || len(a.Samples) != 0 {
		t.Fatalf("actor: %v, %s, %d samples; want failed without samples", o.aerr, a.Status, len(a.Samples))
	}
	if !strings.Contains(a.Reason, "the actor got no sample of 4 of 4 tasks") || !strings.Contains(a.Reason, "of their acts failed (") {
		t.Errorf("actor reason %q: want it to name the act failures", a.Reason)
	}
	if a.Stats.TaskStates[schema.TaskFailed] != len(tasks) || len(a.Stats.TaskStates) != 1 || a.Stats.Failures[schema.ActErrTransient] == 0 {
		t.Errorf("actor stats: tasks %v, failures %v; want every task failed, the act errors counted", a.Stats.TaskStates, a.Stats.Failures)
	}
	for _, out := range a.Tasks {
		if out.State != schema.TaskFailed || !strings.HasPrefix(out.Reason, "no actor sample: ") {
			t.Errorf("actor task %d: %s (%s)", out.Episode, out.State, out.Reason)
		}
	}
	if a.Stats.Tokens[schema.RoleActor] != 0 || a.Stats.Acts != 0 {
		t.Errorf("actor stats claim %d tokens, %d acts", a.Stats.Tokens[schema.RoleActor], a.Stats.Acts)
	}
}

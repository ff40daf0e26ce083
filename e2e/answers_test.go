package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestCancelIsAnswered: every cancel gets an answer. A cancel of a running
// rollout aborts it and returns once planact said so; a second cancel, and
// a cancel of a rollout that completed, are told it had already ended (with
// its status), leaving its results as they were; a cancel of a rollout
// planact does not know is told so.
func TestCancelIsAnswered(t *testing.T) {
	e := startSem(t, semOptions{planner: sim.Config{Seed: 31}, actor: sim.Config{Seed: 32}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	trainer := e.trainer(t)

	const done = 951
	o := <-e.start(t, done, e.tasks(1, 1, done), nil)
	if o.perr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout %d: %v %+v", done, o.perr, o.planner)
	}
	err := trainer.Cancel(ctx, done, schema.RolePlanner, "too late")
	if !errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "had already ended (ok at") {
		t.Fatalf("cancel of a rollout that completed: %v; want ErrNothingToCancel saying it ended ok", err)
	}
	if s, _ := e.session(t, done); s.State != schema.SessionDone || s.Status != schema.ResultOK {
		t.Errorf("after a late cancel the session is %s (%s)", s.State, s.Status)
	}
	if res, err := trainer.Result(ctx, done, schema.RoleActor); err != nil || res.Status != schema.ResultOK {
		t.Errorf("after a late cancel the actor's result is %v %+v", err, res)
	}

	const running = 952
	results := e.start(t, running, []schema.Task{e.question(0, population("Chile"), sim.FaultActorHang)}, &schema.Config{ActTimeoutS: 300})
	eventually(t, "the rollout to run", func() bool {
		s, found := e.session(t, running)
		return found && s.State == schema.SessionRunning
	})
	if err := trainer.Cancel(ctx, running, schema.RoleActor, "preempted"); err != nil {
		t.Fatalf("cancel of a running rollout: %v", err)
	}
	if o := <-results; o.planner == nil || o.planner.Status != schema.ResultAborted || !strings.Contains(o.planner.Reason, "preempted") {
		t.Fatalf("cancelled: %+v", o.planner)
	}
	err = trainer.Cancel(ctx, running, schema.RolePlanner, "")
	if !errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "had already ended (aborted at") ||
		!strings.Contains(err.Error(), "preempted") {
		t.Fatalf("a second cancel: %v; want ErrNothingToCancel saying it was aborted, and why", err)
	}

	err = trainer.Cancel(ctx, 959, schema.RolePlanner, "")
	if !errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "not known") {
		t.Fatalf("cancel of a rollout never seen: %v", err)
	}
}

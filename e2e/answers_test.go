package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// TestCancelIsAnswered: every cancel gets an answer. A cancel of a running
// rollout aborts it and returns once planact said so; a second cancel, and
// a cancel of a rollout that completed, are told it had already ended (with
// its status), leaving its results as they were; a cancel of a rollout
// planact does not know is told so.
func TestCancelIsAnswered(t *testing.T) {
	t.Parallel()
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
	if !errors.Is(err, client.ErrNothingToCancel) || !endedOK(err.Error()) {
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

// TestSecondArrivalThatDisagrees: a role that arrives again asking for
// something else (other tasks, config, engine) is refused, naming what
// differs, and so is the other role bringing another task list; the same
// arrival sent again (another message id, attempt and time; a config that
// spells out a default) is harmless. The rollout runs the first arrival's.
func TestSecondArrivalThatDisagrees(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 33}, actor: sim.Config{Seed: 34}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 961
	tasks := e.tasks(2, 1, n)
	first := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7", Tasks: tasks,
		Config: &schema.Config{MaxTurns: 3}}
	planner := e.trainer(t)
	results := make(chan outcome, 1)
	go func() {
		var o outcome
		o.planner, o.perr = planner.Rollout(ctx, first, 0)
		results <- o
	}()
	eventually(t, "the planner's arrival", func() bool {
		s, found := e.session(t, n)
		_, arrived := s.Roles[schema.RolePlanner]
		return found && arrived
	})

	refused := func(a *schema.Arrive, want ...string) {
		t.Helper()
		res, err := e.trainer(t).Rollout(ctx, a, 0)
		if !errors.Is(err, client.ErrRejected) || res == nil || !res.Rejected {
			t.Fatalf("%s arrival %+v: %v %+v; want it refused", a.Role, a, err, res)
		}
		for _, w := range want {
			if !strings.Contains(res.Reason, w) {
				t.Errorf("refused: %q, want it to name %q", res.Reason, w)
			}
		}
	}
	again := *first
	again.Tasks = e.tasks(3, 1, n)
	refused(&again, "the planner arrived already", "tasks 3 (sha256:")
	again = *first
	again.Config = &schema.Config{MaxTurns: 2}
	refused(&again, "config max_turns 2, was 3")
	again = *first
	again.Engine.URL = "http://127.0.0.1:1/planner"
	again.WeightVersion = "planner-v8"
	refused(&again, `engine.url "http://127.0.0.1:1/planner"`, `weight_version "planner-v8", was "planner-v7"`)
	refused(&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, Tasks: e.tasks(2, 1, n+1)},
		"its task list came with the planner's arrival (2 (sha256:", "this actor arrival brings another")

	// The same arrival sent again: another attempt and time, the config's
	// default plan format spelled out. Harmless: no answer but the result.
	same := *first
	same.Attempt, same.AtMs = "retry", time.Now().UnixMilli()+1
	same.Config = &schema.Config{MaxTurns: 3, PlanFormat: schema.DefaultConfig().PlanFormat}
	if err := e.trainer(t).Arrive(ctx, &same); err != nil {
		t.Fatal(err)
	}
	actor, err := e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, WeightVersion: "actor-v3"}, 0)
	if err != nil || actor.Status != schema.ResultOK {
		t.Fatalf("actor: %v %+v", err, actor)
	}
	o := <-results
	if o.perr != nil || o.planner.Status != schema.ResultOK || len(o.planner.Samples) != len(tasks) ||
		!strings.HasPrefix(o.planner.ArrivalID, "arrive.961.planner..") {
		t.Fatalf("planner: %v, %s (%s), %d samples, arrival %s; want the first arrival's rollout, %d samples",
			o.perr, o.planner.Status, o.planner.Reason, len(o.planner.Samples), o.planner.ArrivalID, len(tasks))
	}
	if k := e.count(t, bus.StreamRollout, subject.Rejected(n, schema.RolePlanner)); k != 3 {
		t.Errorf("%d planner rejections, want 3 (the same arrival sent again is not refused)", k)
	}
	if k := e.count(t, bus.StreamRollout, subject.Rejected(n, schema.RoleActor)); k != 1 {
		t.Errorf("%d actor rejections, want 1", k)
	}
}

// endedOK says whether a cancel's answer says the rollout ended ok: each
// role's result ok, or, while the results' publishing is not yet recorded
// in the session, the status it ended with.
func endedOK(answer string) bool {
	return strings.Contains(answer, "had already ended (at ") && strings.Contains(answer, "the planner's result: ok; the actor's result: ok") ||
		strings.Contains(answer, "had already ended (ok at ")
}

// Package stacktest runs planact for tests of what reads it (the view, the
// web server): an embedded JetStream server, the five services and
// simulated engines, and trainers that start rollouts on it.
package stacktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// Env is a running planact with simulated engines.
type Env struct {
	URL     string
	Planner schema.Engine
	Actor   schema.Engine
	trainer *client.Client
}

// Weight versions the simulated engines and trainers report.
const (
	PlannerVersion = "planner-v7"
	ActorVersion   = "actor-v3"
)

// Start runs planact until the end of the test. planner and actor
// configure the simulated engines (their role and version are set here).
func Start(t *testing.T, planner, actor sim.Config) *Env {
	t.Helper()
	return StartWith(t, planner, actor, stack.Options{})
}

// StartWith is Start with the services run with so (its connection, log
// and provisioning are Start's).
func StartWith(t *testing.T, planner, actor sim.Config, so stack.Options) *Env {
	t.Helper()
	_, url := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	planner.Role, actor.Role = schema.RolePlanner, schema.RoleActor
	planner.WeightVersion, actor.WeightVersion = PlannerVersion, ActorVersion
	pu, err := sim.Serve(ctx, "127.0.0.1:0", planner)
	if err != nil {
		t.Fatal(err)
	}
	au, err := sim.Serve(ctx, "127.0.0.1:0", actor)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	conn := bus.ConnOptions{URL: url}
	go func() {
		so.Provision, so.Conn, so.Log = true, conn, bustest.Logger()
		done <- stack.Serve(ctx, stack.Services, so)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("services: %v", err)
		}
	})
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer rcancel()
	if err := stack.WaitReady(rctx, conn, stack.Services); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return &Env{
		URL:     url,
		Planner: schema.Engine{URL: pu, Protocol: "sglang"},
		Actor:   schema.Engine{URL: au, Protocol: "sglang"},
		trainer: c,
	}
}

// Tasks are n questions of the simulated world, each asked perPrompt times.
func Tasks(n, perPrompt int, seed int64) []schema.Task {
	return demo.Tasks(sim.DefaultWorld(), n, perPrompt, seed, "")
}

// Begin has both trainers arrive for rollout n, without waiting for it.
func (e *Env) Begin(t *testing.T, n int64, tasks []schema.Task, cfg *schema.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pa := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.Planner, WeightVersion: PlannerVersion, Tasks: tasks, Config: cfg}
	aa := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.Actor, WeightVersion: ActorVersion}
	for _, a := range []*schema.Arrive{pa, aa} {
		if err := e.trainer.Arrive(ctx, a); err != nil {
			t.Fatalf("arrive %s: %v", a.Role, err)
		}
	}
}

// Wait waits for both roles' results of rollout n and returns the
// planner's: once it returns, both are stored, and a reader of the streams
// opened after it sees them. (It waited for the planner's alone, and a view
// opened after it sometimes read the actor's result and one opened before
// did not: TestOldRolloutsAreReadAgain, once in about ten runs.)
func (e *Env) Wait(t *testing.T, n int64) *schema.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := e.trainer.Result(ctx, n, schema.RolePlanner)
	if err != nil {
		t.Fatalf("rollout %d: %v", n, err)
	}
	if _, err := e.trainer.Result(ctx, n, schema.RoleActor); err != nil {
		t.Fatalf("rollout %d, the actor's result: %v", n, err)
	}
	return res
}

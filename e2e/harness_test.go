// Package e2e runs whole rollouts through every service on an embedded
// JetStream server, with simulated engines, the way trainers would.
package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/telemetry"
)

// env is a running planact with simulated engines.
type env struct {
	url     string
	planner schema.Engine
	actor   schema.Engine
	world   *sim.World
	// stop stops the services and waits for them (the test's cleanup does
	// too): a test that reads what they exported at exit calls it first.
	stop func()
}

type envOptions struct {
	replicas    map[string]int
	inlineLimit int
	planner     sim.Config
	actor       sim.Config
	tracing     *telemetry.Tracing
	keep        bus.Provisioning // retention (history) of the services
}

func start(t *testing.T, o envOptions) *env {
	t.Helper()
	_, url := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	o.planner.Role, o.actor.Role = schema.RolePlanner, schema.RoleActor
	if o.planner.WeightVersion == "" {
		o.planner.WeightVersion = "planner-v7"
	}
	if o.actor.WeightVersion == "" {
		o.actor.WeightVersion = "actor-v3"
	}
	pu, err := sim.Serve(ctx, "127.0.0.1:0", o.planner)
	if err != nil {
		t.Fatal(err)
	}
	au, err := sim.Serve(ctx, "127.0.0.1:0", o.actor)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- stack.Serve(ctx, stack.Services, stack.Options{Provision: true, Conn: bus.ConnOptions{URL: url}, Log: bustest.TestLogger(t, "info"), Replicas: o.replicas,
			InlineLimit: o.inlineLimit, Tracing: o.tracing, Provisioning: o.keep})
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			// Stopped while still starting, a service reports the cancelled
			// context: that is not a failure.
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("services: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	// Provisioned and listening before the test publishes: a trainer's
	// arrival published (with core NATS, as `nats pub` without -J does)
	// before its stream exists is taken by nothing.
	rctx, rcancel := context.WithTimeout(ctx, patience)
	defer rcancel()
	if err := stack.WaitReady(rctx, bus.ConnOptions{URL: url}, stack.Services); err != nil {
		t.Fatal(err)
	}
	return &env{
		url:     url,
		planner: schema.Engine{URL: pu, Protocol: "sglang"},
		actor:   schema.Engine{URL: au, Protocol: "sglang"},
		world:   sim.DefaultWorld(),
		stop:    stop,
	}
}

// trainer is one training job: its own connection and client.
func (e *env) trainer(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(bustest.Conn(t, e.url))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) tasks(n, perPrompt int, seed int64) []schema.Task {
	return demo.Tasks(e.world, n, perPrompt, seed, "")
}

type outcome struct {
	planner, actor *schema.Result
	perr, aerr     error
}

// rollout has the planner and the actor arrive for rollout n, the actor
// first when actorFirst, and waits for both results.
func (e *env) rollout(t *testing.T, planner, actor *client.Client, n int64, tasks []schema.Task, cfg *schema.Config, actorFirst bool) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var o outcome
	pa := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7", Tasks: tasks, Config: cfg}
	aa := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, WeightVersion: "actor-v3"}
	first, second := pa, aa
	if actorFirst {
		first, second = aa, pa
	}
	// Each role waits for its result once its arrival is made: a client's
	// Result that starts before its Arrive has recorded the arrival has
	// none of its own, and takes any result on the subject, an earlier
	// rollout's of the number too (pkg/client, Result).
	var wg sync.WaitGroup
	for _, a := range []*schema.Arrive{first, second} {
		c, res, failed := planner, &o.planner, &o.perr
		if a.Role == schema.RoleActor {
			c, res, failed = actor, &o.actor, &o.aerr
		}
		if err := c.Arrive(ctx, a); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); *res, *failed = c.Result(ctx, n, a.Role) }()
	}
	wg.Wait()
	if ctx.Err() != nil {
		// The rollout did not end: what every goroutine was doing then,
		// before the test stops the services.
		bustest.DumpGoroutines(t)
	}
	return o
}

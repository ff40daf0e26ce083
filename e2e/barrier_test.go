package e2e

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// TestBarrierRaces: many rollouts, both roles arriving at the same moment
// from several connections, some of them twice. Every rollout starts exactly
// once and both roles get one result.
func TestBarrierRaces(t *testing.T) {
	e := start(t, envOptions{
		planner:  sim.Config{Seed: 5},
		actor:    sim.Config{Seed: 6},
		replicas: map[string]int{"session-store": 2},
	})
	const rollouts = 40
	startedBefore := testutil.ToFloat64(telemetry.RolloutsStarted)
	trainers := []*client.Client{e.trainer(t), e.trainer(t), e.trainer(t), e.trainer(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	results := make([][2]*schema.Result, rollouts)
	var wg sync.WaitGroup
	for i := 0; i < rollouts; i++ {
		n := int64(1000 + i)
		tasks := e.tasks(1, 1, n)
		arrivals := []*schema.Arrive{
			{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks},
			{Rollout: n, Role: schema.RoleActor, Engine: e.actor},
		}
		if i%3 == 0 { // a trainer that retries its arrival
			arrivals = append(arrivals, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, Attempt: "retry"})
		}
		if i%4 == 0 {
			arrivals = append(arrivals, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks, Attempt: "retry"})
		}
		gate := make(chan struct{})
		for k, a := range arrivals {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				if err := trainers[(i+k)%len(trainers)].Arrive(ctx, a); err != nil {
					t.Error(err)
				}
			}()
		}
		for r, role := range []string{schema.RolePlanner, schema.RoleActor} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := trainers[r].Result(ctx, n, role)
				if err != nil {
					t.Errorf("rollout %d %s: %v", n, role, err)
					return
				}
				results[i][r] = res
			}()
		}
		close(gate)
	}
	wg.Wait()
	for i, r := range results {
		for k, res := range r {
			if res == nil {
				continue
			}
			if res.Status != schema.ResultOK || len(res.Samples) == 0 {
				t.Errorf("rollout %d role %d: status %s, %d samples", 1000+i, k, res.Status, len(res.Samples))
			}
		}
		if r[0] != nil && len(r[0].Samples) != 1 {
			t.Errorf("rollout %d: %d planner samples for 1 episode", 1000+i, len(r[0].Samples))
		}
	}
	if started := testutil.ToFloat64(telemetry.RolloutsStarted) - startedBefore; started != rollouts {
		t.Errorf("barrier released %v times for %d rollouts", started, rollouts)
	}
}

// TestRejectedArrivals: an arrival planact cannot use gets a clear error at
// once, and a corrected arrival for the same rollout then runs normally.
func TestRejectedArrivals(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 21}, actor: sim.Config{Seed: 22}})
	planner, actor := e.trainer(t), e.trainer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tasks := e.tasks(1, 1, 70)

	bad := &schema.Arrive{Rollout: 70, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks,
		Config: &schema.Config{FailurePolicy: "ignore"}}
	_, err := planner.Rollout(ctx, bad, 0)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "failure_policy") {
		t.Fatalf("invalid config: %v, want ErrRejected naming failure_policy", err)
	}

	// A body that is not an arrival at all (wrong schema version).
	nc := bustest.Conn(t, e.url)
	body, _ := schema.Marshal(&schema.Arrive{Rollout: 71, Role: schema.RoleActor, Engine: e.actor})
	body = bytes.Replace(body, []byte("rollout.arrive/1"), []byte("rollout.arrive/9"), 1)
	msg := nats.NewMsg(subject.Arrive(71, schema.RoleActor))
	msg.Data = body
	msg.Header.Set(schema.HdrRole, schema.RoleActor)
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	res, err := actor.Result(ctx, 71, schema.RoleActor)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(res.Reason, "rollout.arrive/9") {
		t.Fatalf("undecodable arrival: %v, want ErrRejected naming the version", err)
	}

	// A rollout neither role brought tasks to is refused for both, at once,
	// and stays refused: its trainers are told, not left waiting.
	for _, c := range []*client.Client{planner, actor} {
		role := schema.RoleActor
		if c == planner {
			role = schema.RolePlanner
		}
		go c.Arrive(ctx, &schema.Arrive{Rollout: 72, Role: role, Engine: e.actor})
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		res, err := e.trainer(t).Result(ctx, 72, role)
		if !errors.Is(err, client.ErrRejected) || !strings.Contains(res.Reason, "no tasks") {
			t.Fatalf("%s of a rollout without tasks: %v", role, err)
		}
	}

	// The corrected planner arrival goes through; the rollout runs.
	good := *bad
	good.Config = nil
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		o.planner, o.perr = planner.Rollout(ctx, &good, 0)
		done <- o
	}()
	ares, aerr := actor.Rollout(ctx, &schema.Arrive{Rollout: 70, Role: schema.RoleActor, Engine: e.actor}, 0)
	o := <-done
	if o.perr != nil || aerr != nil || o.planner.Status != schema.ResultOK || ares.Status != schema.ResultOK {
		t.Fatalf("corrected arrival: planner %v %+v, actor %v", o.perr, o.planner, aerr)
	}
	if len(o.planner.Samples) != 1 || len(ares.Samples) == 0 {
		t.Errorf("samples: planner %d actor %d", len(o.planner.Samples), len(ares.Samples))
	}
}

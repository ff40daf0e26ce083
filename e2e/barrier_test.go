package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
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

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/schema"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
	actorgateway "github.com/planact/planact/services/actor-gateway"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// TestEnginesKeptFull: each engine states in its trainer's arrival how many
// generations it serves at once (engine.max_in_flight). planact keeps that
// many in flight on it, never more, whatever --engine-limit says (64 here):
// one replica of each service fills an engine that serves 256, and two
// replicas share the capacity rather than double it. The engines hold
// every generation until the test has seen how many came, so the count
// does not depend on the machine's speed; the rollout is cancelled once
// both were seen full.
func TestEnginesKeptFull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		replicas int
		capacity int
		episodes int
	}{
		{replicas: 1, capacity: 256, episodes: 300},
		{replicas: 2, capacity: 96, episodes: 120},
	} {
		t.Run(fmt.Sprintf("%d replicas, %d at once", tc.replicas, tc.capacity), func(t *testing.T) {
			holdPlanner, holdActor := make(chan struct{}), make(chan struct{})
			var release sync.Once
			releaseAll := func() {
				release.Do(func() {
					for _, c := range []chan struct{}{holdPlanner, holdActor} {
						select {
						case <-c:
						default:
							close(c)
						}
					}
				})
			}
			replicas := map[string]int{plannergateway.Name: tc.replicas, actdispatcher.Name: tc.replicas, actorgateway.Name: tc.replicas}
			e := startCounted(t, countedOptions{
				plannerLoad: enginetest.Options{Hold: holdPlanner},
				actorLoad:   enginetest.Options{Hold: holdActor},
				services:    stack.Options{Replicas: replicas, EngineLimit: 64},
			})
			t.Cleanup(releaseAll) // before the services stop
			e.planner.MaxInFlight, e.actor.MaxInFlight = tc.capacity, tc.capacity
			tasks := e.tasks(tc.episodes, 1, 31)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			planner, actor := e.trainer(t), e.trainer(t)
			const n = 41
			if err := planner.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7", Tasks: tasks}); err != nil {
				t.Fatal(err)
			}
			if err := actor.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, WeightVersion: "actor-v3"}); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := planner.Result(ctx, n, schema.RolePlanner)
				done <- err
			}()
			for _, s := range []struct {
				role string
				eng  *enginetest.Engine
				hold chan struct{}
			}{{schema.RolePlanner, e.plannerEngine, holdPlanner}, {schema.RoleActor, e.actorEngine, holdActor}} {
				waitInFlight(t, s.role, s.eng, tc.capacity, done)
				close(s.hold)
			}
			// Filled: the rest of the rollout is not what this test is about.
			if err := planner.Cancel(ctx, n, schema.RolePlanner, "the engines were seen full"); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil { // an aborted result comes with no error
				t.Fatalf("rollout: %v", err)
			}
			for role, eng := range map[string]*enginetest.Engine{schema.RolePlanner: e.plannerEngine, schema.RoleActor: e.actorEngine} {
				if got := eng.Counts().MaxInFlight; got != tc.capacity {
					t.Errorf("%s engine serving %d at once had at most %d generations in flight", role, tc.capacity, got)
				}
			}
		})
	}
}

// waitInFlight waits until the held engine has want generations in
// flight; it fails when it has more, or when the rollout ends or a minute
// passes first.
func waitInFlight(t *testing.T, role string, eng *enginetest.Engine, want int, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c := eng.Counts()
		switch {
		case c.MaxInFlight > want:
			t.Fatalf("%s engine serving %d at once got %d generations in flight", role, want, c.MaxInFlight)
		case c.InFlight == want:
			return
		case time.Now().After(deadline):
			t.Fatalf("%s engine serving %d at once: planact kept only %d generations in flight (at most %d)", role, want, c.InFlight, c.MaxInFlight)
		}
		select {
		case err := <-done:
			t.Fatalf("rollout ended while the %s engine held its generations: %v", role, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

package plannergateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAPauseAfterTheGenerationKeepsIt: a pause in abort mode that comes
// once the turn's generation has returned (its output in hand, the turn
// still inside the gate) aborts nothing: the output is published, the
// engine is asked once for the turn, and the claim records no retry.
func TestAPauseAfterTheGenerationKeepsIt(t *testing.T) {
	const n = 7
	b, eng, ctx := oneEpisode(t, n)
	ctx, cancel := context.WithCancel(ctx) // stops the service
	defer cancel()
	setRole := func(paused bool, epoch int64) {
		_, _, err := bus.Mutate(ctx, b.Sessions, schema.RoleKey(schema.RolePlanner), func(v *schema.RoleState, _ bool) (bool, error) {
			*v = schema.RoleState{Role: schema.RolePlanner, Paused: paused, Mode: schema.PauseAbort, Epoch: epoch, WeightVersion: "planner-v1"}
			return true, nil
		})
		if err != nil {
			t.Error(err)
		}
	}

	var once sync.Once
	orig := engineReturned
	engineReturned = func(gctx context.Context) {
		once.Do(func() {
			// The pause comes now: the gate aborts the turn's context.
			setRole(true, 1)
			select {
			case <-gctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("the pause did not reach the turn")
			}
			setRole(false, 2)
		})
	}
	t.Cleanup(func() { engineReturned = orig })

	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Deps{Bus: b, Log: bustest.TestLogger(t, "debug"), Engines: &engine.Pool{}, RetryBase: 10 * time.Millisecond})
	}()
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1, WeightVersion: "planner-v1"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, 0))
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			break
		}
		if time.Now().After(deadline) {
			bustest.DumpGoroutines(t)
			t.Fatal("no planner output")
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if got := eng.Counts().Turns(); len(got) != 1 || got["7-0-t1"] != 1 {
		t.Errorf("the engine generated %v, want turn 7-0-t1 once: its output was in hand before the pause", got)
	}
	claim, _, found, err := bus.GetFresh[schema.Claim](context.Background(), b.Runs, schema.ClaimKey(n, 0, 1))
	if err != nil || !found {
		t.Fatalf("the turn's claim: found %v, %v", found, err)
	}
	if len(claim.Retries) != 0 {
		t.Errorf("the claim records retries %+v, want none: nothing was generated again", claim.Retries)
	}
}

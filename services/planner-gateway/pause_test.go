package plannergateway

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestAPauseAfterTheGenerationKeepsIt: a pause in abort mode that comes
// once the turn's generation has returned (its output in hand, the turn
// still inside the gate) aborts nothing: the output is published, the
// engine is asked once for the turn, and the claim records no retry.
func TestAPauseAfterTheGenerationKeepsIt(t *testing.T) {
	const n = 7
	b, eng, ctx := oneEpisode(t, n)
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

	runTurn(t, ctx, b, n)
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

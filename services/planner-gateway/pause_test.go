package plannergateway

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
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
		if err != nil && ctx.Err() == nil { // (ended: the test failed, and is over)
			t.Error(err)
		}
	}

	var once sync.Once
	aborted := make(chan error, 1) // why the turn's context ended
	orig := engineReturned
	engineReturned = func(gctx context.Context) {
		once.Do(func() {
			// The pause comes now: the gate aborts the turn's context. A
			// pause that never reaches the turn holds it here, with no
			// output: runTurn fails, and its end ends gctx.
			setRole(true, 1)
			<-gctx.Done()
			aborted <- context.Cause(gctx)
			setRole(false, 2)
		})
	}
	t.Cleanup(func() { engineReturned = orig })

	runTurn(t, ctx, b, n)
	select {
	case err := <-aborted:
		if !errors.Is(err, session.ErrPaused) {
			t.Fatalf("the turn's context ended with %v, want the pause's abort (%v): the pause did not reach the turn", err, session.ErrPaused)
		}
	default:
		t.Fatal("the turn's engine work never returned inside the gate")
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

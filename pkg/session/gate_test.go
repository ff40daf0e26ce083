package session_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

// TestNothingEntersAPausedGate: a generation that passes the gate is
// registered in the same step, so a pause answered as drained has none
// running and lets none start until the resume; one that entered before
// the pause is waited for (wait mode) or aborted (abort mode).
func TestNothingEntersAPausedGate(t *testing.T) {
	for _, mode := range []string{schema.PauseWait, schema.PauseAbort} {
		t.Run(mode, func(t *testing.T) {
			g := session.NewFollower(nil, zerolog.Nop()).Gate(schema.RoleActor)
			ctx := context.Background()
			// A generation inside the gate (tokenizing, say) when the pause lands.
			gctx, left, err := g.Enter(ctx)
			if err != nil {
				t.Fatal(err)
			}
			g.SetRoleState(schema.RoleState{Role: schema.RoleActor, Paused: true, Mode: mode, Epoch: 1})
			drained := make(chan int, 1)
			go func() {
				aborted, ok := g.Drained(ctx, 1)
				if !ok {
					aborted = -1
				}
				drained <- aborted
			}()
			if mode == schema.PauseAbort {
				<-gctx.Done()
				if !errors.Is(context.Cause(gctx), session.ErrPaused) {
					t.Errorf("aborted with %v, want ErrPaused", context.Cause(gctx))
				}
			} else {
				select {
				case <-drained:
					t.Fatal("drained while a generation was inside the gate")
				case <-time.After(100 * time.Millisecond):
				}
			}
			left()
			if got := <-drained; got < 0 || (mode == schema.PauseAbort) != (got == 1) {
				t.Fatalf("drained: %d aborted", got)
			}
			// Answered: nothing gets in until the resume.
			if _, _, _, ok := g.TryEnter(ctx); ok {
				t.Fatal("a generation entered a paused gate")
			}
			var entered atomic.Bool
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, left, err := g.Enter(ctx)
				if err == nil {
					entered.Store(true)
					left()
				}
			}()
			time.Sleep(50 * time.Millisecond)
			if entered.Load() {
				t.Fatal("Enter passed a paused gate")
			}
			g.SetRoleState(schema.RoleState{Role: schema.RoleActor, Epoch: 2})
			<-done
			if !entered.Load() {
				t.Fatal("Enter did not pass after the resume")
			}
		})
	}
}

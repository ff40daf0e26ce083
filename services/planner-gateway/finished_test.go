package plannergateway

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestACopyOfAFinishedTurnIsNotGeneratedAgain: a copy of a plan request
// (re-issued while the turn ran) looked for the turn's output before its
// holder, this same instance, published it, and claimed the turn after the
// holder's handler had let it go. It found its instance's claim idle and
// nothing left of it, took it on and generated the turn a second time
// (e2e TestATurnAskedAgainWaitsForItsHolder, 2 of 20 runs). A claim taken
// on with nothing left is now checked for the turn's output first.
func TestACopyOfAFinishedTurnIsNotGeneratedAgain(t *testing.T) {
	const n = 31
	b, eng, ctx := oneEpisode(t, n)
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Deps{Bus: b, Log: bustest.TestLogger(t, "debug"), Engines: &engine.Pool{}, RetryBase: 10 * time.Millisecond})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Error(err)
		}
	})
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1, WeightVersion: "planner-v1"}); err != nil {
		t.Fatal(err)
	}
	settled := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			out, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, 0))
			if err != nil {
				t.Fatal(err)
			}
			var info *jetstream.ConsumerInfo
			cons, err := b.JS.Consumer(ctx, bus.StreamPlan, Name) // made by the service as it starts
			if err == nil {
				info, err = cons.Info(ctx)
			}
			if out != nil && err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: output %v, consumer %+v (%v)", what, out != nil, info, err)
			}
		}
	}
	settled("the turn")

	// The copy's first look for the output comes before the holder
	// published it.
	var mu sync.Mutex
	hidden := 1
	orig := lastPlanMsg
	lastPlanMsg = func(ctx context.Context, b *bus.Bus, subj string) (*bus.StoredMsg, error) {
		mu.Lock()
		hide := subj == subject.PlanOut(n, 0) && hidden > 0
		if hide {
			hidden--
		}
		mu.Unlock()
		if hide {
			return nil, nil
		}
		return orig(ctx, b, subj)
	}
	t.Cleanup(func() { lastPlanMsg = orig })
	req, err := b.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(n, 0))
	if err != nil || req == nil {
		t.Fatalf("the plan request: %v, %v", req, err)
	}
	if err := b.Republish(ctx, req, "again"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		looked := hidden == 0
		mu.Unlock()
		if looked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the copy was never handled")
		}
	}
	settled("the copy")
	turn := engine.TurnGeneration(n, 0, 1)
	if got := eng.Counts().Turns(); len(got) != 1 || got[turn] != 1 {
		t.Errorf("the engine generated %v, want turn %s once", got, turn)
	}
	if c := turnClaim(t, b, n); len(c.Retries) != 0 {
		t.Errorf("the claim records retries %+v, want none", c.Retries)
	}
}

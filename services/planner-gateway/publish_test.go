package plannergateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// oneEpisode stores rollout n running, one episode of the demo world, its
// planner on a simulated SGLang engine (counted): what a test of one turn
// starts from. The context ends with the test.
func oneEpisode(t *testing.T, n int64) (*bus.Bus, *enginetest.Engine, context.Context) {
	t.Helper()
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planner-gateway-test")
	eng := enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, WeightVersion: "planner-v1"}), enginetest.Options{})
	engineURL := enginetest.Start(t, eng)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tasks := demo.Tasks(sim.DefaultWorld(), 1, 1, 1, "")
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(n), &schema.TaskList{Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	sess := &schema.Session{Rollout: n, State: schema.SessionRunning, Config: schema.DefaultConfig(), Episodes: 1,
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {Engine: schema.Engine{URL: engineURL, Protocol: engine.ProtocolSGLang}, WeightVersion: "planner-v1"}}}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(n), sess); err != nil {
		t.Fatal(err)
	}
	return b, eng, ctx
}

// runTurn runs a planner-gateway on b, asks it for turn 1 of episode 0 of
// rollout n, waits for the turn's output and stops the service; it
// returns the output.
func runTurn(t *testing.T, ctx context.Context, b *bus.Bus, n int64) schema.PlanOutput {
	t.Helper()
	return runTurnUntil[schema.PlanOutput](t, ctx, b, n, subject.PlanOut(n, 0))
}

// runTurnUntil runs a planner-gateway on b, asks it for turn 1 of episode 0
// of rollout n, waits for a message on subj (the turn's output, its
// failure) and stops the service; it returns that message.
func runTurnUntil[T any](t *testing.T, ctx context.Context, b *bus.Bus, n int64, subj string) T {
	t.Helper()
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Deps{Bus: b, Log: bustest.TestLogger(t, "debug"), Engines: &engine.Pool{}, RetryBase: 10 * time.Millisecond})
	}()
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1, WeightVersion: "planner-v1"}); err != nil {
		t.Fatal(err)
	}
	var got T
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m, err := b.LastMsg(ctx, bus.StreamPlan, subj)
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			if err := schema.Unmarshal(m.Data, &got); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			bustest.DumpGoroutines(t)
			t.Fatalf("nothing on %s", subj)
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return got
}

// TestAnOutputNotPublishedIsNotGeneratedAgain: when the PLAN stream
// refuses a turn's output after the engine generated it, the next attempt
// publishes the same output: the engine is asked once for the turn, the
// output is stored once, and the claim records no retry.
func TestAnOutputNotPublishedIsNotGeneratedAgain(t *testing.T) {
	const n = 7
	b, eng, ctx := oneEpisode(t, n)

	var mu sync.Mutex
	var published []*schema.PlanOutput
	orig := publishOutput
	publishOutput = func(ctx context.Context, b *bus.Bus, out *schema.PlanOutput) error {
		mu.Lock()
		published = append(published, out)
		first := len(published) == 1
		mu.Unlock()
		if first {
			return fail.Transientf("publish %s: stream PLAN refused it (the test's)", out.Subject())
		}
		return orig(ctx, b, out)
	}
	t.Cleanup(func() { publishOutput = orig })

	out := runTurn(t, ctx, b, n)

	if got := eng.Counts().Turns(); len(got) != 1 || got["7-0-t1"] != 1 {
		t.Errorf("the engine generated %v, want turn 7-0-t1 once", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(published) != 2 || published[0] != published[1] {
		t.Errorf("%d publishes of the output, want 2 of the same output (the first refused)", len(published))
	}
	if len(out.Segments) == 0 || out.Segments[len(out.Segments)-1].Kind != schema.SegGenerated || out.Text == "" {
		t.Errorf("the stored output has no generation: %+v", out)
	}
	st, err := b.JS.Stream(context.Background(), bus.StreamPlan)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subject.PlanOut(n, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[subject.PlanOut(n, 0)]; got != 1 {
		t.Errorf("the PLAN stream holds %d outputs of the turn, want 1", got)
	}
	claim, _, found, err := bus.GetFresh[schema.Claim](context.Background(), b.Runs, schema.ClaimKey(n, 0, 1))
	if err != nil || !found {
		t.Fatalf("the turn's claim: found %v, %v", found, err)
	}
	if len(claim.Retries) != 0 {
		t.Errorf("the claim records retries %+v, want none: nothing was generated again", claim.Retries)
	}
}

package stack_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// The memory budget per episode in flight (docs/benchmarks.md, "Memory
// per episode in flight"): what the live heap of the five services, their
// NATS server, and the test's engines and trainers together may grow by
// for each episode held mid-trajectory, and the goroutines each may add.
// An episode's state lives in the streams; a service that kept it in
// memory, or kept a goroutine per episode waiting, breaks it.
const (
	heapPerEpisodeBudget       = 256 << 10
	goroutinesPerEpisodeBudget = 12
)

// TestMemoryPerEpisodeInFlight holds the budget: every episode of a
// rollout stopped at its second planner turn (its plan made, its four acts
// run, their observations in its trajectory), the planner engine holding
// that generation, and the process's live heap and goroutines measured
// against the moment before the arrivals. Nothing else in this package
// runs in parallel with it: the heap is the process's.
// PLANACT_HEAP_PROFILE=FILE writes where the heap goes at the peak.
func TestMemoryPerEpisodeInFlight(t *testing.T) {
	const episodes = 100
	profile := os.Getenv("PLANACT_HEAP_PROFILE")
	if profile != "" {
		runtime.MemProfileRate = 1024
	}
	_, url := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hold := make(chan struct{})
	planner := enginetest.New(sim.New(sim.Config{Role: schema.RolePlanner, WeightVersion: "planner-v1", PlanWidth: 4}),
		enginetest.Options{Hold: hold, HoldIf: func(gen string) bool { return strings.HasSuffix(gen, "-t2") }})
	actor := enginetest.New(sim.New(sim.Config{Role: schema.RoleActor, WeightVersion: "actor-v1"}), enginetest.Options{})
	pu, err := enginetest.Serve(ctx, planner)
	if err != nil {
		t.Fatal(err)
	}
	au, err := enginetest.Serve(ctx, actor)
	if err != nil {
		t.Fatal(err)
	}
	so := stack.Options{Conn: bus.ConnOptions{URL: url}, Log: bustest.TestLogger(t, "info"), EngineLimit: episodes}
	if err := stack.Provision(ctx, so); err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- stack.Serve(srvCtx, stack.Services, so) }()
	released := false
	t.Cleanup(func() {
		if !released {
			close(hold)
		}
		stop()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("services: %v", err)
		}
	})
	if err := stack.WaitReady(ctx, so.Conn, stack.Services); err != nil {
		t.Fatal(err)
	}
	trainer := func() *client.Client {
		c, err := client.New(bustest.Conn(t, url))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	pc, ac := trainer(), trainer()
	tasks := demo.Tasks(sim.DefaultWorld(), episodes, 1, 71, "")

	heap0, g0 := liveHeap()
	const n = 71
	if err := pc.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Tasks: tasks,
		Engine: schema.Engine{URL: pu, Protocol: "sglang", MaxInFlight: episodes}}); err != nil {
		t.Fatal(err)
	}
	if err := ac.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor,
		Engine: schema.Engine{URL: au, Protocol: "sglang", MaxInFlight: episodes}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := pc.Result(ctx, n, schema.RolePlanner)
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for held := 0; held < episodes; held = planner.Counts().Held {
		if time.Now().After(deadline) {
			bustest.DumpGoroutines(t)
			t.Fatalf("%d of %d episodes reached their second planner turn", held, episodes)
		}
		select {
		case err := <-done:
			t.Fatalf("the rollout ended before its episodes reached their second turn: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	heap1, g1 := liveHeap()
	if profile != "" { // go tool pprof -sample_index=inuse_space FILE
		if f, err := os.Create(profile); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	perEpisode := (int64(heap1) - int64(heap0)) / episodes
	goroutines := float64(g1-g0) / episodes
	t.Logf("%d episodes in flight at their second turn: live heap %d → %d KB (%d KB per episode, budget %d), goroutines %d → %d (%.1f per episode, budget %d)",
		episodes, heap0>>10, heap1>>10, perEpisode>>10, heapPerEpisodeBudget>>10, g0, g1, goroutines, goroutinesPerEpisodeBudget)
	if perEpisode > heapPerEpisodeBudget {
		t.Errorf("the live heap grew by %d KB per episode in flight, over the budget of %d KB", perEpisode>>10, heapPerEpisodeBudget>>10)
	}
	if goroutines > goroutinesPerEpisodeBudget {
		t.Errorf("%.1f goroutines per episode in flight, over the budget of %d", goroutines, goroutinesPerEpisodeBudget)
	}
	// The rest of the rollout is not what this test is about.
	released = true
	close(hold)
	if err := pc.Cancel(ctx, n, schema.RolePlanner, "measured"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("rollout: %v", err)
	}
}

// liveHeap returns the bytes of live heap after a collection, and the
// goroutines running.
func liveHeap() (uint64, int) {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, runtime.NumGoroutine()
}

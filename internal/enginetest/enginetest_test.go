package enginetest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/enginetest"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/sim"
)

// TestCountsWhatTheEngineSaw: requests are counted per path, per episode
// and per generation (the header the engine clients send), aborts by rid;
// a limit queues generations above it, and a path can be made slow.
func TestCountsWhatTheEngineSaw(t *testing.T) {
	e := enginetest.New(sim.New(sim.Config{Role: sim.RoleActor, Seed: 1, TTFT: 100 * time.Millisecond}),
		enginetest.Options{Limit: 2, Latency: map[string]time.Duration{"/tokenize": 50 * time.Millisecond}})
	url := enginetest.Start(t, e)
	c, err := engine.NewClient(engine.ProtocolSGLang, url, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gctx := engine.WithGeneration(ctx, engine.ActGeneration(7, i%2, "t1-s1"))
			ids, err := c.Tokenize(gctx, "Tool: search\nInput: capital of France\nResult:")
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := c.Generate(gctx, engine.Request{InputIDs: ids, RoutingKey: engine.EpisodeKey(7, i%2), Sampling: engine.Sampling{MaxNewTokens: 8}}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := c.(*engine.SGLang).Abort(ctx, "planact-7-0-x"); err != nil {
		t.Fatal(err)
	}
	got := e.Counts()
	if got.Paths["/generate"] != 5 || got.Paths["/tokenize"] != 5 || got.Paths["/abort_request"] != 1 {
		t.Errorf("paths %v", got.Paths)
	}
	if got.Episodes["7-0"] != 3 || got.Episodes["7-1"] != 2 {
		t.Errorf("episodes %v", got.Episodes)
	}
	if acts := got.Acts(); acts["7-0-t1-s1"] != 3 || acts["7-1-t1-s1"] != 2 || len(got.Turns()) != 0 {
		t.Errorf("acts %v, turns %v", acts, got.Turns())
	}
	if extra, unnamed := got.Duplicates(); extra != 3 || unnamed != 0 {
		t.Errorf("duplicates %d, unnamed %d; want 3, 0", extra, unnamed)
	}
	if got.MaxInFlight < 2 || got.InFlight != 0 {
		t.Errorf("in flight %d, at most %d", got.InFlight, got.MaxInFlight)
	}
	if len(got.Aborts) != 1 || got.Aborts[0] != "planact-7-0-x" {
		t.Errorf("aborts %v", got.Aborts)
	}
	// Five generations of 100 ms, two at a time: three rounds, so the last
	// one ended at least 300 ms after the first began (the queue is real).
	reqs := e.Requests()
	var first, last time.Time
	for _, r := range reqs {
		if r.Path != "/generate" {
			continue
		}
		if first.IsZero() || r.Start.Before(first) {
			first = r.Start
		}
		if r.End.After(last) {
			last = r.End
		}
		if r.Status != 200 {
			t.Errorf("%s answered %d", r.Path, r.Status)
		}
	}
	if span := last.Sub(first); span < 300*time.Millisecond {
		t.Errorf("five 100 ms generations, two at a time, took %v", span)
	}
	for _, r := range reqs {
		if r.Path == "/tokenize" && r.End.Sub(r.Start) < 50*time.Millisecond {
			t.Errorf("a slowed /tokenize took %v", r.End.Sub(r.Start))
		}
	}
}

package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/planact/planact/pkg/engine"
)

// The engine counts the generation calls of each generation planact names
// (engine.GenerationHeader), whatever the protocol: not a tokenization,
// not a call refused busy, not a request that names none.
func TestEngineCountsCallsPerGeneration(t *testing.T) {
	e := New(Config{Role: RoleActor, Seed: 1})
	srv := httptest.NewServer(e)
	defer srv.Close()
	sgl, _ := engine.New("sglang", srv.URL, "", nil)
	oai, _ := engine.New("openai", srv.URL+"/v1", "sim-actor", nil)
	act1 := engine.WithGeneration(context.Background(), engine.ActGeneration(7, 0, "t1-s1"))
	act2 := engine.WithGeneration(context.Background(), engine.ActGeneration(7, 1, "t1-s2"))
	turn := engine.WithGeneration(context.Background(), engine.TurnGeneration(7, 0, 1))
	req := engine.Request{Text: actorPrompt, Sampling: engine.Sampling{MaxNewTokens: 16}}
	for _, call := range []struct {
		c   engine.Client
		ctx context.Context
	}{{sgl, act1}, {sgl, act1}, {oai, act2}, {sgl, turn}, {sgl, context.Background()}} {
		if _, err := call.c.Generate(call.ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sgl.Tokenize(act1, actorPrompt); err != nil {
		t.Fatal(err)
	}
	var got GenerationLog
	post(t, srv.URL+"/sim/take_generations", nil, &got)
	want := GenerationLog{Generations: map[string]GenerationCalls{
		"7-0-t1-s1": {Calls: 2}, "7-1-t1-s2": {Calls: 1}, "7-0-t1": {Calls: 1},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("taken %+v, want %+v", got, want)
	}
	var again GenerationLog
	post(t, srv.URL+"/sim/take_generations", nil, &again)
	if len(again.Generations) != 0 || again.Dropped != 0 {
		t.Errorf("taken again: %+v, want nothing", again)
	}
}

func TestBusyCallIsNotCounted(t *testing.T) {
	e := New(Config{Role: RoleActor, Seed: 1, Faults: Faults{BusyRate: 1}})
	srv := httptest.NewServer(e)
	defer srv.Close()
	body, _ := json.Marshal(map[string]any{"text": actorPrompt})
	r, _ := http.NewRequest(http.MethodPost, srv.URL+"/generate", bytes.NewReader(body))
	r.Header.Set(GenerationHeader, "7-0-t1-s1")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if got := e.TakeGenerations(); len(got.Generations) != 0 {
		t.Errorf("a call refused busy counted: %+v", got)
	}
}

// A call a pause in mode abort ends is counted aborted, and named in the
// engine's record of aborts.
func TestPauseAbortIsCounted(t *testing.T) {
	e := New(Config{Role: RoleActor, Seed: 1, PerToken: 50 * time.Millisecond})
	srv := httptest.NewServer(e)
	defer srv.Close()
	c, _ := engine.New("sglang", srv.URL, "", nil)
	ctx := engine.WithGeneration(context.Background(), engine.ActGeneration(7, 0, "t1-s1"))
	done := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, engine.Request{Text: actorPrompt})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for e.Started() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the generation never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.Pause(context.Background(), "abort"); err != nil {
		t.Fatal(err)
	}
	<-done // aborted: what it had, or an error; either way the call was taken
	e.Continue()
	got := e.TakeGenerations()
	if want := (GenerationCalls{Calls: 1, Aborted: 1}); got.Generations["7-0-t1-s1"] != want {
		t.Errorf("counted %+v, want %+v", got.Generations, want)
	}
	aborts := e.Aborts()
	if len(aborts) != 1 || aborts[0].Generation != "7-0-t1-s1" || aborts[0].By != "pause" {
		t.Errorf("aborts %+v, want one by pause naming 7-0-t1-s1", aborts)
	}
}

func TestGenerationsAreBounded(t *testing.T) {
	e := New(Config{Role: RoleActor})
	for i := range MaxGenerations + 3 {
		e.countCall(engine.ActGeneration(7, i, "t1-s1"))
	}
	e.countCall(engine.ActGeneration(7, 0, "t1-s1")) // one it holds: still counted
	got := e.TakeGenerations()
	if len(got.Generations) != MaxGenerations || got.Dropped != 3 || got.Generations["7-0-t1-s1"].Calls != 2 {
		t.Errorf("%d generations, %d dropped, 7-0-t1-s1 %+v; want %d, 3, 2 calls", len(got.Generations), got.Dropped, got.Generations["7-0-t1-s1"], MaxGenerations)
	}
}

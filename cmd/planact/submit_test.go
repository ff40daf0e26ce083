package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

func TestSubmit(t *testing.T) {
	ctx, url, planner, actor := servedStack(t)

	dir := t.TempDir()
	tasks := filepath.Join(dir, "tasks.jsonl")
	os.WriteFile(tasks, []byte(`{"prompt":"What is the population of the capital of France?","label":"2.1 million"}`+"\n\n"+
		`{"prompt":"What is the population of the capital of Japan?","label":"14 million","group_index":7}`+"\n"), 0o644)
	config := filepath.Join(dir, "config.json")
	os.WriteFile(config, []byte(`{"max_turns": 3, "plan_format": "numbered"}`), 0o644)

	var out, errOut syncBuffer
	err := run(ctx, []string{"submit", "--nats", url, "--rollout", "5", "--planner-engine", planner, "--actor-engine", actor,
		"--tasks", tasks, "--config", config, "--json"}, noenv, nil, &out, &errOut)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, errOut.String())
	}
	var results map[string]*schema.Result
	if err := json.Unmarshal([]byte(out.String()), &results); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	p, a := results[schema.RolePlanner], results[schema.RoleActor]
	if p == nil || a == nil || p.Status != schema.ResultOK || len(p.Samples) != 2 || len(a.Samples) == 0 {
		t.Fatalf("results: %+v", results)
	}
	if p.Samples[1].GroupIndex != 7 || !strings.Contains(p.Samples[0].Prompt, "Plan format: numbered") {
		t.Errorf("tasks or config not taken: group %d, prompt %q", p.Samples[1].GroupIndex, p.Samples[0].Prompt)
	}

	// Not on a terminal, progress comes as plain lines on stderr, and the
	// summary on stdout has words, not Go's map syntax.
	out, errOut = syncBuffer{}, syncBuffer{}
	err = run(ctx, []string{"submit", "--nats", url, "--rollout", "9", "--planner-engine", planner, "--actor-engine", actor,
		"--tasks", tasks}, noenv, nil, &out, &errOut)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"rollout 9: waiting for both roles", "rollout 9: 2/2 episodes ended", "acts", "rollout 9: finished, ok"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, errOut.String())
		}
	}
	if strings.Contains(out.String(), "map[") || !strings.Contains(out.String(), "planner: ok") {
		t.Errorf("summary:\n%s", out.String())
	}

	// The same rollout again is refused, and says why; the result of the
	// rollout that ended before is not shown as this submit's ("planner:
	// ok — 2 samples", "finished, ok"), nor printed as its JSON.
	for _, asJSON := range []bool{false, true} {
		out, errOut = syncBuffer{}, syncBuffer{}
		args := []string{"submit", "--nats", url, "--rollout", "5", "--planner-engine", planner, "--actor-engine", actor, "--tasks", tasks}
		if asJSON {
			args = append(args, "--json")
		}
		err = run(ctx, args, noenv, nil, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "already ended") {
			t.Errorf("submitting rollout 5 again: %v, want it refused as already ended", err)
		}
		if strings.Contains(out.String(), "ok") || strings.Contains(errOut.String(), "finished") {
			t.Errorf("submitting rollout 5 again (--json %v) shows the earlier rollout's result as its own:\n%s%s", asJSON, out.String(), errOut.String())
		}
	}

	// Interrupted once the rollout had ended (its result not read yet),
	// submit's cancel is answered that there is nothing to cancel: it was
	// sent, not "could not be sent".
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	known := make(chan struct{})
	close(known)
	var said bytes.Buffer
	cancelInterrupted(5, map[string]*client.Client{schema.RolePlanner: c}, map[string]bool{schema.RolePlanner: true}, map[string]*schema.Result{}, known, &said)
	if got := said.String(); strings.Contains(got, "could not be sent") || !strings.Contains(got, "rollout 5: planact: nothing to cancel: ") || !strings.Contains(got, "already ended") {
		t.Errorf("interrupted after rollout 5 ended, submit said:\n%s", got)
	}

	// Bad input is refused before anything is sent.
	misspelt := filepath.Join(dir, "misspelt.json")
	os.WriteFile(misspelt, []byte(`{"max_turn": 3}`), 0o644)
	var sink bytes.Buffer
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"submit", "--nats", url, "--rollout", "6", "--planner-engine", planner, "--actor-engine", actor}, "--tasks"},
		{[]string{"submit", "--nats", url, "--planner-engine", planner, "--sim-tasks", "1"}, "--rollout"},
		{[]string{"submit", "--nats", url, "--rollout", "6", "--role", "critic", "--sim-tasks", "1"}, "critic"},
		{[]string{"submit", "--nats", url, "--rollout", "6", "--planner-engine", planner, "--actor-engine", actor, "--sim-tasks", "1", "--config", misspelt}, "max_turn"},
	} {
		if err := run(ctx, c.args, noenv, nil, &sink, &sink); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// TestSubmitWithoutPlanact: against a NATS server without planact, submit
// says so at once instead of waiting for its whole time-out.
func TestSubmitWithoutPlanact(t *testing.T) {
	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	var sink bytes.Buffer
	err = run(context.Background(), []string{"submit", "--nats", s.ClientURL(), "--rollout", "1", "--planner-engine", "http://127.0.0.1:1",
		"--actor-engine", "http://127.0.0.1:1", "--sim-tasks", "1", "--timeout", "1h"}, noenv, nil, &sink, &sink)
	if err == nil || !strings.Contains(err.Error(), "no planact here") {
		t.Errorf("submit against a bare NATS: %v, want one saying planact is not there", err)
	}
}

// The progress submit shows only moves forward: status events published by
// handlers that ran at once arrive in any order, and an older one (fewer
// episodes ended) is not shown after a newer one.
func TestSubmitProgressOnlyMovesForward(t *testing.T) {
	_, url := bustest.Server(t)
	var out syncBuffer
	progress := watchProgress(bustest.Conn(t, url), 3, &out)
	defer progress.stop()
	pub := bustest.Conn(t, url)
	for _, st := range []schema.Status{
		{Event: "started", Episode: -1, Detail: "4 episodes"},
		{Event: "episode-completed", Episode: 1, Ended: 2, Episodes: 4, Acts: 5},
		{Event: "episode-completed", Episode: 0, Ended: 1, Episodes: 4, Acts: 3}, // counted before the one above
		{Event: "episode-failed", Episode: 3, Ended: 4, Episodes: 4, Acts: 9},
		{Event: "episode-completed", Episode: 2, Ended: 3, Episodes: 4, Acts: 7}, // likewise
		{Event: "finished", Episode: -1, Detail: "ok"},
	} {
		st.Rollout = 3
		data, err := schema.Marshal(&st)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(st.Subject(), data); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "finished"); {
		if time.Now().After(deadline) {
			t.Fatalf("no finished line:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := "rollout 3: waiting for both roles\n" +
		"rollout 3: started, 4 episodes\n" +
		"rollout 3: 2/4 episodes ended, 5 acts\n" +
		"rollout 3: 4/4 episodes ended, 9 acts\n" +
		"rollout 3: finished, ok\n"
	if got := out.String(); got != want {
		t.Errorf("progress shown:\n%s\nwant:\n%s", got, want)
	}
}

// Nothing moves back: not to an older count, not to "started" once
// episodes end, not to anything once finished.
func TestSubmitProgressApply(t *testing.T) {
	p := &submitProgress{rollout: 1}
	for _, c := range []struct {
		st   schema.Status
		want string
	}{
		{schema.Status{Event: "arrived", Detail: "planner"}, ""},
		{schema.Status{Event: "episode-completed", Ended: 1, Episodes: 2, Acts: 2}, "rollout 1: 1/2 episodes ended, 2 acts"},
		{schema.Status{Event: "started", Detail: "2 episodes"}, ""},
		{schema.Status{Event: "episode-completed", Ended: 1, Episodes: 2, Acts: 1}, ""},
		{schema.Status{Event: "episode-completed", Ended: 1, Episodes: 2, Acts: 3}, "rollout 1: 1/2 episodes ended, 3 acts"},
		{schema.Status{Event: "finished", Detail: "partial"}, "rollout 1: finished, partial"},
		{schema.Status{Event: "episode-completed", Ended: 2, Episodes: 2, Acts: 4}, ""},
		{schema.Status{Event: "finished", Detail: "ok"}, ""},
	} {
		if got := p.apply(c.st); got != c.want {
			t.Errorf("after %+v: shown %q, want %q", c.st, got, c.want)
		}
	}
}

// servedStack serves planact's services on a fresh server, with a
// simulated planner and actor engine, until the test ends; it returns a
// context for the test (two minutes), the server's url and the engines'.
func servedStack(t *testing.T) (ctx context.Context, url, planner, actor string) {
	t.Helper()
	_, url = bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var err error
	if planner, err = sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if actor, err = sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() {
		served <- stack.Serve(sctx, stack.Services, stack.Options{Provision: true, Conn: bus.ConnOptions{URL: url}, Log: bustest.Logger()})
	}()
	t.Cleanup(func() { stop(); <-served })
	if err := stack.WaitReady(ctx, bus.ConnOptions{URL: url}, stack.Services); err != nil {
		t.Fatal(err)
	}
	return ctx, url, planner, actor
}

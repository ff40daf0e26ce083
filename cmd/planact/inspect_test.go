package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// inspect reads a finished rollout from the streams: the rollout's
// episodes with their plans, one episode's turns and act timeline, and
// both as Graphviz.
func TestInspect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	url, planner, actor := e.URL, e.Planner.URL, e.Actor.URL
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	os.WriteFile(tasks, []byte(`{"prompt":"What is the population of the capital of France?","label":"2.1 million"}`+"\n"+
		`{"prompt":"What is the population of the capital of Japan?","label":"14 million"}`+"\n"), 0o644)
	var out, errOut syncBuffer
	if err := run(ctx, []string{"submit", "--nats", url, "--rollout", "3", "--planner-engine", planner, "--actor-engine", actor,
		"--tasks", tasks}, noenv, nil, &out, &errOut); err != nil {
		t.Fatalf("submit: %v\n%s", err, errOut.String())
	}

	inspect := func(args ...string) string {
		t.Helper()
		var out, errOut syncBuffer
		if err := run(ctx, append([]string{"inspect", "--nats", url}, args...), noenv, nil, &out, &errOut); err != nil {
			t.Fatalf("inspect %v: %v\n%s", args, err, errOut.String())
		}
		t.Logf("inspect %v:\n%s", args, out.String())
		return out.String()
	}
	// The rollout: its status, an episode per line with each turn's plan.
	got := inspect("3")
	for _, want := range []string{"rollout 3: ok, 2/2 episodes ended", "episode", "t1: "} {
		if !strings.Contains(got, want) {
			t.Errorf("inspect 3 lacks %q:\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^1 +completed`).MatchString(got) {
		t.Errorf("inspect 3 has no line for episode 1 completed:\n%s", got)
	}
	// The simulated planner looks things up: nodes that ran, with timings.
	if !regexp.MustCompile(`\(done \d`).MatchString(got) {
		t.Errorf("inspect 3 shows no node done with its duration:\n%s", got)
	}

	// One episode: turns, the node table with timings, the critical path.
	got = inspect("3", "0")
	for _, want := range []string{"rollout 3 episode 0: completed", "turn 1: plan", "node", "released", "critical path: t1-"} {
		if !strings.Contains(got, want) {
			t.Errorf("inspect 3 0 lacks %q:\n%s", want, got)
		}
	}

	// Graphviz: a digraph with a cluster per turn and the nodes coloured.
	got = inspect("--dot", "3", "0")
	if !strings.HasPrefix(got, "digraph planact {") || !strings.Contains(got, `subgraph "cluster_e0_t1"`) || !strings.Contains(got, `fillcolor="palegreen"`) {
		t.Errorf("inspect --dot 3 0:\n%s", got)
	}
	if strings.Count(got, "{") != strings.Count(got, "}") {
		t.Errorf("unbalanced braces in the dot output:\n%s", got)
	}

	// Mistakes are named.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "--nats", url, "99"}, "rollout 99: the streams hold nothing of it (they hold 1 rollouts, from 3 to 3)"},
		{[]string{"inspect", "--nats", url, "3", "7"}, "episode 7"},
		{[]string{"inspect", "--nats", url, "x"}, `rollout "x"`},
		{[]string{"inspect", "--nats", url, "--status", "happy", "3"}, `status "happy"`},
		{[]string{"inspect", "--nats", url}, "name a rollout"},
	} {
		var sink syncBuffer
		if err := run(ctx, c.args, noenv, nil, &sink, &sink); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// TestInspectTimeoutBoundsEverything: --timeout bounds the whole command,
// and an interrupt ends it, also while it reads again the episodes of a
// rollout the view no longer holds in memory (beyond the 16 most recently
// finished). Before, each episode read again had 30 s of its own, whatever
// --timeout said or Ctrl-C did.
func TestInspectTimeoutBoundsEverything(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var msgs []schema.Message
	for n := int64(1); n <= 20; n++ {
		msgs = append(msgs, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, Tasks: []schema.Task{{Prompt: "?"}}},
			&schema.Start{Rollout: n, Episodes: 1},
			&schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1},
			&schema.ActDone{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK, Attempts: 1},
			&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"!"}},
			&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK})
	}
	if err := b.PublishAll(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	proxy := bustest.StartProxy(t, url)
	// The server goes silent once inspect has read the history.
	inspectHistoryRead = proxy.Freeze
	t.Cleanup(func() { inspectHistoryRead = func() {}; proxy.Thaw() })

	for _, c := range []struct {
		name      string
		args      []string
		interrupt bool
		want      error
	}{
		{"deadline", []string{"--timeout", "2s", "1", "0"}, false, context.DeadlineExceeded},
		{"deadline, every episode", []string{"--timeout", "2s", "1"}, false, context.DeadlineExceeded},
		{"interrupt", []string{"--timeout", "1m", "1", "0"}, true, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			proxy.Thaw()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if c.interrupt {
				// As Ctrl-C does, through main's signal context.
				inspectHistoryRead = func() { proxy.Freeze(); time.AfterFunc(500*time.Millisecond, cancel) }
				defer func() { inspectHistoryRead = proxy.Freeze }()
			}
			var out syncBuffer
			start := time.Now()
			err := run(ctx, append([]string{"inspect", "--nats", proxy.URL}, c.args...), noenv, nil, &out, &out)
			if took := time.Since(start); !errors.Is(err, c.want) || took > 15*time.Second {
				t.Errorf("inspect %v: %v after %v, want %v within a few seconds", c.args, err, took, c.want)
			}
			if c.want == context.DeadlineExceeded && (err == nil || !strings.Contains(err.Error(), "raise --timeout")) {
				t.Errorf("inspect %v: %v, want it to say to raise --timeout", c.args, err)
			}
		})
	}
}

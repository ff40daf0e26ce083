package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

func TestWatchFollowsOneRollout(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := func(m schema.Message) {
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	pub(&schema.PlanDAG{Rollout: 4, Episode: 0, Turn: 1, Plan: plan.Plan{Format: plan.FormatGraph, Nodes: []plan.Node{
		{ID: "s1", Tool: "search", Args: map[string]any{"input": "capital of Peru"}},
		{ID: "s2", Tool: "search", Deps: []string{"s1"}, Args: map[string]any{"input": "population of {s1}"}},
	}}})
	pub(&schema.PlanAnswer{Rollout: 5, Episode: 0, Turn: 1, Answers: []string{"other rollout"}})

	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "-v", "--nats", url, "4"}, noenv, nil, &out, &out) }()
	pub(&schema.ActDone{Rollout: 4, Episode: 0, Turn: 1, Key: "t1-s1", Status: schema.ActDoneOK, Output: "Lima", Attempts: 1})

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "Lima") || !strings.Contains(out.String(), "s2<-s1") {
		if time.Now().After(deadline) {
			t.Fatalf("watch printed:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "other rollout") {
		t.Errorf("watch 4 printed rollout 5:\n%s", out.String())
	}
}

// Without -v, watch prints one line per rollout each time its progress
// changes (not a terminal): waiting, started, episodes ending, the result.
func TestWatchShowsProgressPerRollout(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := func(m schema.Message) {
		t.Helper()
		if err := b.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Rollout 4 ran before watch started; rollout 5 runs while it watches.
	pub(&schema.Start{Rollout: 4, Episodes: 2})
	pub(&schema.Status{Rollout: 4, Event: "episode", Episode: 0, Ended: 1, Episodes: 2, Acts: 3})
	pub(&schema.EpisodeEnd{Rollout: 4, Episode: 0, Status: schema.EpisodeFailed, Reason: "plan error"})
	pub(&schema.Status{Rollout: 4, Event: "episode", Episode: 1, Ended: 2, Episodes: 2, Acts: 5})
	pub(&schema.EpisodeEnd{Rollout: 4, Episode: 1, Status: schema.EpisodeCompleted})
	pub(&schema.Result{Rollout: 4, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: schema.Stats{Episodes: 2, Accuracy: 0.5, Acts: 5,
		EpisodeStatus: map[string]int{schema.EpisodeFailed: 1, schema.EpisodeCompleted: 1}}})

	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"watch", "--nats", url}, noenv, nil, &out, &out) }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("watch never printed %q; it printed:\n%s", want, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("rollout 4      [####################] 2/2 episodes, 5 acts, 1 failed  ok, accuracy 0.50")
	pub(&schema.Start{Rollout: 5, Episodes: 4})
	waitFor("rollout 5      [--------------------] 0/4 episodes, 0 acts  running")
	pub(&schema.Status{Rollout: 5, Event: "episode", Episode: 2, Ended: 1, Episodes: 4, Acts: 7})
	waitFor("rollout 5      [#####---------------] 1/4 episodes, 7 acts  running")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "rollout 4 "); n != 1 {
		t.Errorf("rollout 4 ended before watch started: one line expected, %d printed:\n%s", n, out.String())
	}
	if strings.Contains(out.String(), "plan error") || strings.Contains(out.String(), "turn ") {
		t.Errorf("per-message lines without -v:\n%s", out.String())
	}
}

func TestBoardLine(t *testing.T) {
	b := newBoard()
	b.apply("rollout.9.arrive.planner", nil, time.Now())
	if got, want := b.rows[9].line(10), "rollout 9      waiting at the barrier (planner arrived)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := bar(3, 4, 8); got != "[######--]" {
		t.Errorf("bar(3, 4, 8) = %q", got)
	}
	if got := bar(0, 0, 4); got != "[----]" {
		t.Errorf("bar(0, 0, 4) = %q", got)
	}
}

// On a terminal the board is redrawn in place: the cursor goes back up over
// the lines drawn before.
func TestBoardRedrawsInPlace(t *testing.T) {
	var out strings.Builder
	b, bw := newBoard(), &boardWriter{w: &out, tty: true}
	b.apply("rollout.1.arrive.actor", nil, time.Now())
	b.apply("rollout.2.arrive.planner", nil, time.Now())
	bw.draw(b)
	bw.draw(b)
	if got, want := strings.Count(out.String(), "\r\033[Krollout 1 "), 2; got != want {
		t.Errorf("rollout 1 drawn %d times, want %d:\n%q", got, want, out.String())
	}
	if !strings.Contains(out.String(), "\033[2A") {
		t.Errorf("the second drawing does not go back up over two lines:\n%q", out.String())
	}
}

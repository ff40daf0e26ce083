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
	go func() { done <- run(ctx, []string{"watch", "--nats", url, "4"}, noenv, nil, &out, &out) }()
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

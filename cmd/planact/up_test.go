package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/pkg/schema"
)

func noenv(string) string { return "" }

// TestUpDemoJSON runs what `make run` runs, with --json: the summary must
// show both roles receiving samples.
func TestUpDemoJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout bytes.Buffer
	var stderr syncBuffer // services log from many goroutines
	err := run(ctx, []string{"up", "--demo", "--json", "--port", "-1", "--metrics", "", "--data", t.TempDir(),
		"--rollouts", "2", "--tasks", "2", "--samples-per-prompt", "2", "--sim-ttft", "0", "--sim-per-token", "0"},
		noenv, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("up --demo: %v\nstderr:\n%s", err, stderr.String())
	}
	var sum demo.Summary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout.String())
	}
	if sum.RolloutsCompleted != 2 || sum.Episodes != 8 {
		t.Errorf("rollouts %d episodes %d, want 2 and 8", sum.RolloutsCompleted, sum.Episodes)
	}
	if sum.PlannerSamples != sum.Episodes || sum.ActorSamples < sum.Episodes || sum.Acts != sum.ActorSamples {
		t.Errorf("planner samples %d, actor samples %d, acts %d for %d episodes", sum.PlannerSamples, sum.ActorSamples, sum.Acts, sum.Episodes)
	}
	if sum.Accuracy <= 0 || sum.Accuracy > 1 {
		t.Errorf("accuracy %v", sum.Accuracy)
	}
}

func TestDecode(t *testing.T) {
	body, err := schema.Marshal(&schema.ActRun{Rollout: 7, Episode: 1, Turn: 2, Key: "t2-s1"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"decode", "--compact"}, noenv, bytes.NewReader(body), &out, &out); err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, out.String())
	}
	if v["schema"] != "act.run/1" || v["key"] != "t2-s1" || v["rollout"] != float64(7) {
		t.Errorf("decoded %v", v)
	}
	out.Reset()
	if err := run(context.Background(), []string{"decode"}, noenv, strings.NewReader("hello, not msgpack"), &out, &out); err == nil {
		t.Errorf("decoding text: want an error")
	}
}

func TestUnknownCommandAndService(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"frobnicate"}, noenv, nil, &out, &out); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("unknown command: %v", err)
	}
	if err := run(context.Background(), []string{"serve", "act-dispatchr"}, noenv, nil, &out, &out); err == nil || !strings.Contains(err.Error(), "unknown service") {
		t.Errorf("unknown service: %v", err)
	}
	if err := run(context.Background(), nil, noenv, nil, &out, &out); err == nil {
		t.Errorf("no command: want an error")
	}
	// Flags after the service names are flags, not names.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := run(ctx, []string{"serve", "actor-gateway", "--nats", "nats://127.0.0.1:1"}, noenv, nil, &out, &out)
	if err == nil || strings.Contains(err.Error(), "unknown service") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("serve with a flag after the name: %v, want a connection error to the given server", err)
	}
}

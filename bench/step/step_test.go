package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// TestMain lets this test binary play the processes the harness starts by
// running its own binary again (-role engines, -role trainer), as
// bench/step's binary does.
func TestMain(m *testing.M) {
	if len(os.Args) >= 3 && os.Args[1] == "-role" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench/step:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStepEndToEnd runs the harness at its smallest: nats-server and the
// five `planact serve` processes, the engines and both trainers as
// processes, two asynchronous rollouts with a weight swap between them,
// and the analysis. It fails where the harness or planact under it
// breaks: a trainer whose samples do not add up to what the result
// counts, a rollout that is not ok, an engine call no abort explains, a
// check that finds the run unlike its script.
func TestStepEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds planact and nats-server and runs the topology as processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := t.TempDir()
	var log bytes.Buffer
	args := []string{"-prompts", "4", "-copies", "2", "-raw-messages", "200", "-out", out, "-name", "smoke"}
	if err := run(ctx, args, &log, &log); err != nil {
		t.Fatalf("bench/step %s: %v\n%s", strings.Join(args, " "), err, log.String())
	}
	data, err := os.ReadFile(filepath.Join(out, "smoke.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Rollouts) != 2 {
		t.Fatalf("%d rollouts in the report, want 2\n%s", len(r.Rollouts), log.String())
	}
	for _, f := range r.Rollouts {
		if f.Status != schema.ResultOK || f.Samples[0] == 0 || f.Samples[1] == 0 || f.MakespanS <= 0 {
			t.Errorf("rollout %d: %s, samples planner/actor %v, makespan %.1f s", f.Rollout, f.Status, f.Samples, f.MakespanS)
		}
	}
	if r.Dups.Unexplained != 0 {
		t.Errorf("%d engine calls no abort explains: %v", r.Dups.Unexplained, r.Dups.Examples)
	}
	for _, c := range r.Failures {
		t.Errorf("check: %s", c)
	}
	if r.Bound.S <= 0 || r.Replay.S < r.Bound.S {
		t.Errorf("bound %.2f s, replay %.2f s: want a bound below the replay", r.Bound.S, r.Replay.S)
	}
}

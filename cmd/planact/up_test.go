package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// TestUpDemoModes: `planact up --demo --mode M` plays each coordination
// mode end to end, both roles receiving samples; a mode planact does not
// know, or an ensemble_k its mode does not take, is refused before
// anything starts.
func TestUpDemoModes(t *testing.T) {
	for _, args := range [][]string{{"--mode", schema.ModePeerReview}, {"--mode", schema.ModeEnsemble}, {"--mode", schema.ModeEnsemble, "--ensemble-pick", "planner"}} {
		mode := strings.Join(args[1:], " ")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var stdout bytes.Buffer
		var stderr syncBuffer
		err := run(ctx, append([]string{"up", "--demo", "--json", "--port", "-1", "--metrics", "", "--data", t.TempDir(),
			"--rollouts", "1", "--tasks", "2", "--samples-per-prompt", "2", "--sim-ttft", "0", "--sim-per-token", "0"}, args...),
			noenv, strings.NewReader(""), &stdout, &stderr)
		cancel()
		if err != nil {
			t.Fatalf("up --demo --mode %s: %v\nstderr:\n%s", mode, err, stderr.String())
		}
		var sum demo.Summary
		if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
			t.Fatalf("--mode %s: stdout is not one JSON object: %v\n%s", mode, err, stdout.String())
		}
		if sum.RolloutsCompleted != 1 || sum.Episodes != 4 || sum.PlannerSamples != 4 || sum.ActorSamples < 4 || sum.Acts != sum.ActorSamples {
			t.Errorf("--mode %s: rollouts %d episodes %d planner samples %d actor samples %d acts %d", mode,
				sum.RolloutsCompleted, sum.Episodes, sum.PlannerSamples, sum.ActorSamples, sum.Acts)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "debate"}, `--mode "debate": want one of plan_act, peer_review, ensemble`},
		{[]string{"--mode", "ensemble", "--ensemble-k", "1"}, "ensemble_k 1: want 2 to 16"},
		{[]string{"--ensemble-k", "3"}, "ensemble_k 3: only for mode ensemble"},
		{[]string{"--mode", "ensemble", "--ensemble-pick", "judge"}, `ensemble_pick "judge": want one of vote, planner`},
		{[]string{"--ensemble-pick", "planner"}, `ensemble_pick "planner": only for mode ensemble`},
	} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"up", "--demo", "--port", "-1"}, c.args...), noenv, strings.NewReader(""), &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("up --demo %v: %v, want %q", c.args, err, c.want)
		}
	}
}

func TestDecode(t *testing.T) {
	body, err := schema.Marshal(&schema.ActDone{Rollout: 7, Episode: 1, Turn: 2, Key: "t2-s1", Status: schema.ActDoneOK})
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
	if v["schema"] != "act.done/1" || v["key"] != "t2-s1" || v["rollout"] != float64(7) {
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

// TestUpChecksFlagsFirst: every flag of up is checked before anything
// starts; --plan-format yaml used to print its error and then hang, and
// --rollouts 0 to play three.
func TestUpChecksFlagsFirst(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--demo", "--plan-format", "yaml"}, "--plan-format"},
		{[]string{"--demo", "--rollouts", "0"}, "--rollouts 0"},
		{[]string{"--demo", "--tasks", "-1"}, "--tasks"},
		{[]string{"--demo", "--samples-per-prompt", "0"}, "--samples-per-prompt"},
		{[]string{"--protocol", "grpc"}, "--protocol"},
		{[]string{"--sim-actor-error-rate", "1.5"}, "probabilities"},
		{[]string{"--services", "act-dispatchr"}, "unknown service"},
		{[]string{"--history", "1h", "--result-retention", "2h"}, "--result-retention 2h"},
		{[]string{"extra"}, "unexpected arguments"},
		// Flags of the demo without --demo: nothing would play it.
		{[]string{"--rollouts", "10"}, "up: --rollouts: only with --demo"},
		{[]string{"--json", "--mode", "peer_review"}, "up: --json, --mode: only with --demo"},
		{[]string{"--tasks", "8", "--samples-per-prompt", "4", "--plan-format", "json", "--ensemble-k", "3", "--ensemble-pick", "vote"}, "up: --ensemble-k, --ensemble-pick, --plan-format, --samples-per-prompt, --tasks: only with --demo"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out syncBuffer
		err := run(ctx, append([]string{"up", "--port", "-1", "--metrics", ""}, c.args...), noenv, nil, &out, &out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("up %v: %v, want an error naming %s", c.args, err, c.want)
		}
		if strings.Contains(out.String(), "NATS at") {
			t.Errorf("up %v started a server before refusing its flags:\n%s", c.args, out.String())
		}
	}
}

// TestExitCodes: -h is not a failure; an interrupted command says so once.
func TestExitCodes(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"up", "-h"}, noenv, nil, &out, &out)
	if code := exitCode(context.Background(), err, &out); code != 0 {
		t.Errorf("up -h: exit %d (%v), want 0", code, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out.Reset()
	if code := exitCode(ctx, errInterrupted, &out); code != 130 || strings.Count(out.String(), "interrupted") != 1 {
		t.Errorf("interrupted: exit %d, said %q", code, out.String())
	}
	out.Reset()
	if code := exitCode(context.Background(), errors.New("boom"), &out); code != 1 || !strings.Contains(out.String(), "boom") {
		t.Errorf("an error: exit %d, said %q", code, out.String())
	}
}

// TestUpDemoInterrupted: Ctrl-C during the demo says "interrupted" once and
// prints no FAILED rollouts (it printed dozens).
func TestUpDemoInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"up", "--demo", "--port", "-1", "--metrics", "", "--rollouts", "50", "--tasks", "4",
			"--sim-ttft", "50ms"}, noenv, nil, &stdout, &stderr)
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stdout.String(), "demo —") {
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not start:\n%s", stdout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // Ctrl-C
	err := <-done
	var said bytes.Buffer
	if code := exitCode(ctx, err, &said); code != 130 || strings.TrimSpace(said.String()) != "planact: interrupted" {
		t.Errorf("exit %d, said %q (err %v)", code, said.String(), err)
	}
	if strings.Contains(stdout.String(), "FAILED") {
		t.Errorf("an interrupted demo printed failures:\n%s", stdout.String())
	}
}

func TestCounts(t *testing.T) {
	if got := counts(map[string]int{"failed": 2, "completed": 22}); got != "completed 22, failed 2" {
		t.Errorf("counts = %q", got)
	}
	if got := counts(nil); got != "none" {
		t.Errorf("counts(nil) = %q", got)
	}
}

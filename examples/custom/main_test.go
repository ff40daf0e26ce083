package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
	planparser "github.com/planact/planact/services/plan-parser"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// TestBuildsAndRuns builds the example as a user would (go build) and plays
// its demo: a rollout whose acts call the Go tool registered in main and
// whose answers the registered reward scores.
func TestBuildsAndRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "custom")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, bin, "--demo").Output()
	if err != nil {
		t.Fatalf("custom --demo: %v\n%s", err, out)
	}
	var sum Summary
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	if sum.PlannerStatus != schema.ResultOK || sum.ActorStatus != schema.ResultOK || sum.PlannerSamples != 4 {
		t.Errorf("summary %+v", sum)
	}
	if sum.KBCalls == 0 {
		t.Errorf("the Go tool was never called: %+v", sum)
	}
	// The simulated world answers every question, and "contains" says so.
	if sum.MeanReward != 1 {
		t.Errorf("mean reward %v under the registered reward, want 1", sum.MeanReward)
	}
	if err := run(ctx, nil, nil, &strings.Builder{}); err == nil {
		t.Error("no flag: want an error")
	}
}

// TestRegisteredConfig: a config naming what main registered is valid, and
// one naming what it did not is refused naming what it did.
func TestRegisteredConfig(t *testing.T) {
	cfg := schema.Config{PlanFormat: "lines", Reward: "contains", Tools: []schema.Tool{{Name: "kb_search", Kind: schema.ToolGo}}}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := cfg
	bad.Reward = "containz"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "one registered (contains)") {
		t.Errorf("reward containz: %v", err)
	}
	bad = cfg
	bad.PlanFormat = "line"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "lines") {
		t.Errorf("plan_format line: %v", err)
	}
}

// TestLinesFormat: the planner is asked for the registered format, and the
// plan-parser reads its outputs in it, validated as every plan is.
func TestLinesFormat(t *testing.T) {
	cfg := schema.Config{PlanFormat: "lines", Tools: []schema.Tool{{Name: "kb_search", Kind: schema.ToolGo}}}.WithDefaults()
	prompt := plannergateway.RenderPrompt(schema.Task{Prompt: "What is the population of the capital of France?"}, cfg)
	if !strings.Contains(prompt, "Plan format: lines") || !strings.Contains(prompt, "Write one call per line") {
		t.Errorf("prompt does not ask for lines:\n%s", prompt)
	}
	parse := func(text string) schema.Message {
		t.Helper()
		msg, err := planparser.ParseContext(context.Background(), &schema.PlanOutput{Rollout: 1, Turn: 1, Text: text}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	d, ok := parse("I need two lookups.\ns1: kb_search(capital of France)\ns2: kb_search(population of {s1}) <- s1\n").(*schema.PlanDAG)
	if !ok || d.Plan.Format != "lines" || len(d.Plan.Nodes) != 2 || d.Plan.Nodes[1].Deps[0] != "s1" || d.Plan.Nodes[1].Input() != "population of {s1}" {
		t.Fatalf("plan: %#v", parse("s1: kb_search(capital of France)\ns2: kb_search(population of {s1}) <- s1"))
	}
	for text, want := range map[string]string{
		"s1: kb_search(x) <- s2\ns2: kb_search(y) <- s1": "cycle",
		"s1: web(x)":                       "unknown_tool",
		"s1: kb_search(x)\nthen something": "syntax",
		"<answer>Paris</answer>":           "",
	} {
		switch m := parse(text).(type) {
		case *schema.PlanError:
			if m.ErrorKind != want {
				t.Errorf("%q: %s (%s), want %s", text, m.ErrorKind, m.Message, want)
			}
		case *schema.PlanAnswer:
			if want != "" || m.Answers[0] != "Paris" {
				t.Errorf("%q: answer %v", text, m.Answers)
			}
		default:
			t.Errorf("%q: %#v, want %s", text, m, want)
		}
	}
}

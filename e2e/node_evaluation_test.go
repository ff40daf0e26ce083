package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// nodeEvaluation is what the Node trainer prints for a role with --evaluate.
type nodeEvaluation struct {
	Status           string  `json:"status"`
	Outcome          string  `json:"outcome"`
	Evaluation       bool    `json:"evaluation"`
	Samples          int     `json:"samples"`
	Episodes         int     `json:"episodes"`
	EpisodesReported int     `json:"episodes_reported"`
	Accuracy         float64 `json:"accuracy"`
	MeanReward       float64 `json:"mean_reward"`
	MeanTurns        float64 `json:"mean_turns"`
	ActsPerEpisode   float64 `json:"acts_per_episode"`
	Datasets         map[string]struct {
		Episodes       int     `json:"episodes"`
		Accuracy       float64 `json:"accuracy"`
		MeanReward     float64 `json:"mean_reward"`
		MeanTurns      float64 `json:"mean_turns"`
		ActsPerEpisode float64 `json:"acts_per_episode"`
	} `json:"datasets"`
}

// TestNodeTrainerEvaluates: the Node trainer's --evaluate plays both roles
// of an evaluation rollout of tasks from two datasets: each role gets
// metrics (the whole rollout's and each dataset's), no samples, exit 0;
// they are the numbers planact's result holds, as the Go client reads it.
// --evaluate with --check is refused, saying why.
func TestNodeTrainerEvaluates(t *testing.T) {
	t.Parallel()
	dir := nodeExample(t)
	e := start(t, envOptions{planner: sim.Config{Seed: 71}, actor: sim.Config{Seed: 72, ActorErrorRate: 0.3}})
	const n = 905
	var lines bytes.Buffer
	enc := json.NewEncoder(&lines)
	for i, task := range e.tasks(4, 1, n) {
		if err := enc.Encode(map[string]string{"prompt": task.Prompt, "label": task.Label, "dataset": []string{"hotpotqa", "nq"}[i%2]}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "eval.jsonl")
	if err := os.WriteFile(path, lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var out struct {
		OK      bool           `json:"ok"`
		Planner nodeEvaluation `json:"planner"`
		Actor   nodeEvaluation `json:"actor"`
	}
	args := []string{"trainer.mjs", "--nats", e.url, "--rollout", "905", "--planner-engine", e.planner.URL, "--actor-engine", e.actor.URL,
		"--timeout", "120", "--role", "both", "--tasks", path, "--samples-per-prompt", "2", "--evaluate",
		"--config", `{"planner_sampling": {"temperature": 0}, "actor_sampling": {"temperature": 0}}`}
	cmd := nodeCmd(t, dir, "node", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node trainer --evaluate: %v\n%s%s", err, stderr.String(), stdout.String())
	}
	t.Logf("%s", stderr.String())
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("summary: %v\n%s", err, stdout.String())
	}
	// planact's own result, as the Go client reads it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := e.trainer(t).Result(ctx, n, schema.RolePlanner)
	if err != nil {
		t.Fatal(err)
	}
	if !out.OK || len(res.Stats.Datasets) != 2 {
		t.Fatalf("ok %v, planact's datasets %v", out.OK, res.Stats.Datasets)
	}
	for role, r := range map[string]nodeEvaluation{schema.RolePlanner: out.Planner, schema.RoleActor: out.Actor} {
		if r.Status != schema.ResultOK || r.Outcome != "metrics" || !r.Evaluation || r.Samples != 0 || r.Episodes != 8 || r.EpisodesReported != 8 {
			t.Errorf("%s: %+v: want ok, metrics of an evaluation of 8 episodes, no samples", role, r)
		}
		if r.Accuracy != res.Stats.Accuracy || r.MeanReward != res.Stats.MeanReward || r.ActsPerEpisode != res.Stats.ActsPerEpisode {
			t.Errorf("%s: accuracy %v, mean reward %v, acts per episode %v; planact says %v, %v, %v", role,
				r.Accuracy, r.MeanReward, r.ActsPerEpisode, res.Stats.Accuracy, res.Stats.MeanReward, res.Stats.ActsPerEpisode)
		}
		for name, want := range res.Stats.Datasets {
			got := r.Datasets[name]
			if got.Episodes != want.Episodes || math.Abs(got.Accuracy-want.Accuracy) > 0 || got.MeanReward != want.MeanReward ||
				got.MeanTurns != want.MeanTurns || got.ActsPerEpisode != want.ActsPerEpisode {
				t.Errorf("%s: dataset %s %+v, planact says %+v", role, name, got, want)
			}
		}
	}

	refused := nodeCmd(t, dir, "node", append(args[:len(args):len(args)], "--check")...)
	msg, err := refused.CombinedOutput()
	if err == nil || !bytes.Contains(msg, []byte("--check checks samples")) {
		t.Errorf("--evaluate --check: %v\n%s\nwant a refusal saying why", err, msg)
	}
}

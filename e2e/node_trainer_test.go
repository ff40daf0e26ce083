package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/natsbin"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestNodeTrainer: the Node.js trainer of examples/node, written from
// schemas/ and the README alone, plays both roles of a rollout against a
// running planact, with its results inline and with tasks and results in
// the object stores, and its sample checks pass; planact sees what the
// contract says a trainer sends. A misspelt config field is refused and
// the Node trainer reports the reason, naming the field.
func TestNodeTrainer(t *testing.T) {
	t.Parallel()
	dir := nodeExample(t)

	t.Run("sample checks catch violations", func(t *testing.T) {
		if out, err := nodeCmd(t, dir, "node", "--test", "planact.test.js").CombinedOutput(); err != nil {
			t.Fatalf("node --test: %v\n%s", err, out)
		}
	})

	t.Run("pause and resume", func(t *testing.T) {
		// planact.test.js pauses and resumes against this planact: the
		// session-store takes the Node client's messages and ids.
		e := start(t, envOptions{planner: sim.Config{Seed: 89}, actor: sim.Config{Seed: 90}})
		cmd := nodeCmd(t, dir, "node", "--test", "--test-name-pattern", "^against planact", "planact.test.js")
		cmd.Env = append(cmd.Env, "PLANACT_TEST_NATS_URL="+e.url)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "# pass 1\n") {
			t.Fatalf("node --test against planact: %v (want one test passed)\n%s", err, out)
		}
	})

	cases := []struct {
		name        string
		inlineLimit int      // the session-store's: above it, results go to the object store
		args        []string // more trainer flags
		objects     bool     // tasks and samples travel through the object stores
		config      string   // more config fields
	}{
		{"results inline", 0, nil, false, ""},
		{"tasks and results in the object stores", 2048, []string{"--inline-tasks-limit", "1"}, true, ""},
		// The result names the groups it leaves out; the trainer reads them.
		{"results without the delivered groups", 2048, nil, false, `, "stream_groups": true, "result_samples": "undelivered"`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, envOptions{inlineLimit: c.inlineLimit, planner: sim.Config{Seed: int64(91 + 2*i)}, actor: sim.Config{Seed: int64(92 + 2*i)}})
			n := int64(901 + i)
			const distinct, perPrompt = 3, 2
			tasks := e.tasks(distinct, 1, n)
			args := append([]string{"--role", "both", "--tasks", writeTaskLines(t, tasks), "--samples-per-prompt", fmt.Sprint(perPrompt),
				"--config", `{"max_turns": 4, "barrier_timeout_s": 60, "rollout_timeout_s": 120` + c.config + `}`, "--check"}, c.args...)
			sum, code, stderr := runNodeTrainer(t, dir, e, n, args...)
			if code != 0 || !sum.OK {
				t.Fatalf("exit %d, ok %v\nstderr:\n%s", code, sum.OK, stderr)
			}
			if sum.Check == nil || !sum.Check.OK || len(sum.Check.Errors) > 0 {
				t.Errorf("sample checks: %+v", sum.Check)
			}
			episodes := distinct * perPrompt
			for role, r := range map[string]nodeRole{schema.RolePlanner: sum.Planner, schema.RoleActor: sum.Actor} {
				if r.Status != schema.ResultOK || r.Outcome != "samples" {
					t.Errorf("%s: status %q outcome %q (%s)", role, r.Status, r.Outcome, r.Reason)
				}
				if got := r.SamplesObject != ""; got != c.objects {
					t.Errorf("%s: samples_object %q, want one: %v", role, r.SamplesObject, c.objects)
				}
			}
			if sum.Episodes != episodes || sum.Planner.Samples != episodes {
				t.Errorf("%d planner samples, stats say %d episodes; want %d", sum.Planner.Samples, sum.Episodes, episodes)
			}
			if sum.Actor.Samples != sum.Acts || sum.Acts == 0 {
				t.Errorf("%d actor samples, stats say %d acts", sum.Actor.Samples, sum.Acts)
			}
			if got := sum.Planner.TasksObject != ""; got != c.objects {
				t.Errorf("tasks_object %q, want one: %v", sum.Planner.TasksObject, c.objects)
			}
			checkNodeArrivals(t, e, n, sum)
			checkAsGoSeesIt(t, e, n, tasks, perPrompt, sum)
		})
	}

	t.Run("misspelt config field", func(t *testing.T) {
		e := start(t, envOptions{planner: sim.Config{Seed: 95}, actor: sim.Config{Seed: 96}})
		const n = 903
		sum, code, stderr := runNodeTrainer(t, dir, e, n, "--role", "both", "--prompt", "What is the capital of France?", "--label", "Paris",
			"--config", `{"max_turn": 2}`)
		if code != 1 || sum.OK {
			t.Errorf("exit %d, ok %v: want 1 and false", code, sum.OK)
		}
		const want = `unknown field "config.max_turn"`
		for role, r := range map[string]nodeRole{schema.RolePlanner: sum.Planner, schema.RoleActor: sum.Actor} {
			if r.Status != schema.ResultInvalid || r.Outcome != "error" || !strings.Contains(r.Reason, want) {
				t.Errorf("%s: status %q outcome %q reason %q: want invalid, error, naming %s", role, r.Status, r.Outcome, r.Reason, want)
			}
		}
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not name the field:\n%s", stderr)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		// The actor waits alone at the barrier; a cancel from the command
		// line ends the rollout, and the waiting trainer gets its result.
		e := start(t, envOptions{planner: sim.Config{Seed: 97}, actor: sim.Config{Seed: 98}})
		const n = 904
		var stdout, stderr bytes.Buffer
		waiting := nodeCmd(t, dir, "node", "trainer.mjs", "--nats", e.url, "--rollout", fmt.Sprint(n), "--role", "actor",
			"--actor-engine", e.actor.URL, "--timeout", "120")
		waiting.Stdout, waiting.Stderr = &stdout, &stderr
		if err := waiting.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- waiting.Wait() }()
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		b := bustest.Bus(t, e.url, "observer")
		for {
			m, err := b.LastMsg(ctx, bus.StreamTrainer(schema.RoleActor), fmt.Sprintf("rollout.%d.arrive.actor", n))
			if err != nil {
				select {
				case werr := <-exited:
					t.Fatalf("the actor's arrival: %v; the waiting trainer had ended: %v\n%s", err, werr, stderr.String())
				default:
					t.Fatalf("the actor's arrival: %v (the waiting trainer still runs)", err)
				}
			}
			if m != nil {
				break
			}
			select {
			case werr := <-exited:
				t.Fatalf("the waiting trainer ended before its arrival was stored: %v\n%s", werr, stderr.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
		out, err := nodeCmd(t, dir, "node", "trainer.mjs", "--nats", e.url, "--rollout", fmt.Sprint(n), "--role", "actor",
			"--cancel", "enough").CombinedOutput()
		if err != nil {
			t.Fatalf("cancel: %v\n%s", err, out)
		}
		if err := <-exited; err != nil {
			t.Fatalf("the waiting actor: %v\n%s", err, stderr.String())
		}
		var sum nodeSummary
		if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
			t.Fatalf("summary: %v\n%s", err, stdout.String())
		}
		if r := sum.Actor; r.Status != schema.ResultAborted || r.Outcome != "samples" || r.Samples != 0 || !strings.Contains(r.Reason, "enough") {
			t.Errorf("actor: %+v, want aborted without samples, with the cancel's reason", r)
		}
		// A second cancel has nothing to abort: planact says so on the
		// status subject, and the trainer fails saying why (as the Go
		// client's Cancel returns ErrNothingToCancel), not as if it were done.
		out, err = nodeCmd(t, dir, "node", "trainer.mjs", "--nats", e.url, "--rollout", fmt.Sprint(n), "--role", "actor",
			"--cancel", "again").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "nothing to cancel") || !strings.Contains(string(out), "already ended") {
			t.Errorf("cancel of an ended rollout: %v, want exit 1 saying there was nothing to cancel, it had already ended\n%s", err, out)
		}
	})
}

// nodeSummary is the JSON the Node trainer prints on stdout.
type nodeSummary struct {
	Rollout  int64    `json:"rollout"`
	OK       bool     `json:"ok"`
	Episodes int      `json:"episodes"`
	Acts     int      `json:"acts"`
	Accuracy float64  `json:"accuracy"`
	Planner  nodeRole `json:"planner"`
	Actor    nodeRole `json:"actor"`
	Check    *struct {
		OK     bool     `json:"ok"`
		Errors []string `json:"errors"`
	} `json:"check"`
}

type nodeRole struct {
	Status        string  `json:"status"`
	Reason        string  `json:"reason"`
	Outcome       string  `json:"outcome"`
	ArrivalID     string  `json:"arrival_id"`
	TasksObject   string  `json:"tasks_object"`
	SamplesObject string  `json:"samples_object"`
	Samples       int     `json:"samples"`
	Tokens        int     `json:"tokens"`
	MeanReward    float64 `json:"mean_reward"`
}

// checkNodeArrivals: what the Node trainer published is what the contract
// asks of an arrival: its headers, and a Nats-Msg-Id that planact kept as
// the arrival's id.
func checkNodeArrivals(t *testing.T, e *env, n int64, sum nodeSummary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	b := bustest.Bus(t, e.url, "observer")
	for role, r := range map[string]nodeRole{schema.RolePlanner: sum.Planner, schema.RoleActor: sum.Actor} {
		m, err := b.LastMsg(ctx, bus.StreamTrainer(role), fmt.Sprintf("rollout.%d.arrive.%s", n, role))
		if err != nil || m == nil {
			t.Fatalf("%s arrival: %v", role, err)
		}
		want := map[string]string{
			schema.HdrSchema: "rollout.arrive/1", schema.HdrRollout: fmt.Sprint(n), schema.HdrRole: role,
			schema.HdrContentType: schema.ContentType, "Nats-Msg-Id": r.ArrivalID,
		}
		for h, v := range want {
			if got := m.Header.Get(h); got != v || v == "" {
				t.Errorf("%s arrival: header %s %q, want %q", role, h, got, v)
			}
		}
		if tp := m.Header.Get(schema.HdrTraceparent); bus.TraceIDOf(tp) != bus.RolloutTraceID(n) {
			t.Errorf("%s arrival: traceparent %q, want the rollout's trace id %s", role, tp, bus.RolloutTraceID(n))
		}
		var a schema.Arrive
		if err := schema.UnmarshalStrict(m.Data, &a); err != nil {
			t.Errorf("%s arrival: %v", role, err)
		}
	}
}

// checkAsGoSeesIt reads the same results with the Go client: the Node
// trainer counted every sample and token of them, and planact ran the
// tasks as the trainer numbered them (copies share a group).
func checkAsGoSeesIt(t *testing.T, e *env, n int64, tasks []schema.Task, perPrompt int, sum nodeSummary) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c := e.trainer(t)
	for role, r := range map[string]nodeRole{schema.RolePlanner: sum.Planner, schema.RoleActor: sum.Actor} {
		res, err := c.Result(ctx, n, role)
		if err != nil {
			t.Fatalf("%s result: %v", role, err)
		}
		tokens := 0
		for _, s := range res.Samples {
			tokens += len(s.Tokens)
		}
		if len(res.Samples) != r.Samples || tokens != r.Tokens || res.ArrivalID != r.ArrivalID {
			t.Errorf("%s: Go reads %d samples, %d tokens, arrival %q; Node reported %d, %d, %q",
				role, len(res.Samples), tokens, res.ArrivalID, r.Samples, r.Tokens, r.ArrivalID)
		}
		if role != schema.RolePlanner {
			continue
		}
		perGroup := map[int]int{}
		for _, s := range res.Samples {
			perGroup[s.GroupIndex]++
			if s.GroupIndex >= len(tasks) || s.Label != tasks[s.GroupIndex].Label || s.Index/perPrompt != s.GroupIndex {
				t.Errorf("planner sample %s: group %d index %d label %q", s.RolloutID, s.GroupIndex, s.Index, s.Label)
			}
		}
		for g := range tasks {
			if perGroup[g] != perPrompt {
				t.Errorf("group %d: %d planner samples, want %d", g, perGroup[g], perPrompt)
			}
		}
	}
}

// runNodeTrainer runs examples/node/trainer.mjs for rollout n against e and
// returns its JSON summary, exit status and stderr.
func runNodeTrainer(t *testing.T, dir string, e *env, n int64, args ...string) (nodeSummary, int, string) {
	t.Helper()
	args = append([]string{"trainer.mjs", "--nats", e.url, "--rollout", fmt.Sprint(n),
		"--planner-engine", e.planner.URL, "--actor-engine", e.actor.URL, "--timeout", "120"}, args...)
	cmd := nodeCmd(t, dir, "node", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("node trainer: %v\n%s", err, stderr.String())
	}
	t.Logf("node %s\n%s%s", strings.Join(args, " "), stderr.String(), stdout.String())
	var sum nodeSummary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil {
		t.Fatalf("node trainer summary: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return sum, cmd.ProcessState.ExitCode(), stderr.String()
}

func writeTaskLines(t *testing.T, tasks []schema.Task) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, task := range tasks {
		// Prompt and label only: the trainer numbers the copies.
		if err := enc.Encode(map[string]string{"prompt": task.Prompt, "label": task.Label}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// nodeExample returns examples/node with its dependencies installed: npm ci
// runs when node_modules is missing or older than the lock file. Without
// node or npm the test is skipped, naming what is missing.
func nodeExample(t *testing.T) string {
	t.Helper()
	var missing []string
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Skipf("the Node trainer needs Node.js 20+ and npm: %s not on PATH", strings.Join(missing, " and "))
	}
	dir, err := filepath.Abs(filepath.Join("..", "examples", "node"))
	if err != nil {
		t.Fatal(err)
	}
	if !installed(dir) {
		if out, err := nodeCmd(t, dir, "npm", "ci", "--no-audit", "--no-fund").CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// installed says whether npm's record of what it installed
// (node_modules/.package-lock.json) is newer than what asks for it.
func installed(dir string) bool {
	got, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err != nil {
		return false
	}
	for _, f := range []string{"package.json", "package-lock.json"} {
		want, err := os.Stat(filepath.Join(dir, f))
		if err != nil || want.ModTime().After(got.ModTime()) {
			return false
		}
	}
	return true
}

// nodeCmd runs name in dir, killed if it outlives the test's patience,
// without the caller's NATS_* settings (the test's server has no users).
func nodeCmd(t *testing.T, dir, name string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NATS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// TestNodeTrainerRefusesAnOldServer: against Debian's nats-server (2.9,
// older than planact needs) the Node trainer stops at once with one line
// naming the server's version and the one planact needs, exit status 1,
// instead of arriving and waiting for its whole time-out.
func TestNodeTrainerRefusesAnOldServer(t *testing.T) {
	t.Parallel()
	old := natsbin.Old(t)
	dir := nodeExample(t)
	cmd := nodeCmd(t, dir, "node", "trainer.mjs", "--nats", old.URL, "--rollout", "1", "--role", "both",
		"--planner-engine", "http://127.0.0.1:1", "--actor-engine", "http://127.0.0.1:1", "--prompt", "?", "--label", "!", "--timeout", "3600")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	want := "trainer: nats-server too old for planact: " + old.URL + " runs " + old.Version + ", planact needs 2.12.0 or later\n"
	if code := cmd.ProcessState.ExitCode(); code != 1 || stderr.String() != want {
		t.Errorf("node trainer on nats-server %s: %v, exit %d, stderr %q; want exit 1 and %q", old.Version, err, code, stderr.String(), want)
	}
}

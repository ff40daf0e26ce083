package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestReplay: planact replay runs a finished rollout of a running planact
// again and finds no difference; --record writes it to a file that --from
// replays, one episode alone; a recording changed by hand (a DAG today's
// parser would not make) is reported with where, and the command fails;
// --planner asks another planner each first prompt and shows both answers
// parsed; mistakes are named.
func TestReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := stacktest.Start(t, sim.Config{Seed: 1, PlannerStepwise: 0.5}, sim.Config{Seed: 2, ActorErrorRate: 0.2})
	e.Begin(t, 5, stacktest.Tasks(2, 2, 5), &schema.Config{MaxTurns: 3})
	e.Wait(t, 5)
	cmd := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut syncBuffer
		err := run(ctx, append([]string{"replay"}, args...), noenv, nil, &out, &errOut)
		t.Logf("replay %v:\n%s%s", args, out.String(), errOut.String())
		return out.String(), err
	}
	// The actor's result may come a moment after the planner's.
	var got string
	var err error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		got, err = cmd("--nats", e.URL, "5")
		if err == nil || !strings.Contains(err.Error(), "no actor result") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !strings.Contains(got, "replay of rollout 5 (4 episodes) through today's planact: no difference") {
		t.Fatalf("replay 5: %v", err)
	}

	file := filepath.Join(t.TempDir(), "r5.jsonl")
	if got, err := cmd("--nats", e.URL, "--record", file, "5"); err != nil || !strings.Contains(got, "rollout 5 recorded in "+file+": 4 episodes") {
		t.Fatalf("--record: %v", err)
	}
	if got, err := cmd("--from", file, "2"); err != nil || !strings.Contains(got, "replay of rollout 5 (episode 2) through today's planact: no difference") {
		t.Fatalf("--from %s 2: %v", file, err)
	}

	// A recorded DAG today's parser would not make of the recorded output.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		if strings.HasPrefix(l, `{"kind":"episode","episode":1,`) && strings.Contains(l, `"tool":"search"`) {
			lines[i], changed = strings.Replace(l, `"tool":"search"`, `"tool":"lookup"`, 1), true
		}
	}
	if !changed {
		t.Fatal("episode 1's recording has no search node to change")
	}
	bad := filepath.Join(t.TempDir(), "changed.jsonl")
	if err := os.WriteFile(bad, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = cmd("--from", bad, "--json")
	if !errors.Is(err, errDifferent) {
		t.Fatalf("a changed recording: %v, want the replay to differ", err)
	}
	var report struct {
		Differences []struct{ Where, Recorded, Replayed string }
	}
	if err := json.Unmarshal([]byte(got), &report); err != nil || len(report.Differences) != 1 ||
		!strings.HasPrefix(report.Differences[0].Where, "episode 1 turn ") || !strings.HasSuffix(report.Differences[0].Where, " dag") ||
		!strings.Contains(report.Differences[0].Recorded, `"lookup"`) || !strings.Contains(report.Differences[0].Replayed, `"search"`) {
		t.Errorf("report %+v (%v): want one difference, episode 1's DAG", report, err)
	}

	// Another planner, side by side.
	other, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: sim.RolePlanner, Seed: 9, PlanWidth: 3, WeightVersion: "other-1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err = cmd("--from", file, "--planner", other, "1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rollout 5 episode 1: ", "  recorded planner (weights planner-v7, ", "  " + other + " (weights other-1, ", "a plan of 3 nodes", "    | "} {
		if !strings.Contains(got, want) {
			t.Errorf("--planner: no %q in\n%s", want, got)
		}
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", file, "9"}, "rollout 5 has no episode 9 (it has 4)"},
		{[]string{"--from", filepath.Join(t.TempDir(), "none.jsonl")}, "no such file"},
		{[]string{"--nats", e.URL, "x"}, `rollout "x": want a rollout id`},
		{[]string{"--nats", e.URL, "77"}, "rollout 77: the streams hold no planner arrival"},
		{[]string{"--from", file, "--record", file}, "one or the other"},
		{[]string{"--from", file, "--planner-protocol", "openai"}, "go with --planner"},
		{[]string{"--from", file, "--planner", other, "--planner-protocol", "grpc"}, `unknown protocol "grpc"`},
	} {
		if _, err := cmd(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("replay %v: %v, want %q", c.args, err, c.want)
		}
	}
}

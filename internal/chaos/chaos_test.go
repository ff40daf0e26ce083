package chaos_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
)

// TestChaosCluster runs a short chaos run on the three-node cluster: every
// kind of service process killed, an act-dispatcher stopped past its ack
// wait, a stream leader and the meta leader killed, the whole cluster
// restarted, with rollouts in flight throughout; then it holds the ledger.
// It asserts what came out, never how fast: recovery times are logged and
// written to the report. PLANACT_CHAOS_SEED reproduces a schedule;
// PLANACT_CHAOS_OUT keeps the report (and, on failure, the logs).
func TestChaosCluster(t *testing.T) {
	root, err := chaos.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bin, err := chaos.Build(ctx, root, t.TempDir())
	if err != nil {
		t.Skipf("cannot build planact and nats-server, so no chaos run: %v", err)
	}
	seed := time.Now().UnixNano() % 1_000_000
	if s := os.Getenv("PLANACT_CHAOS_SEED"); s != "" {
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("PLANACT_CHAOS_SEED: %v", err)
		}
	}
	t.Logf("seed %d (PLANACT_CHAOS_SEED=%d reproduces the fault schedule)", seed, seed)
	out := os.Getenv("PLANACT_CHAOS_OUT")
	work, err := os.MkdirTemp(out, "planact-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() && out != "" {
			t.Logf("logs and stores kept in %s", work)
			return
		}
		os.RemoveAll(work)
	})

	// Every fault of the cluster but the planner-gateway's stop, which
	// must outlast its 60s ack wait (make chaos has it).
	var kinds []string
	for _, k := range chaos.FaultKinds(chaos.Cluster) {
		if k != chaos.FaultStopPlanner {
			kinds = append(kinds, k)
		}
	}
	o := chaos.Options{
		Topology: chaos.Cluster, Root: root, Bin: bin, Dir: work, Seed: seed,
		Rollouts: 24, Concurrency: 4, Tasks: 2, PerPrompt: 1,
		// Faults 3s apart after each repair, as make chaos has them: the
		// report's recovery times (planact's, after a leader's crash, a
		// few seconds) still fall between two faults.
		Faults: len(kinds), Kinds: kinds, Span: time.Minute, Gap: 3 * time.Second, Settle: 10 * time.Second,
		// A rollout's deadlines stay below the history, so that planact
		// itself ends a late one before its session may expire.
		// The barrier outlasts a whole-cluster restart: a trainer's
		// arrival may wait for the cluster to come back.
		BarrierTimeout: 40 * time.Second, RolloutTimeout: 75 * time.Second, Grace: 30 * time.Second,
		Retention:      chaos.Retention{History: 2 * time.Minute, Results: 30 * time.Second},
		RetentionSlack: 75 * time.Second,
		// The watchdog drives on, within the rollout's deadline, an episode
		// a fault left without progress (make chaos: a minute of five): a
		// NATS leader's crash can strand one until it does (README).
		ServeFlags: []string{"--stall-timeout", "20s"},
		// Engines slow enough that four rollouts in flight finish about
		// one a second rather than four: every fault still lands among
		// them, and the run costs the suite half the CPU.
		SimFlags: []string{"--ttft", "150ms", "--per-token", "1ms"},
		Progress: testWriter{t},
	}
	rep, err := chaos.Run(ctx, o)
	if rep != nil {
		t.Logf("report:\n%s", chaos.Markdown([]*chaos.Report{rep}))
		if out != "" {
			if err := chaos.WriteReports(out, "chaos-test", []*chaos.Report{rep}); err != nil {
				t.Error(err)
			}
		}
	}
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	if len(rep.Faults) != len(kinds) {
		t.Errorf("%d faults carried out, want %d", len(rep.Faults), len(kinds))
	}
	if rep.Tally.Rollouts < o.Rollouts {
		t.Errorf("%d rollouts checked, want at least %d", rep.Tally.Rollouts, o.Rollouts)
	}
	for _, f := range rep.Failures() {
		t.Error(f)
	}
	for _, e := range rep.Exits {
		t.Errorf("%s exited on its own at %s: %s\n%s", e.Proc, e.At.Format(time.TimeOnly), e.Err, e.LogTail)
	}
}

// testWriter sends the run's progress lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}

// TestProcKillReachesTheGroup checks that a kill takes down what the
// process started too: nothing the harness starts may outlive it.
func TestProcKillReachesTheGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	p := &chaos.Proc{
		Name: "sh", Kind: "test", Path: "/bin/sh",
		Args: []string{"-c", fmt.Sprintf("sleep 1000 & echo $! > %s; echo started; wait", pidFile)},
		Log:  filepath.Join(dir, "sh.log"),
	}
	if err := p.Start(); err != nil {
		t.Skipf("no /bin/sh: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.WaitLog(ctx, "started"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(string(trimNewline(data)))
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if p.Running() {
		t.Fatal("the process runs after Kill")
	}
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", child)); os.IsNotExist(err) || zombie(child) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the process's child %d outlived the kill", child)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if len(p.Exits()) != 0 {
		t.Errorf("a kill the harness asked for counts as an unexpected exit: %v", p.Exits())
	}
}

// zombie reports whether pid has exited and awaits its reaping (by init,
// once its parent is gone).
func zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == ')' && i+2 < len(data) {
			return data[i+2] == 'Z'
		}
	}
	return false
}

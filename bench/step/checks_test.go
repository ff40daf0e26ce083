package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
)

// cleanRun is the input of analyse for a run that followed its script: one
// rollout of two prompts × two copies, every scripted generation called
// once and ended ok, a service and nats-server running from the step's
// start to its end. Each test below doctors one thing of it.
type cleanRun struct {
	o             options
	calls         [2]Calls
	logs          []TrainerLog
	before, after snapshot
	c             *cluster
}

func newCleanRun(t *testing.T) *cleanRun {
	t.Helper()
	o, err := parseOptions([]string{"-prompts", "2", "-copies", "2", "-rollouts", "1", "-target-frac", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := &o.Model
	const t0 = int64(1_000_000_000)
	at := t0 + int64(time.Millisecond)
	calls := [2]Calls{{Role: rolePlanner, Limit: m.Planner.Limit}, {Role: roleActor, Limit: m.Actor.Limit}}
	call := func(role int, ep Episode, turn, node int, g Gen) {
		s := int64(g.Service())
		calls[role].Calls = append(calls[role].Calls, Call{Role: calls[role].Role, Rollout: ep.Rollout, Episode: ep.Index, Turn: turn, Node: node,
			ArrivedNs: at, QueuedNs: at, AdmittedNs: at, DoneNs: at + s, ServiceNs: s, Outcome: "ok"})
		at += s
	}
	for e := range o.Prompts * m.Copies {
		ep := m.Episode(1, e)
		for i, turn := range ep.Turns {
			call(0, ep, i+1, -1, turn.Planner)
			for k, a := range turn.Acts {
				call(1, ep, i+1, k, a.Gen)
			}
		}
	}
	states := map[string]int{schema.TaskTrained: o.Prompts * m.Copies}
	rollout := RolloutLog{Rollout: 1, ArrivedNs: t0, ResultNs: at + int64(time.Millisecond), Status: schema.ResultOK, Stats: schema.Stats{TaskStates: states}}
	c := &cluster{}
	snap := func(cpu time.Duration) snapshot {
		s := snapshot{Procs: map[string]procStat{}}
		for _, name := range []string{"session-store-1", "nats"} {
			s.Procs[name] = procStat{CPU: cpu, RSS: 1 << 20, PeakRS: 1 << 21}
		}
		return s
	}
	c.procs = []*proc{{Proc: &chaos.Proc{Name: "session-store-1"}, Group: groupPlanact}, {Proc: &chaos.Proc{Name: "nats"}, Group: groupNATS}}
	return &cleanRun{o: o, calls: calls, logs: []TrainerLog{{Role: rolePlanner, Rollouts: []RolloutLog{rollout}}, {Role: roleActor, Rollouts: []RolloutLog{rollout}}},
		before: snap(time.Second), after: snap(3 * time.Second), c: c}
}

func (cr *cleanRun) analyse(t *testing.T) *Report {
	t.Helper()
	r := &Report{Options: cr.o, Raw: Raw{CPUPerMsgMs: 0.01, NATSMsgsPerMsg: 3}}
	if err := r.analyse(cr.o, cr.calls, cr.logs, nil, cr.before, cr.after, nil, cr.c); err != nil {
		t.Fatal(err)
	}
	return r
}

func failedWith(r *Report, words string) bool {
	for _, f := range r.Failures {
		if strings.Contains(f, words) {
			return true
		}
	}
	return false
}

// TestCleanRunPassesItsChecks: the fixture itself is a run to quote, and
// its per-act figures divide by the acts it generated.
func TestCleanRunPassesItsChecks(t *testing.T) {
	cr := newCleanRun(t)
	r := cr.analyse(t)
	if len(r.Failures) > 0 {
		t.Fatalf("a run that followed its script failed: %v", r.Failures)
	}
	if r.Run.Acts != len(cr.calls[1].Calls) || r.Run.Acts == 0 {
		t.Errorf("%d acts counted, the actor engine generated %d", r.Run.Acts, len(cr.calls[1].Calls))
	}
	if got, want := r.Groups["planact+nats"].CPUS, 4.0; !near(got, want) {
		t.Errorf("planact+nats CPU %.3f s, want %.3f", got, want)
	}
}

// TestProcessGoneAtTheEndFailsTheRun: a service missing from the last
// snapshot (it exited after the last look for exits) counted 0 - its CPU
// before the step: less than nothing, and the per-act cost fell.
func TestProcessGoneAtTheEndFailsTheRun(t *testing.T) {
	cr := newCleanRun(t)
	delete(cr.after.Procs, "session-store-1")
	r := cr.analyse(t)
	if !failedWith(r, "session-store-1 was not running at the step's end") {
		t.Errorf("a service gone at the step's end: failures %v, planact+nats CPU %.3f s", r.Failures, r.Groups["planact+nats"].CPUS)
	}
	cr = newCleanRun(t)
	delete(cr.before.Procs, "nats")
	if r := cr.analyse(t); !failedWith(r, "nats was not running at the step's start") {
		t.Errorf("nats-server missing at the step's start: failures %v", r.Failures)
	}
	// A restart: another process, whose CPU starts from 0.
	cr = newCleanRun(t)
	cr.after.Procs["nats"] = procStat{CPU: time.Second / 2}
	if r := cr.analyse(t); !failedWith(r, "nats's CPU went from") {
		t.Errorf("nats-server's CPU went backwards: failures %v", r.Failures)
	}
}

// TestCutCallsFailTheBound: a call cut at max_new_tokens held its slot for
// less than its drawn service time, which the bound counts in full: the
// bound would be too high, and makespan ÷ bound flattered.
func TestCutCallsFailTheBound(t *testing.T) {
	cr := newCleanRun(t)
	for i := range cr.calls[1].Calls {
		c := &cr.calls[1].Calls[i]
		c.Outcome, c.DoneNs = "cut", c.AdmittedNs+c.ServiceNs/10
	}
	if r := cr.analyse(t); !failedWith(r, "cut at max_new_tokens") {
		t.Errorf("every act cut short: failures %v", r.Failures)
	}
}

// TestFailedTasksFailTheBound: an ok rollout whose tasks failed early did
// less than the script the bound is computed from.
func TestFailedTasksFailTheBound(t *testing.T) {
	cr := newCleanRun(t)
	cr.logs[1].Rollouts[0].Stats.TaskStates = map[string]int{schema.TaskTrained: 1, schema.TaskFailed: 3}
	if r := cr.analyse(t); !failedWith(r, "3 tasks failed") {
		t.Errorf("3 failed tasks in the actor's result: failures %v", r.Failures)
	}
}

// TestEngineLimitUnlikeTheBound: an engine that served more at once than
// the bound assumes makes the bound's capacity terms too high.
func TestEngineLimitUnlikeTheBound(t *testing.T) {
	cr := newCleanRun(t)
	cr.calls[1].Limit *= 2
	if r := cr.analyse(t); !failedWith(r, "the actor engine served") {
		t.Errorf("actor engine limit twice the model's: failures %v", r.Failures)
	}
}

// TestActsCountedAreActsGenerated: an act whose every call was aborted or
// left (its episode stopped) was not generated; counting it divided the
// per-act figures by more acts than ran.
func TestActsCountedAreActsGenerated(t *testing.T) {
	cr := newCleanRun(t)
	ran := len(cr.calls[1].Calls)
	for i := range 5 {
		cr.calls[1].Calls = append(cr.calls[1].Calls, Call{Role: roleActor, Rollout: 1, Episode: 0, Turn: 9, Node: i,
			ArrivedNs: 2e9, DoneNs: 2e9 + 1, Outcome: []string{"aborted", "disconnected"}[i%2]})
	}
	r := cr.analyse(t)
	if r.Run.Acts != ran {
		t.Errorf("%d acts counted, %d generated", r.Run.Acts, ran)
	}
	if want := 1000 * 4.0 / float64(ran); !near(r.Groups["planact+nats"].PerActMs, want) {
		t.Errorf("planact+nats CPU per act %.4f ms, want %.4f", r.Groups["planact+nats"].PerActMs, want)
	}
}

// TestFailedRunIsNotWrittenAsAResult: a run whose checks failed printed
// and wrote its figures as any other and exited 0: it could replace a
// quoted result. Its files are now named -failed, and the run fails.
func TestFailedRunIsNotWrittenAsAResult(t *testing.T) {
	cr := newCleanRun(t)
	cr.logs[0].Rollouts[0].Status, cr.logs[0].Rollouts[0].Reason = schema.ResultFailed, "doctored"
	r := cr.analyse(t)
	o := cr.o
	o.Out, o.Name = t.TempDir(), "step"
	var out strings.Builder
	err := r.write(o, &out)
	if err == nil || !strings.Contains(err.Error(), "not a result") {
		t.Errorf("write of a failed run returned %v", err)
	}
	if !strings.HasPrefix(out.String(), "NOT A RESULT: 1 checks failed") {
		t.Errorf("the report begins %q", strings.SplitN(out.String(), "\n", 2)[0])
	}
	if _, err := os.Stat(filepath.Join(o.Out, "step.json")); !os.IsNotExist(err) {
		t.Errorf("step.json written for a failed run (stat: %v)", err)
	}
	if _, err := os.Stat(filepath.Join(o.Out, "step-failed.json")); err != nil {
		t.Errorf("no step-failed.json: %v", err)
	}
}

package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Machine describes where a run ran.
type Machine struct {
	CPUs      int    `json:"nproc"`
	CPU       string `json:"cpu,omitempty"`
	MemoryGiB string `json:"memory_gib"`
	Go        string `json:"go"`
	OS        string `json:"os"`
	Load      string `json:"load_at_start,omitempty"` // /proc/loadavg: the machine is shared
}

// ThisMachine reads nproc, memory and the Go version.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscan(strings.TrimSpace(rest), &kb)
				m.MemoryGiB = fmt.Sprintf("%.1f", kb/(1<<20))
			}
		}
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), ":"))
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(data))
		if len(f) >= 3 {
			m.Load = strings.Join(f[:3], " ")
		}
	}
	return m
}

// Settings are the knobs of a run, as reported.
type Settings struct {
	Seed           int64             `json:"seed"`
	Rollouts       int               `json:"rollouts"` // asked for, at least
	Concurrency    int               `json:"concurrency"`
	Tasks          int               `json:"tasks"`
	PerPrompt      int               `json:"samples_per_prompt"`
	RolloutTimeout string            `json:"rollout_timeout"`
	BarrierTimeout string            `json:"barrier_timeout"`
	ActTimeout     string            `json:"act_timeout"`
	Span           string            `json:"span"`
	Faults         []Fault           `json:"schedule,omitempty"`
	AckWaits       map[string]string `json:"ack_waits,omitempty"` // the stops outlast these
	ServeArgs      []string          `json:"serve_args"`
	Auth           bool              `json:"auth"`
	Mode           string            `json:"mode,omitempty"`          // the rollouts' coordination mode; absent: plan_act
	EnsemblePick   string            `json:"ensemble_pick,omitempty"` // with mode ensemble; absent: vote
}

// Report is the outcome of one chaos run on one topology.
type Report struct {
	Topology string    `json:"topology"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Machine  Machine   `json:"machine"`
	Settings Settings  `json:"settings"`
	Tally    Tally     `json:"ledger"`
	// Pickup is how long trainers took to get a result after the bus had
	// stored it (pkg/client's wait), over every rollout with both results.
	Pickup    Pickup                   `json:"result_pickup"`
	Faults    []FaultRecord            `json:"faults"`
	Recovery  map[string]RecoveryStats `json:"recovery"`
	Leftovers Leftovers                `json:"leftovers"`
	Exits     []Exit                   `json:"unexpected_exits,omitempty"`
	// Violations are the permission violations the nodes logged (Auth).
	Violations []string       `json:"permission_violations,omitempty"`
	Problems   []RolloutCheck `json:"problems,omitempty"` // rollouts that are not ok
	// Unsolicited is what the bus shows of rollouts no trainer played
	// (results, executed acts) or of roles that are none.
	Unsolicited []string `json:"unsolicited,omitempty"`
	// Unread are messages the harness could not read: the ledger lacks them.
	Unread []string `json:"unread,omitempty"`
	// EngineCalls sums the generation calls the simulated engines took,
	// which the ledger holds against the acts' outcomes.
	EngineCalls CallsSummary `json:"engine_calls"`
	// ObserverErrors are what the harness's own consumers went through
	// (resets after restarts); they are not planact's failures.
	ObserverErrors []string `json:"observer_errors,omitempty"`
	Err            string   `json:"err,omitempty"` // the run could not be completed
	Pass           bool     `json:"pass"`
}

// Pickup sums up how late trainers got results that the bus had stored.
type Pickup struct {
	Median time.Duration `json:"median_ns"`
	P99    time.Duration `json:"p99_ns"`
	Max    time.Duration `json:"max_ns"`
}

// PickupOf measures, for every rollout whose results the observer saw,
// the time from the later of its two results being stored to the trainers
// having both.
func PickupOf(recs []RolloutRecord, resultAt func(int64) (time.Time, bool)) Pickup {
	var ds []time.Duration
	for _, r := range recs {
		at, ok := resultAt(r.Rollout)
		if !ok || r.Ended.IsZero() {
			continue
		}
		ds = append(ds, max(r.Ended.Sub(at), 0))
	}
	if len(ds) == 0 {
		return Pickup{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return Pickup{Median: ds[len(ds)/2], P99: ds[(len(ds)*99)/100], Max: ds[len(ds)-1]}
}

// FaultsByKind counts the faults injected, per kind.
func (r *Report) FaultsByKind() map[string]int {
	out := map[string]int{}
	for _, f := range r.Faults {
		out[f.Kind]++
	}
	return out
}

// Verdict decides Pass: every rollout ok, every fault planned injected, no
// process exited on its own, nothing on the bus that no trainer asked for
// or that the harness could not read, every engine call counted, nothing
// left.
func (r *Report) Verdict() {
	failed := 0
	for _, f := range r.Faults {
		if f.Err != "" {
			failed++
		}
	}
	r.Pass = r.Err == "" && r.Tally.Clean() && failed == 0 && len(r.Faults) == len(r.Settings.Faults) &&
		len(r.Exits) == 0 && len(r.Unsolicited) == 0 && len(r.Unread) == 0 && len(r.EngineCalls.Incomplete) == 0 &&
		r.Leftovers.Total() == 0 && r.Leftovers.Err == "" && len(r.Violations) == 0
}

// Failures lists why the run did not pass, one line each.
func (r *Report) Failures() []string {
	var out []string
	t := r.Tally
	if r.Err != "" {
		out = append(out, "run: "+r.Err)
	}
	if t.Rollouts == 0 {
		out = append(out, "no rollout ran")
	}
	for _, c := range []struct {
		n    int
		what string
	}{
		{t.Lost, "rollouts lost (no result on the bus)"},
		{t.Hung, "rollouts hung (no result by their deadline)"},
		{t.WrongStatus, "rollouts ended with a wrong status"},
		{t.Duplicated, "rollouts with duplicated samples or results, or acts generated more often than recorded"},
		{t.Mismatched, "rollouts whose samples or results' counts do not match what ran (acts executed, the engines' tokens and calls)"},
		{t.ClientGaveUp, "rollouts where pkg/client gave up waiting before the deadline (the trainer asked again)"},
	} {
		if c.n > 0 {
			out = append(out, fmt.Sprintf("%d of %d %s", c.n, t.Rollouts, c.what))
		}
	}
	for _, f := range r.Faults {
		if f.Err != "" {
			out = append(out, fmt.Sprintf("fault %s on %s could not be carried out: %s", f.Kind, f.Target, f.Err))
		}
	}
	if len(r.Faults) != len(r.Settings.Faults) {
		out = append(out, fmt.Sprintf("%d of %d faults planned were carried out", len(r.Faults), len(r.Settings.Faults)))
	}
	if len(r.Exits) > 0 {
		e := r.Exits[0]
		out = append(out, fmt.Sprintf("%d processes exited on their own, first %s at %s: %s", len(r.Exits), e.Proc, e.At.Format("15:04:05"), e.Err))
	}
	if len(r.Unsolicited) > 0 {
		out = append(out, fmt.Sprintf("%d on the bus that no trainer asked for, first: %s", len(r.Unsolicited), r.Unsolicited[0]))
	}
	if len(r.Unread) > 0 {
		out = append(out, fmt.Sprintf("%d messages the harness could not read, first: %s", len(r.Unread), r.Unread[0]))
	}
	if n := len(r.EngineCalls.Incomplete); n > 0 {
		out = append(out, fmt.Sprintf("the engines' generation calls are not all counted (%d notes), first: %s", n, r.EngineCalls.Incomplete[0]))
	}
	if len(r.Violations) > 0 {
		out = append(out, fmt.Sprintf("%d permission violations, first: %s", len(r.Violations), r.Violations[0]))
	}
	if l := r.Leftovers; l.Total() > 0 || l.Err != "" {
		out = append(out, fmt.Sprintf("left after retention (%s): keys %s; objects %s %s", l.Retention, formatCounts(l.Keys), formatCounts(l.PerStore), l.Err))
	}
	return out
}

// Markdown renders reports as the summary table, then per topology the
// faults with their recovery times and the rollouts that are not ok.
func Markdown(reports []*Report) string {
	var b strings.Builder
	b.WriteString("| topology | rollouts | ok | faults | lost | duplicated | hung | wrong status | mismatched | client gave up | left after retention (sessions/runs/objects) | unexpected exits | pass |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range reports {
		t := r.Tally
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d/%d/%d | %d | %s |\n",
			r.Topology, t.Rollouts, t.OK, len(r.Faults), t.Lost, t.Duplicated, t.Hung, t.WrongStatus, t.Mismatched, t.ClientGaveUp,
			r.Leftovers.Sessions, r.Leftovers.Runs, r.Leftovers.Objects, len(r.Exits), yesNo(r.Pass))
	}
	for _, r := range reports {
		fmt.Fprintf(&b, "\n### %s\n\n", r.Topology)
		m := r.Machine
		fmt.Fprintf(&b, "machine: nproc %d (%s), %s GiB, %s, %s; load average at start %s; started %s\n\n",
			m.CPUs, m.CPU, m.MemoryGiB, m.Go, m.OS, m.Load, r.Started.UTC().Format(time.RFC3339))
		s := r.Settings
		fmt.Fprintf(&b, "seed %d, %.0fs, %d rollouts (%d in flight, %d tasks × %d), barrier timeout %s, rollout timeout %s, act timeout %s, ack waits %s; `planact %s`\n\n",
			s.Seed, r.Seconds, r.Tally.Rollouts, s.Concurrency, s.Tasks, s.PerPrompt, s.BarrierTimeout, s.RolloutTimeout, s.ActTimeout,
			formatCounts(s.AckWaits), strings.Join(s.ServeArgs, " "))
		t := r.Tally
		fmt.Fprintf(&b, "episodes %d, planner samples %d; executed acts (ACT stream) %d, actor samples %d; duplicate samples %d, missing %d, extra %d, not what the engines generated %d; results' counts not true of them %d\n\n",
			t.Episodes, t.PlannerSamples, t.ExecutedActs, t.ActorSamples, t.DuplicateSamples, t.MissingSamples, t.ExtraSamples, t.BadSamples, t.BadCounts)
		fmt.Fprintf(&b, "engine calls: %d for %d acts, %d beyond what the acts' outcomes record (attempts, retries, pause aborts), %d executed acts with no call counted; %d for planner turns\n\n",
			r.EngineCalls.ActCalls, r.EngineCalls.Acts, t.UnexplainedCalls, t.UncountedActs, r.EngineCalls.TurnCalls)
		fmt.Fprintf(&b, "trainers got their results after the bus stored them: median %s, p99 %s, max %s\n\n",
			secs(r.Pickup.Median), secs(r.Pickup.P99), secs(r.Pickup.Max))
		if len(r.Faults) > 0 {
			b.WriteString("| fault | injected | target ready (median) | first progress (median) | next rollout completed (median / max) | all in-flight episodes moved (median / max) | never moved | stuck before |\n")
			b.WriteString("|---|---|---|---|---|---|---|---|\n")
			kinds := sortedKeys(r.Recovery)
			for _, k := range kinds {
				st := r.Recovery[k]
				inj := fmt.Sprint(st.Faults)
				if st.Failed > 0 {
					inj += fmt.Sprintf(" (%d failed)", st.Failed)
				}
				maxFull := secs(st.MaxFull)
				if st.Unrecovered > 0 {
					maxFull = "never"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s / %s | %s / %s | %d | %d |\n", k, inj, secs(st.MedianTargetReady), secs(st.MedianFirst), secs(st.MedianNext), secs(st.MaxNext), secs(st.MedianFull), maxFull, st.Unrecovered, st.Stuck)
			}
			b.WriteString("\n")
		}
		l := r.Leftovers
		fmt.Fprintf(&b, "left after retention (%s, waited %s): keys %s; objects %s; stream messages %s\n",
			l.Retention, secs(l.Waited), formatCounts(l.Keys), formatCounts(l.PerStore), formatCounts(l.Messages))
		if l.Err != "" {
			fmt.Fprintf(&b, "(counting failed: %s)\n", l.Err)
		}
		if fs := r.Failures(); len(fs) > 0 {
			b.WriteString("\nfailures:\n")
			for _, f := range fs {
				fmt.Fprintf(&b, "- %s\n", f)
			}
		}
		if len(r.Exits) > 0 {
			b.WriteString("\nunexpected exits (restarted by the harness):\n")
			for _, e := range r.Exits {
				fmt.Fprintf(&b, "- %s %s: %s\n", e.At.Format("15:04:05"), e.Proc, e.Err)
			}
		}
		if len(r.Problems) > 0 {
			b.WriteString("\nrollouts that are not ok (first 20):\n")
			for i, c := range r.Problems {
				if i == 20 {
					fmt.Fprintf(&b, "- … %d more\n", len(r.Problems)-20)
					break
				}
				fmt.Fprintf(&b, "- rollout %d %s: %s\n", c.Rollout, c.Verdict, strings.Join(first(c.Problems, 3), "; "))
			}
		}
	}
	b.WriteString("\n" + recoveryDefinition)
	return b.String()
}

const recoveryDefinition = `Recovery times: at a fault's time F (the kill or SIGSTOP), an episode is in flight if its rollout
had started and neither the episode's end nor the rollout's result was stored by F. It moves when
JetStream stores an act outcome, a planner output or the end of that episode, or a result of its
rollout. "first progress" is F to the first such message of any rollout; "next rollout completed" is F
until the first rollout completed after it (both roles' results stored); "all moved" is F until every
episode in flight at F had moved ("never" when one never did: its median is over the other faults); "never moved" counts episodes that did not move again. Episodes that
had not moved for 45s before F were stuck already and are counted apart ("stuck before"), not timed;
"–" means nothing was in flight at F (for instance, every trainer was still waiting for a result already published).
"target ready" is F until the killed process (or node, after /healthz) was ready again.
`

// WriteReports writes the markdown and the JSON of reports into dir as
// name.md and name.json.
func WriteReports(dir, name string, reports []*Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".md"), []byte(Markdown(reports)), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), append(data, '\n'), 0o644)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func secs(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func formatCounts[V int | uint64 | string](m map[string]V) string {
	if len(m) == 0 {
		return "–"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %v", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("… %d more", len(s)-n))
	}
	return s
}

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Machine is what the figures were measured on.
type Machine struct {
	CPUs       int    `json:"nproc"`
	CPUModel   string `json:"cpu_model,omitempty"`
	Go         string `json:"go"`
	OS         string `json:"os"`
	Date       string `json:"date"`
	LoadBefore string `json:"loadavg_before,omitempty"`
	LoadAfter  string `json:"loadavg_after,omitempty"`
}

func describeMachine() Machine {
	return Machine{CPUs: runtime.NumCPU(), CPUModel: firstField("/proc/cpuinfo", "model name"), Go: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, Date: time.Now().UTC().Format(time.RFC3339), LoadBefore: firstLine("/proc/loadavg")}
}

func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func firstLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return line
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile is the nearest-rank percentile q (0–100) of v; NaN when empty.
func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	i := int(math.Ceil(q/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(v []float64) float64 { return percentile(v, 50) }

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

// Goal is one goal of the issue, and whether this run met it.
type Goal struct {
	Goal    string  `json:"goal"`
	Figure  string  `json:"figure"` // what Value is
	Target  string  `json:"target"`
	Value   float64 `json:"value"`
	Met     bool    `json:"met"`
	Missing bool    `json:"missing,omitempty"` // not measured in this run (a width left out)
}

func (g Goal) status() string {
	switch {
	case g.Missing:
		return "not measured"
	case g.Met:
		return "met"
	}
	return "NOT MET"
}

// Figures the goals are about, by which the table finds them.
const (
	figCAS14  = "CAS conflicts per act, width 14"
	figBarr   = "barrier p50 (ms)"
	figEager  = "mean makespan ÷ critical path, 64 in flight"
	goalRaw   = "acts/s ≥ 10% of raw publish+consume"
	goalAct   = "added latency per act p50 < 0.5 ms"
	goalCAS   = "CAS conflicts per act < 0.05 at width 14"
	goalBarr  = "barrier p50 < 1 ms"
	goalEager = "eager makespan ≤ 1.05× critical path with 64 in flight"
)

func figRaw(w int) string { return fmt.Sprintf("acts/s ÷ raw msgs/s, width %d", w) }
func figAct(w int) string { return fmt.Sprintf("added per act p50 (ms), width %d", w) }

// evaluate sets the goals from the figures.
func (r *Report) evaluate() {
	r.Goals = nil
	for _, t := range r.Throughput {
		r.Goals = append(r.Goals, Goal{Goal: goalRaw, Figure: figRaw(t.Width), Target: "≥ 0.10", Value: t.RatioToRaw, Met: t.RatioToRaw >= 0.10})
	}
	g := Goal{Goal: goalCAS, Figure: figCAS14, Target: "< 0.05", Missing: true}
	for _, t := range r.Throughput {
		if t.Width == 14 {
			g.Value, g.Met, g.Missing = t.PerAct.CASConflicts, t.PerAct.CASConflicts < 0.05, false
		}
	}
	r.Goals = append(r.Goals, g)
	for _, l := range r.Light {
		r.Goals = append(r.Goals, Goal{Goal: goalAct, Figure: figAct(l.Width), Target: "p50 < 0.5 ms", Value: l.PerAct.P50, Met: l.PerAct.P50 < 0.5})
	}
	r.Goals = append(r.Goals, Goal{Goal: goalBarr, Figure: figBarr, Target: "p50 < 1 ms", Value: r.Barrier.P50, Met: r.Barrier.P50 < 1})
	g = Goal{Goal: goalEager, Figure: figEager, Target: "mean ≤ 1.05", Missing: true}
	for _, e := range r.Eager {
		if e.InFlight == 64 {
			g.Value, g.Met, g.Missing = e.MeanRatio, e.MeanRatio <= 1.05, false
		}
	}
	r.Goals = append(r.Goals, g)
	r.Notes = r.notes()
}

// check fails a run whose figures are missing or not numbers.
func (r *Report) check() error {
	var errs []error
	b := r.Baselines
	for name, v := range map[string]float64{
		"baseline 1 msgs/s": b.PubSub.Median, "baseline 2 ops/s": b.CAS.OpsPerS, "baseline 3 p50": b.Requests.P50Ms,
	} {
		if !(v > 0) {
			errs = append(errs, fmt.Errorf("%s is %v", name, v))
		}
	}
	if len(r.Throughput) == 0 || len(r.Light) == 0 || len(r.Eager) == 0 {
		errs = append(errs, fmt.Errorf("figures missing: %d throughput, %d light-load, %d eager runs", len(r.Throughput), len(r.Light), len(r.Eager)))
	}
	for _, t := range r.Throughput {
		if !(t.ActsPerS > 0) || !(t.PerAct.StoredMsgs > 0) || !(t.PerAct.NATSMsgs > 0) || !(t.PerAct.KVOps > 0) || !(t.PerAct.CPUMs > 0) {
			errs = append(errs, fmt.Errorf("throughput, width %d: a figure is zero: %.1f acts/s, per act %.1f stored msgs, %.1f NATS msgs, %.1f kv ops, %.2f ms CPU",
				t.Width, t.ActsPerS, t.PerAct.StoredMsgs, t.PerAct.NATSMsgs, t.PerAct.KVOps, t.PerAct.CPUMs))
		}
	}
	if r.Barrier.N == 0 {
		errs = append(errs, errors.New("barrier: no figures"))
	}
	for _, l := range r.Light {
		if l.PerAct.N == 0 || l.PerActingTurn.N == 0 || l.PerFinalTurn.N == 0 {
			errs = append(errs, fmt.Errorf("light load, width %d: latencies missing: %d acts, %d turns with acts, %d answering turns", l.Width, l.PerAct.N, l.PerActingTurn.N, l.PerFinalTurn.N))
		}
	}
	for _, e := range r.Eager {
		if !(e.MeanRatio > 0) {
			errs = append(errs, fmt.Errorf("eager, %d in flight: ratio %v", e.InFlight, e.MeanRatio))
		}
	}
	return errors.Join(errs...)
}

func (r *Report) notes() []string {
	n := []string{
		"Server(s), the five services, the simulated engines and the client share this one process: CPU per act is all of it, and they compete for the same cores; \"cores busy\" is its CPU time over the wall time of the run (near nproc: bound by CPU).",
		"Stored times are JetStream's metadata timestamps (when a stream stored the message); the barrier starts at the second arrival's publish acknowledgement, on the client's clock (the same process).",
		"Stored messages per act are last-sequence deltas of every stream (KV_* and OBJ_* included): planact purges run state when a rollout ends.",
		"NATS messages per act are varz in_msgs + out_msgs deltas, the client's and the bench's own included.",
		"Every rollout asks for planner max_new_tokens 4096: the simulated planner's tokens are bytes, and a plan of 28 lookups (about 1.5 kB) would be cut short by the default 1024.",
		"Engine latency_ms (act.done, plan.out) is whole milliseconds: an engine faster than 1 ms counts in full as added latency, and the critical path is rounded down by up to 1 ms per engine call.",
	}
	if r.Options.Cluster {
		n = append(n, "On the cluster varz is summed over the three nodes: a message that crosses a route counts on both sides, and JetStream's replication traffic counts too.")
	}
	for _, l := range r.Light {
		n = append(n, fmt.Sprintf("Light load, width %d: the zero-latency actor engine's own HTTP generate took %.3f ms on average (planact_engine_request_seconds; tokenize not included), the planner's %.3f ms.",
			l.Width, l.ActorEngineMeanMs, l.PlannerEngineMeanMs))
	}
	return n
}

func (r *Report) print(w io.Writer) error {
	m := r.Machine
	fmt.Fprintf(w, "machine: nproc %d, %s %s, %s; date %s; loadavg before %q, after %q\n", m.CPUs, m.Go, m.OS, m.CPUModel, m.Date, m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(w, "setup: %s\n", r.Setup)
	fmt.Fprintf(w, "engines: %s\n", r.Engines)
	cluster := ""
	if r.Options.Cluster {
		cluster = " -cluster"
	}
	quick := ""
	if r.Options.Quick {
		quick = " -quick"
	}
	fmt.Fprintf(w, "planact coordination overhead (go run ./bench/overhead%s%s): %.0f s\n\n", cluster, quick, r.Seconds)

	b := r.Baselines
	rr := b.Requests.P50Ms
	goal := func(figure string) (target, status string) {
		for _, g := range r.Goals {
			if g.Figure == figure {
				return g.Target, g.status()
			}
		}
		return "", ""
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(n, figure, value, base, ratio, goalFigure string) {
		target, status := goal(goalFigure)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", n, figure, value, base, ratio, target, status)
	}
	fmt.Fprintln(tw, "#\tfigure\tvalue\tbaseline\tratio\tgoal\t\t")
	row("1", fmt.Sprintf("raw publish+consume at once (%d B, ≤%d in flight, %d msgs, median of %d)", b.PubSub.MessageBytes, b.PubSub.InFlight, b.PubSub.Messages, len(b.PubSub.Values)),
		fmt.Sprintf("%.0f msgs/s", b.PubSub.Median), "", "", "")
	row("2", fmt.Sprintf("raw KV compare-and-set, one key (%d B, %d in a row)", b.CAS.ValueBytes, b.CAS.Ops),
		fmt.Sprintf("%.0f ops/s, p50 %.3f / p99 %.3f ms", b.CAS.OpsPerS, b.CAS.P50Ms, b.CAS.P99Ms), "", "", "")
	row("3", fmt.Sprintf("raw request/reply round trip (%d)", b.Requests.Requests), fmt.Sprintf("p50 %.3f / p99 %.3f ms", b.Requests.P50Ms, b.Requests.P99Ms), "", "", "")
	for _, t := range r.Throughput {
		row("4", fmt.Sprintf("acts/s, width %d (%d acts: %d rollouts × %d episodes, %d rollouts in flight)", t.Width, t.Acts, t.Rollouts, t.EpisodesPerRollout, t.RolloutsInFlight),
			fmt.Sprintf("%.0f acts/s", t.ActsPerS), fmt.Sprintf("1: %.0f msgs/s", b.PubSub.Median), fmt.Sprintf("%.4f", t.RatioToRaw), figRaw(t.Width))
	}
	for _, l := range r.Light {
		base := fmt.Sprintf("3: p50 %.3f ms", rr)
		row("5", fmt.Sprintf("added latency per act, width %d, 1 episode in flight (%d acts)", l.Width, l.PerAct.N),
			fmt.Sprintf("p50 %.3f / p99 %.3f ms", l.PerAct.P50, l.PerAct.P99), base, fmt.Sprintf("%.1f×", l.PerAct.Ratio), figAct(l.Width))
		row("5", fmt.Sprintf("  the same, less the engine's sub-ms time (mean %.3f ms) that latency_ms drops", l.ActorEngineMeanMs),
			fmt.Sprintf("p50 %.3f ms", l.PerActLessEngineP50), base, fmt.Sprintf("%.1f×", l.PerActLessEngineP50/rr), "")
		row("5", fmt.Sprintf("added latency per turn, width %d, 1 episode in flight (%d turns)", l.Width, l.PerTurn.N),
			fmt.Sprintf("p50 %.3f / p99 %.3f ms", l.PerTurn.P50, l.PerTurn.P99), base, fmt.Sprintf("%.1f×", l.PerTurn.Ratio), "")
		row("5", fmt.Sprintf("  of which turns that ran acts: plan.out → next plan.req (%d)", l.PerActingTurn.N),
			fmt.Sprintf("p50 %.3f / p99 %.3f ms", l.PerActingTurn.P50, l.PerActingTurn.P99), base, fmt.Sprintf("%.1f×", l.PerActingTurn.Ratio), "")
		row("5", fmt.Sprintf("  and answering turns: plan.out → rollout.N.end.E (%d)", l.PerFinalTurn.N),
			fmt.Sprintf("p50 %.3f / p99 %.3f ms", l.PerFinalTurn.P50, l.PerFinalTurn.P99), base, fmt.Sprintf("%.1f×", l.PerFinalTurn.Ratio), "")
	}
	row("6", fmt.Sprintf("barrier: 2nd arrival acked → rollout.N.start stored (%d rollouts)", r.Barrier.N),
		fmt.Sprintf("p50 %.3f / p99 %.3f ms", r.Barrier.P50, r.Barrier.P99), fmt.Sprintf("3: p50 %.3f ms", rr), fmt.Sprintf("%.1f×", r.Barrier.Ratio), figBarr)
	for _, e := range r.Eager {
		g := ""
		if e.InFlight == 64 {
			g = figEager
		}
		row("7", fmt.Sprintf("eager makespan ÷ critical path, %d in flight (%d episodes; means %.1f ÷ %.1f ms)", e.InFlight, e.Episodes, e.MeanMakespanMs, e.MeanCriticalMs),
			fmt.Sprintf("mean %.3f, p95 %.3f", e.MeanRatio, e.P95Ratio), "critical path", fmt.Sprintf("%.3f", e.MeanRatio), g)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\n8: per act, over the throughput runs of 4 (deltas ÷ acts; KV time: kv ops × baseline 2's p50)\n")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "width\tstored msgs\tof which KV_*\tNATS msgs\tkv ops\tKV time ms\tCAS conflicts\tCPU ms\tcores busy\tgoal\t\t")
	for _, t := range r.Throughput {
		kvStored := 0.0
		for name, v := range t.PerAct.StoredByStream {
			if strings.HasPrefix(name, "KV_") {
				kvStored += v
			}
		}
		target, status := "", ""
		if t.Width == 14 {
			target, status = goal(figCAS14)
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.1f\t%.2f\t%.3f\t%.4f\t%.3f\t%.2f of %d\t%s\t%s\t\n", t.Width, t.PerAct.StoredMsgs, kvStored, t.PerAct.NATSMsgs,
			t.PerAct.KVOps, t.PerAct.KVOps*b.CAS.P50Ms, t.PerAct.CASConflicts, t.PerAct.CPUMs, t.CoresBusy, r.Machine.CPUs, target, status)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Throughput {
		fmt.Fprintf(w, "  width %d: stored msgs %s\n", t.Width, perMap(t.PerAct.StoredByStream, 2))
		fmt.Fprintf(w, "  width %d: kv ops %s; conflicts %s\n", t.Width, perMap(t.PerAct.KVOpsBy, 2), perMap(t.PerAct.ConflictsBy, 4))
	}

	fmt.Fprintf(w, "\ngoals (issue \"Coordination cost: a tenth of raw JetStream, flat under load\")\n")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	met := 0
	for _, g := range r.Goals {
		fmt.Fprintf(tw, "  %s\t%s\t%.4g\t%s\t\n", g.Goal, g.Figure, g.Value, g.status())
		if g.Met {
			met++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "  %d of %d met\n\nnotes\n", met, len(r.Goals))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	return nil
}

func perMap(m map[string]float64, prec int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.*f", k, prec, m[k]))
	}
	return strings.Join(parts, ", ")
}

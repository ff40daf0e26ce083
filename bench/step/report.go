package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// write prints the report and, with -out, writes <name>.txt, .json, .png.
// A run whose checks failed is not a result: its files are named
// <name>-failed (a result quoted from <name> is not overwritten), and
// write returns an error naming the failures once it has written them.
func (r *Report) write(o options, stdout io.Writer) error {
	var b bytes.Buffer
	r.text(&b, o)
	if _, err := stdout.Write(b.Bytes()); err != nil {
		return err
	}
	var failed error
	name := o.Name
	if len(r.Failures) > 0 {
		failed = fmt.Errorf("%d checks failed, the run is not a result: %s", len(r.Failures), strings.Join(r.Failures, "; "))
		name += "-failed"
	}
	if o.Out == "" {
		return failed
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	base := filepath.Join(o.Out, name)
	if err := os.WriteFile(base+".txt", b.Bytes(), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := r.plot(base + ".png"); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s.txt, %s.json, %s.png\n", base, base, base)
	return failed
}

func engineLine(role string, em EngineModel) string {
	return fmt.Sprintf("%s serves %d at once; TTFT %s s, per token %s s, output tokens %s (≤ %d); %.0f%% stragglers ×%g–%g; mean service %v",
		role, em.Limit, em.TTFT, em.PerToken, em.Tokens, em.MaxTokens, 100*em.Stragglers, em.Slowdown[0], em.Slowdown[1],
		em.MeanService().Round(time.Millisecond))
}

func (r *Report) text(w io.Writer, o options) {
	m := o.Model
	mc := r.Machine
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "NOT A RESULT: %d checks failed (see checks at the end); the figures below describe a run unlike its script\n", len(r.Failures))
	}
	fmt.Fprintf(w, "machine: %d CPUs, %s; %s; loadavg before %q, after %q\n", mc.CPUs, mc.Go, mc.Date, mc.LoadBefore, mc.LoadAfter)
	fmt.Fprintf(w, "run: %d rollouts × %d prompts × %d copies = %d episodes; target_groups %s; async (rollout N+1 arrives before N is consumed); stream_groups, result_samples %s; between rollouts each trainer pauses its role (%s), swaps weights (%v) and resumes\n",
		o.Rollouts, o.Prompts, m.Copies, r.Run.Episodes, targetLine(o), cmp.Or(o.ResultSamples, schema.ResultSamplesAll), map[bool]string{true: "abort", false: "wait"}[o.PauseAbort], o.Swap)
	flags := "defaults"
	if len(o.ServeFlags) > 0 {
		flags = strings.Join(o.ServeFlags, " ")
	}
	if len(o.ServeEnv) > 0 {
		flags += "; environment " + strings.Join(o.ServeEnv, " ")
	}
	if len(o.NATSEnv) > 0 {
		flags += "; nats-server's environment " + strings.Join(o.NATSEnv, " ")
	}
	capacity := "stated in the arrivals (engine.max_in_flight)"
	if !o.StateCapacity {
		capacity = "not stated (each gateway keeps --engine-limit)"
	}
	planact := fmt.Sprintf("nats-server (compose's nats-1.conf, one node); %s (planact serve flags: %s)", replicaLine(o.Replicas), flags)
	if o.OneProcess {
		planact = fmt.Sprintf("planact up: its embedded server (sync 1s) and the five services in one process, connected in process (flags: %s)", flags)
	}
	fmt.Fprintf(w, "processes: %s; engines; trainer-planner, trainer-actor; engine limits %s\n", planact, capacity)
	fmt.Fprintf(w, "engines: %s\n         %s\n", engineLine("planner", m.Planner), engineLine("actor", m.Actor))
	fmt.Fprintf(w, "workload: planner turns %s (mean %.2f, the last answers); acts per plan %s (mean %.2f); an act depends on an earlier one with p %.2f; prompts %s tokens; seed %d\n",
		m.Turns, m.Turns.Mean(), m.Width, m.Width.Mean(), m.DepRate, m.PromptTokens, m.Seed)
	fmt.Fprintf(w, "harness wall time %.0f s (build, start, baseline, step, analysis)\n\n", r.WallS)

	b := r.Bound
	fmt.Fprintln(w, "step")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  makespan: first barrier → last result in a trainer's hands\t%.1f s\t\n", r.Run.MakespanS)
	fmt.Fprintf(tw, "  engine-bound lower bound (binding: %s)\t%.1f s\tmakespan ÷ bound %.2f×\n", b.Binding, b.S, r.Run.RatioToBound)
	fmt.Fprintf(tw, "    critical path: the target-th shortest group's longest episode\t%.1f s\t\n", b.CriticalPathS)
	for _, e := range []struct {
		name string
		eb   EngineBound
	}{{"planner", b.Planner}, {"actor", b.Actor}} {
		fmt.Fprintf(tw, "    %s engine: %.0f s of work ÷ %d + max(head+tail %.2f s, swaps %.1f s)\t%.1f s\t\n",
			e.name, e.eb.WorkS, e.eb.Limit, e.eb.HeadTailS, e.eb.PausedS, e.eb.BoundS)
	}
	fmt.Fprintf(tw, "  replay without planact: eager, zero cost, engines in arrival order\t%.1f s\treplay ÷ bound %.2f×, makespan ÷ replay %.2f×\n", r.Replay.S, r.Run.ReplayToBound, r.Run.RatioToReplay)
	fmt.Fprintf(tw, "  the same, engines serving the longest path left first\t%.1f s\treplay ÷ bound %.2f×\n", r.ReplayPriority.S, r.Run.PriorityToBound)
	if len(r.ReplayOldest.RolloutS) > 1 {
		fmt.Fprintf(tw, "  the same, engines serving the earlier rollout first\t%.1f s\treplay ÷ bound %.2f×; rollouts end at %s s (in arrival order: %s s)\n",
			r.ReplayOldest.S, r.ReplayOldest.S/r.Bound.S, seconds1(r.ReplayOldest.RolloutS), seconds1(r.Replay.RolloutS))
	}
	fmt.Fprintf(tw, "  first barrier → first generation request\t%.3f s\t\n", r.Run.FirstCallS)
	fmt.Fprintf(tw, "  last generation's end → last result\t%.2f s\t\n", r.Run.AfterEngineS)
	fmt.Fprintf(tw, "  episodes in flight at the engines, peak\t%d\t\n", r.Run.EpisodesPeak)
	tw.Flush()

	fmt.Fprintln(w, "\nrollouts (times from the first barrier; settle: last group stored → both results stored; the trainers read rollout N+1 after N's swap)")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  rollout\tbarrier s\tstart stored s\tlast group stored s\tresults stored s\tsettle s\tin the trainers' hands s\tmakespan s\town bound s\tstatus\tgroups streamed\tacts\tturns/episode\tsamples planner/actor\ttask states\t")
	for _, f := range r.Rollouts {
		fmt.Fprintf(tw, "  %d\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%d\t%d\t%.2f\t%d/%d\t%s\t\n", f.Rollout, f.ArriveS, f.StartS, f.LastGroupS, f.StoredS, f.SettleS,
			f.ResultS, f.MakespanS, f.BoundS, f.Status, f.Groups, f.Acts, f.MeanTurns, f.Samples[0], f.Samples[1], states(f.TaskStates))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nengines (utilisation: slot-seconds busy ÷ limit × makespan; late: slot held beyond the drawn time, the engine process's own delay)")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  engine\tlimit\tcalls\toutcomes\tgenerations\tmean utilisation\tpeak in flight\tpeak waiting\tpeak sent\tmean service ms\tlate p50/p99 ms\ttokenize calls\t")
	for _, e := range []struct {
		name string
		f    EngFigs
	}{{"planner", r.Planner}, {"actor", r.Actor}} {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%d\t%.1f%%\t%d\t%d\t%d\t%.0f\t%.1f/%.1f\t%d\t\n", e.name, e.f.Limit, e.f.Calls, states(e.f.Outcomes),
			e.f.Generations, 100*e.f.MeanUtil, e.f.PeakInFlight, e.f.PeakWaiting, e.f.PeakSent, e.f.MeanMs, e.f.LateP50Ms, e.f.LateP99Ms, e.f.Tokenizes)
	}
	tw.Flush()

	d := r.Dups
	fmt.Fprintln(w, "\nduplicate engine calls (calls beyond one per generation)")
	fmt.Fprintf(w, "  planner: %d turns, %d extra calls (%.4f per turn); actor: %d acts, %d extra calls (%.4f per act)\n",
		d.PlannerTurns, d.PlannerExtra, d.PerTurn, d.Acts, d.ActorExtra, d.PerAct)
	fmt.Fprintf(w, "  sent after the earlier call was aborted, abandoned (a pause's abort, a stopped episode) or refused busy: %d; while an earlier call still ran: %d; after one had ended ok: %d\n",
		d.AfterAbort, d.WhileRunning, d.AfterComplete)
	fmt.Fprintf(w, "  a generation is identified by its %s\n", d.Identity)
	for _, e := range d.Examples {
		fmt.Fprintf(w, "  e.g. %s\n", e)
	}

	fmt.Fprintf(w, "\nCPU during the step (/proc/PID/stat utime+stime), per act (%d acts) and per engine call (%d calls); peak RSS (VmHWM)\n", r.Run.Acts, r.Run.EngineCalls)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  process\tgroup\tCPU s\tcores mean/peak\tms per act\tms per engine call\tpeak RSS MB\tRSS at start MB\tgrowth KB per episode in flight\t")
	for _, p := range r.Processes {
		fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%.2f/%.2f\t%.3f\t%.3f\t%.0f\t%.0f\t\t\n", p.Name, p.Group, p.CPUS, p.MeanCores, p.PeakCores, p.PerActMs, p.PerCallMs, p.PeakRSSMB, p.StartRSSMB)
	}
	for _, g := range []string{groupPlanact, groupNATS, "planact+nats", groupEngines, groupTrainer} {
		gf := r.Groups[g]
		if gf.Processes == 0 {
			continue // -one-process: no nats-server of its own
		}
		fmt.Fprintf(tw, "  %s (%d processes)\t\t%.2f\t\t%.3f\t%.3f\t%.0f\t%.0f\t%.1f\t\n", g, gf.Processes, gf.CPUS, gf.PerActMs, gf.PerCallMs, gf.PeakRSSMB, gf.StartRSSMB, gf.KBPerEpisode)
	}
	tw.Flush()
	fmt.Fprintf(w, "  all processes: %.1f CPU-s over the %.0f s step (%.2f of %d cores)\n", r.Run.StepCPUSeconds, r.Run.MakespanS, r.Run.StepCPUSeconds/r.Run.MakespanS, mc.CPUs)

	if r.Groups["planact+nats"].Wakes != nil { // none where the kernel has no /proc/PID/io
		fmt.Fprintln(w, "\nwake-ups per act: context switches of all a process's threads (/proc/PID/task/*/status), read and write system calls (/proc/PID/io), and CPU per switch")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  process\tswitches\treads\twrites\tµs of CPU per switch\t")
		for _, p := range r.Processes {
			if p.Wakes != nil {
				fmt.Fprintf(tw, "  %s\t%.1f\t%.1f\t%.1f\t%.0f\t\n", p.Name, p.Wakes.Switches, p.Wakes.Reads, p.Wakes.Writes, p.Wakes.CPUPerSwitchUs)
			}
		}
		for _, g := range []string{groupPlanact, groupNATS, "planact+nats"} {
			if gw := r.Groups[g].Wakes; gw != nil {
				fmt.Fprintf(tw, "  %s\t%.1f\t%.1f\t%.1f\t%.0f\t\n", g, gw.Switches, gw.Reads, gw.Writes, gw.CPUPerSwitchUs)
			}
		}
		tw.Flush()
	}

	ms := r.Messages
	var streams []string
	for name := range ms.StoredByStream {
		streams = append(streams, name)
	}
	slices.Sort(streams)
	var parts []string
	for _, s := range streams {
		parts = append(parts, fmt.Sprintf("%s %.2f", s, ms.StoredByStream[s]))
	}
	fmt.Fprintf(w, "\nmessages per act: stored %.2f (%s); NATS %.1f (in %.1f, out %.1f; %.1f KB); %.1f NATS messages per engine call\n",
		ms.StoredPerAct, strings.Join(parts, ", "), ms.NATSPerAct, ms.NATSInPerAct, ms.NATSOutPerAct, ms.NATSKBPerAct, ms.PerEngineCall)
	if len(ms.Tally) > 0 {
		var total int64
		for _, t := range ms.Tally {
			total += t.Count
		}
		fmt.Fprintf(w, "  by kind (-tally: %d messages seen by a subscriber to every subject; messages and KB per act)\n", total)
		for _, t := range ms.Tally {
			if t.PerAct >= 0.01 {
				fmt.Fprintf(w, "    %6.2f  %7.2f KB  %s\n", t.PerAct, t.KBPerAct, t.Kind)
			}
		}
	}

	rw := r.Raw
	before := "before planact started"
	if o.OneProcess {
		before = "while planact's services waited idle in its process"
	}
	fmt.Fprintf(w, "\nraw JetStream on the same server, %s: publish+consume of %d-byte act.done messages (%d prompt + %d output tokens), %d in flight, 3 × %d\n",
		before, rw.MessageBytes, rw.PromptTokens, rw.OutputTokens, rw.InFlight, rw.Messages/3)
	fmt.Fprintf(w, "  %.0f msgs/s (median; %s); CPU per message %.4f ms (server %.4f + client %.4f); %.2f NATS messages per message\n",
		rw.MsgsPerS, floats(rw.Repeats, "%.0f"), rw.CPUPerMsgMs, rw.ServerCPUPerMsgMs, rw.ClientCPUPerMsgMs, rw.NATSMsgsPerMsg)
	fmt.Fprintf(w, "  planact+nats CPU per act ÷ raw CPU per message: %.1f×; NATS messages per act ÷ raw's per message: %.1f×; stored messages per act: %.2f (raw: 1)\n",
		r.Ratios.CPUPerAct, r.Ratios.NATSPerAct, r.Ratios.StoredPerAct)

	fmt.Fprintln(w, "\ngoals")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, g := range r.Goals {
		met := "NOT MET"
		if g.Met {
			met = "met"
		}
		note := ""
		if g.Note != "" {
			note = "; " + g.Note
		}
		fmt.Fprintf(tw, "  %s\t%s\t%.4g\t%s\t(%s%s)\n", g.Goal, g.Figure, g.Value, met, g.FromItem, note)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nchecks")
	for _, c := range r.Checks {
		fmt.Fprintf(w, "  %s\n", c)
	}
}

func states(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func floats(v []float64, f string) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf(f, x))
	}
	return strings.Join(parts, ", ")
}

// seconds1 lists times in seconds with one decimal.
func seconds1(ts []float64) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = fmt.Sprintf("%.1f", t)
	}
	return strings.Join(out, ", ")
}

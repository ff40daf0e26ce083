package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// Report is everything one run measured; step.json is this.
type Report struct {
	Machine  Machine  `json:"machine"`
	Options  options  `json:"options"`
	WallS    float64  `json:"wall_s"` // the whole harness: build, start, baseline, step, analysis
	Run      RunFigs  `json:"run"`
	Rollouts []RollFg `json:"rollouts"`
	Bound    Bound    `json:"bound"`
	Replay   Replay   `json:"replay"` // engines in arrival order
	// ReplayPriority is the replay with engines serving the longest path
	// left first: what a scheduler that orders the work could reach.
	ReplayPriority Replay `json:"replay_priority"`
	// ReplayOldest is the replay with engines serving the earlier
	// rollout's generations first: when each rollout would end.
	ReplayOldest Replay  `json:"replay_oldest_first"`
	Planner      EngFigs `json:"planner_engine"`
	Actor        EngFigs `json:"actor_engine"`
	Dups         Dups    `json:"duplicates"`
	// Processes are every process of the run with its CPU (during the step)
	// and memory; Groups sums them by group (planact, nats, engines,
	// trainer), and "planact+nats" is what planact costs in all.
	Processes []ProcFigs           `json:"processes"`
	Groups    map[string]GroupFigs `json:"groups"`
	Messages  Messages             `json:"messages"`
	Raw       Raw                  `json:"raw_jetstream"`
	Ratios    Ratios               `json:"ratios_to_raw"`
	Goals     []Goal               `json:"goals"`
	// Checks are what the run's analysis checked: statements, and the
	// failures, which are also in Failures (a run with any is not one to
	// quote).
	Checks   []string `json:"checks"`
	Failures []string `json:"failures,omitempty"`
	Series   Series   `json:"series"`
}

// fail records a check that failed.
func (r *Report) fail(format string, a ...any) {
	c := "FAILED: " + fmt.Sprintf(format, a...)
	r.Checks = append(r.Checks, c)
	r.Failures = append(r.Failures, c)
}

// RunFigs are the run's headline figures.
type RunFigs struct {
	MakespanS       float64 `json:"makespan_s"` // first barrier → last result in a trainer's hands
	BoundS          float64 `json:"bound_s"`
	RatioToBound    float64 `json:"makespan_over_bound"`
	ReplayS         float64 `json:"replay_s"`
	ReplayToBound   float64 `json:"replay_over_bound"`
	RatioToReplay   float64 `json:"makespan_over_replay"`
	PriorityS       float64 `json:"replay_priority_s"`
	PriorityToBound float64 `json:"replay_priority_over_bound"`
	Episodes        int     `json:"episodes"`
	EpisodesPeak    int     `json:"episodes_in_flight_peak"` // as the engines saw them
	PlannerTurns    int     `json:"planner_turns"`           // distinct turns generated to the end
	Acts            int     `json:"acts"`                    // distinct acts generated to the end
	ActsPlanact     int     `json:"acts_planact"`            // the results' stats.acts, summed
	EngineCalls     int     `json:"engine_calls"`            // /generate requests of both engines
	FirstCallS      float64 `json:"first_call_s"`            // first barrier → the first generation request
	EngineEndS      float64 `json:"engine_end_s"`            // first barrier → the last generation's end
	AfterEngineS    float64 `json:"after_engines_s"`         // the last generation's end → the last result
	StepCPUSeconds  float64 `json:"step_cpu_s"`              // all processes, during the step
}

// RollFg is one rollout's figures.
type RollFg struct {
	Rollout int64   `json:"rollout"`
	ArriveS float64 `json:"arrive_s"` // its barrier, from the first barrier
	// StartS, LastGroupS and StoredS are when planact stored the rollout's
	// start, its last group (the target reached) and the later of its two
	// results; SettleS is StoredS - LastGroupS: how long the results took
	// once the rollout was decided.
	StartS     float64        `json:"start_stored_s"`
	LastGroupS float64        `json:"last_group_stored_s"`
	StoredS    float64        `json:"results_stored_s"`
	SettleS    float64        `json:"settle_s"`
	ResultS    float64        `json:"result_s"` // both results in the trainers' hands
	MakespanS  float64        `json:"makespan_s"`
	BoundS     float64        `json:"bound_s"` // its own bound, as if alone on the engines
	Status     string         `json:"status"`
	Groups     int            `json:"groups_streamed"`
	FirstGroup float64        `json:"first_group_s"`
	TaskStates map[string]int `json:"task_states"`
	Acts       int            `json:"acts"`
	MeanTurns  float64        `json:"mean_turns"`
	Samples    [2]int         `json:"samples"` // planner, actor
}

// EngFigs are one engine's figures.
type EngFigs struct {
	Limit        int            `json:"limit"`
	Calls        int            `json:"calls"`
	Outcomes     map[string]int `json:"outcomes"`
	Generations  int            `json:"generations"` // distinct identities
	Tokenizes    int64          `json:"tokenizes"`
	MeanUtil     float64        `json:"mean_utilisation"` // slot-seconds busy ÷ (limit × makespan)
	PeakInFlight int            `json:"peak_in_flight"`   // admitted at once
	PeakWaiting  int            `json:"peak_waiting"`     // queued for a slot at once
	PeakSent     int            `json:"peak_sent"`        // in the engine (admitted or queued) at once
	DrawnS       float64        `json:"drawn_s"`          // service time of the calls that ended ok
	MeanMs       float64        `json:"mean_service_ms"`
	LateP50Ms    float64        `json:"late_p50_ms"` // held a slot longer than drawn: the engine process's timers
	LateP99Ms    float64        `json:"late_p99_ms"`
}

// Dups are engine calls beyond one per generation.
type Dups struct {
	PlannerTurns  int     `json:"planner_turns"`
	PlannerExtra  int     `json:"planner_extra_calls"`
	PerTurn       float64 `json:"per_turn"`
	Acts          int     `json:"acts"`
	ActorExtra    int     `json:"actor_extra_calls"`
	PerAct        float64 `json:"per_act"`
	AfterAbort    int     `json:"after_abort"`     // the call before was aborted, its client left (a pause's abort, a stopped episode) or it was refused busy (429)
	WhileRunning  int     `json:"while_running"`   // sent while an earlier call of the same generation was still in the engine
	AfterComplete int     `json:"after_completed"` // sent after an earlier call had ended ok
	// Unexplained is WhileRunning + AfterComplete: no abort says why.
	Unexplained int      `json:"unexplained"`
	Examples    []string `json:"examples,omitempty"`
	// How the generation was identified.
	Identity string `json:"identity"`
}

// ProcFigs is one process.
type ProcFigs struct {
	Name      string  `json:"name"`
	Group     string  `json:"group"`
	CPUS      float64 `json:"cpu_s"` // during the step
	PerActMs  float64 `json:"cpu_ms_per_act"`
	PerCallMs float64 `json:"cpu_ms_per_engine_call"`
	PeakRSSMB float64 `json:"peak_rss_mb"` // VmHWM: since the process started
	// StartRSSMB is the resident set when the step began (0 for the
	// trainers, which start with it).
	StartRSSMB float64 `json:"start_rss_mb"`
	// MeanCores is CPUS over the makespan; PeakCores the most it used in
	// one sampling interval (0.5 s): a process near 1 is saturated.
	MeanCores float64 `json:"mean_cores"`
	PeakCores float64 `json:"peak_cores"`
	// Wakes are its context switches and read and write system calls
	// during the step, per act (absent for a process not running at both
	// ends of the step: the trainers).
	Wakes *WakeFigs `json:"wakes_per_act,omitempty"`
}

// WakeFigs are a process's (or a group's) wake-ups per act: context
// switches of all its threads, read and write system calls, and its CPU
// per context switch.
type WakeFigs struct {
	Switches       float64 `json:"switches"`
	Reads          float64 `json:"reads"`
	Writes         float64 `json:"writes"`
	CPUPerSwitchUs float64 `json:"cpu_us_per_switch"`
}

// GroupFigs sums a group of processes.
type GroupFigs struct {
	Processes  int     `json:"processes"`
	CPUS       float64 `json:"cpu_s"`
	PerActMs   float64 `json:"cpu_ms_per_act"`
	PerCallMs  float64 `json:"cpu_ms_per_engine_call"`
	PeakRSSMB  float64 `json:"peak_rss_mb"` // sum of the processes' peaks
	StartRSSMB float64 `json:"start_rss_mb"`
	// GrowthMB is what the step added: peak RSS less the RSS when it began.
	GrowthMB float64   `json:"growth_mb"`
	Wakes    *WakeFigs `json:"wakes_per_act,omitempty"` // of the processes that have them
	// KBPerEpisode is GrowthMB over the peak episodes in flight: the memory
	// an episode in flight costs.
	KBPerEpisode float64 `json:"growth_kb_per_episode_in_flight"`
	wakesCPUS    float64 // CPU of the processes Wakes counts
}

// Messages are stored and NATS messages per act.
type Messages struct {
	StoredPerAct   float64            `json:"stored_per_act"`
	StoredByStream map[string]float64 `json:"stored_per_act_by_stream"` // last-sequence deltas
	StoredMBByStr  map[string]float64 `json:"stored_mb_by_stream"`      // bytes held at the end
	NATSPerAct     float64            `json:"nats_msgs_per_act"`        // varz in + out
	NATSInPerAct   float64            `json:"nats_in_per_act"`
	NATSOutPerAct  float64            `json:"nats_out_per_act"`
	NATSKBPerAct   float64            `json:"nats_kb_per_act"` // varz in + out bytes
	PerEngineCall  float64            `json:"nats_msgs_per_engine_call"`
	// Tally is -tally's count of every NATS message by kind, most first.
	Tally []TallyRow `json:"tally,omitempty"`
}

// Raw is the raw JetStream baseline on the run's server.
type Raw struct {
	Messages          int       `json:"messages"`
	MessageBytes      int       `json:"message_bytes"`
	PromptTokens      int       `json:"prompt_tokens"`
	OutputTokens      int       `json:"output_tokens"`
	InFlight          int       `json:"in_flight"`
	Repeats           []float64 `json:"msgs_per_s_repeats"`
	MsgsPerS          float64   `json:"msgs_per_s"`
	CPUPerMsgMs       float64   `json:"cpu_ms_per_msg"`
	ServerCPUPerMsgMs float64   `json:"server_cpu_ms_per_msg"`
	ClientCPUPerMsgMs float64   `json:"client_cpu_ms_per_msg"`
	NATSMsgsPerMsg    float64   `json:"nats_msgs_per_msg"`
}

// Ratios divide planact's per-act figures by raw JetStream's per message.
type Ratios struct {
	CPUPerAct    float64 `json:"cpu_per_act"`    // planact+nats CPU per act ÷ raw CPU per message
	NATSPerAct   float64 `json:"nats_per_act"`   // NATS messages per act ÷ raw's per message
	StoredPerAct float64 `json:"stored_per_act"` // stored messages per act (raw stores one)
}

// Goal is one of the goals, checked against this run.
type Goal struct {
	Goal     string  `json:"goal"`
	Figure   string  `json:"figure"`
	Value    float64 `json:"value"`
	Met      bool    `json:"met"`
	FromItem string  `json:"from"`
	// Note says what the figure is to be read against, where the goal
	// alone does not.
	Note string `json:"note,omitempty"`
}

// Series are the plot's time series, from the first barrier.
type Series struct {
	BinS          float64              `json:"bin_s"`
	PlannerUtil   []float64            `json:"planner_utilisation"`
	ActorUtil     []float64            `json:"actor_utilisation"`
	PlannerWait   []float64            `json:"planner_waiting"`
	ActorWait     []float64            `json:"actor_waiting"`
	Episodes      []float64            `json:"episodes_in_flight"`
	SampleS       []float64            `json:"sample_s"`
	CoresByGroup  map[string][]float64 `json:"cores_by_group"`
	RolloutEndS   []float64            `json:"rollout_end_s"`
	PauseWindowsS [][2]float64         `json:"pause_windows_s"`
}

// genKey identifies a generation.
type genKey struct {
	role             string
	rollout          int64
	episode, turn, n int
}

func (k genKey) String() string {
	if k.role == rolePlanner {
		return fmt.Sprintf("planner r%d e%d t%d", k.rollout, k.episode, k.turn)
	}
	return fmt.Sprintf("actor r%d e%d t%d n%d", k.rollout, k.episode, k.turn, k.n+1)
}

func (r *Report) analyse(o options, calls [2]Calls, logs []TrainerLog, stored []Stored, before, after snapshot, samples []sample, c *cluster) error {
	m := &o.Model
	first := int64(1)
	// Time zero: the first rollout's barrier (both arrivals stored).
	var t0, end int64
	byRole := map[string]*TrainerLog{}
	for i := range logs {
		byRole[logs[i].Role] = &logs[i]
	}
	pl, al := byRole[rolePlanner], byRole[roleActor]
	if pl == nil || al == nil || len(pl.Rollouts) != o.Rollouts || len(al.Rollouts) != o.Rollouts {
		return fmt.Errorf("the trainers' logs do not hold %d rollouts each", o.Rollouts)
	}
	t0 = max(pl.Rollouts[0].ArrivedNs, al.Rollouts[0].ArrivedNs)
	rel := func(ns int64) float64 { return float64(ns-t0) / 1e9 }
	// Scripts, works and the bound.
	targets := make([]int, o.Rollouts)
	scripts := make([][]*Episode, o.Rollouts)
	var works []RolloutWork
	script := map[[2]int64]*Episode{}
	for i := range o.Rollouts {
		n := first + int64(i)
		targets[i] = o.TargetGroups
		if targets[i] == 0 {
			targets[i] = o.Prompts
		}
		rw := RolloutWork{Rollout: n, Groups: make([][]Work, o.Prompts), Target: targets[i]}
		for e := range o.Prompts * m.Copies {
			ep := m.Episode(n, e)
			scripts[i] = append(scripts[i], &ep)
			script[[2]int64{n, int64(e)}] = &ep
			g := m.Group(e)
			rw.Groups[g] = append(rw.Groups[g], ep.Work())
		}
		works = append(works, rw)
	}
	limits := [2]int{m.Planner.Limit, m.Actor.Limit}
	pauses := time.Duration(o.Rollouts-1) * o.Swap
	r.Bound = LowerBound(works, limits, [2]time.Duration{pauses, pauses})
	r.Replay = ReplayRun(m, scripts, targets, limits, o.Swap, o.PauseAbort, InArrival)
	r.ReplayPriority = ReplayRun(m, scripts, targets, limits, o.Swap, o.PauseAbort, LongestPathFirst)
	r.ReplayOldest = ReplayRun(m, scripts, targets, limits, o.Swap, o.PauseAbort, OldestRolloutFirst)

	// Rollouts.
	var acts int
	for i := range o.Rollouts {
		p, a := pl.Rollouts[i], al.Rollouts[i]
		arrive := max(p.ArrivedNs, a.ArrivedNs)
		res := max(p.ResultNs, a.ResultNs)
		end = max(end, res)
		f := RollFg{Rollout: p.Rollout, ArriveS: rel(arrive), ResultS: rel(res), MakespanS: float64(res-arrive) / 1e9,
			Status: p.Status, Groups: len(p.Groups), TaskStates: p.Stats.TaskStates, Acts: p.Stats.Acts, MeanTurns: p.Stats.MeanTurns,
			Samples: [2]int{p.Samples, a.Samples}}
		if p.Status != a.Status {
			f.Status = p.Status + "/" + a.Status
		}
		if len(p.Groups) > 0 {
			f.FirstGroup = rel(p.Groups[0].AtNs)
		}
		f.BoundS = LowerBound(works[i:i+1], limits, [2]time.Duration{}).S
		if i < len(stored) {
			st := stored[i]
			for _, m := range st.Missing {
				r.fail("not found in the streams: %s", m)
			}
			if st.StartNs > 0 {
				f.StartS = rel(st.StartNs)
			}
			if st.LastGroupNs > 0 {
				f.LastGroupS = rel(st.LastGroupNs)
			}
			if st.ResultNs[0] > 0 && st.ResultNs[1] > 0 {
				f.StoredS = rel(max(st.ResultNs[0], st.ResultNs[1]))
				if st.LastGroupNs > 0 {
					f.SettleS = f.StoredS - f.LastGroupS
				}
			}
		}
		if p.Status != schema.ResultOK {
			r.fail("rollout %d ended %s: %s", p.Rollout, p.Status, p.Reason)
		}
		// The bound counts every scripted generation of the groups that
		// end a rollout; a task that failed or was left unfinished ran
		// less than its script, and its group may have ended sooner.
		for j, l := range []RolloutLog{p, a} {
			for _, state := range []string{schema.TaskFailed, schema.TaskUnfinished} {
				if n := l.Stats.TaskStates[state]; n > 0 {
					r.fail("rollout %d (%s's result): %d tasks %s: they did not run their scripts, which the bound counts",
						l.Rollout, []string{rolePlanner, roleActor}[j], n, state)
				}
			}
		}
		acts += p.Stats.Acts
		r.Rollouts = append(r.Rollouts, f)
		r.Series.RolloutEndS = append(r.Series.RolloutEndS, f.ResultS)
	}
	for _, l := range logs {
		for _, ps := range l.Pauses {
			r.Series.PauseWindowsS = append(r.Series.PauseWindowsS, [2]float64{rel(ps.CalledNs), rel(ps.ResumedNs)})
		}
	}
	r.Run.MakespanS = float64(end-t0) / 1e9
	r.Run.BoundS, r.Run.ReplayS = r.Bound.S, r.Replay.S
	r.Run.RatioToBound = r.Run.MakespanS / r.Bound.S
	r.Run.ReplayToBound = r.Replay.S / r.Bound.S
	r.Run.RatioToReplay = r.Run.MakespanS / r.Replay.S
	r.Run.PriorityS = r.ReplayPriority.S
	r.Run.PriorityToBound = r.ReplayPriority.S / r.Bound.S
	r.Run.Episodes = o.Rollouts * o.Prompts * m.Copies
	r.Run.ActsPlanact = acts

	// Engines: outcomes, duplicates, utilisation.
	seen := map[genKey][]Call{}
	var lastDone, firstArr int64
	mismatch := 0
	for i, cs := range calls {
		if cs.Limit != limits[i] {
			r.fail("the %s engine served %d at once, the bound assumes %d", cs.Role, cs.Limit, limits[i])
		}
		ef := EngFigs{Limit: cs.Limit, Calls: len(cs.Calls), Outcomes: map[string]int{}, Tokenizes: cs.Tokenizes}
		var late []float64
		var drawn time.Duration
		ok := 0
		for _, call := range cs.Calls {
			ef.Outcomes[call.Outcome]++
			if call.Outcome == "refused" {
				r.fail("%s engine refused a call: %s", cs.Role, call.Error)
				continue
			}
			k := genKey{call.Role, call.Rollout, call.Episode, call.Turn, call.Node}
			seen[k] = append(seen[k], call)
			if firstArr == 0 || call.ArrivedNs < firstArr {
				firstArr = call.ArrivedNs
			}
			lastDone = max(lastDone, call.DoneNs)
			if call.Outcome == "cut" {
				// Shorter than drawn: the engine did less than the bound
				// counts.
				mismatch++
			}
			if call.Outcome == "ok" {
				ok++
				drawn += time.Duration(call.ServiceNs)
				late = append(late, float64(call.DoneNs-call.AdmittedNs-call.ServiceNs)/1e6)
				if ep := script[[2]int64{call.Rollout, int64(call.Episode)}]; ep != nil {
					var g Gen
					if call.Node < 0 {
						g = ep.Turns[call.Turn-1].Planner
					} else {
						g = ep.Turns[call.Turn-1].Acts[call.Node].Gen
					}
					if int64(g.Service()) != call.ServiceNs {
						mismatch++
					}
				} else {
					mismatch++
				}
			}
		}
		ef.DrawnS = drawn.Seconds()
		if ok > 0 {
			ef.MeanMs = ms(drawn) / float64(ok)
			ef.LateP50Ms, ef.LateP99Ms = percentile(late, 50), percentile(late, 99)
		}
		if i == 0 {
			r.Planner = ef
		} else {
			r.Actor = ef
		}
	}
	if mismatch > 0 {
		r.fail("%d calls' service times differ from the script's, or were cut at max_new_tokens: the bound does not describe this run", mismatch)
	} else {
		r.Checks = append(r.Checks, "every call that ended ok drew the service time the script (and so the bound) has; none was cut")
	}
	r.Run.FirstCallS, r.Run.EngineEndS = rel(firstArr), rel(lastDone)
	r.Run.AfterEngineS = float64(end-lastDone) / 1e9
	r.Run.EngineCalls = r.Planner.Calls + r.Actor.Calls
	r.Dups = duplicates(seen)
	r.Run.PlannerTurns, r.Run.Acts = generatedToTheEnd(seen)
	for k := range seen {
		if k.role == rolePlanner {
			r.Planner.Generations++
		} else {
			r.Actor.Generations++
		}
	}
	if r.Run.ActsPlanact != r.Run.Acts {
		r.Checks = append(r.Checks, fmt.Sprintf("planact's results count %d acts, the actor engine %d distinct acts generated to the end (episodes stopped by target_groups count on one side only)",
			r.Run.ActsPlanact, r.Run.Acts))
	}
	r.series(calls, t0, end)

	// Processes: CPU during the step, peak memory.
	actsN, callsN := float64(r.Run.Acts), float64(r.Run.EngineCalls)
	if actsN == 0 || callsN == 0 {
		return errNoActs
	}
	r.Groups = map[string]GroupFigs{}
	for _, p := range c.all() {
		b, okB := before.Procs[p.Name]
		a, okA := after.Procs[p.Name]
		seen := maxSample(samples, p.Name)
		cpu := a.CPU - b.CPU
		switch {
		case p.Group == groupTrainer:
		case !okB || !okA:
			// A process gone at either end (exited, or not yet started):
			// its CPU is not measured, and 0 - before would count less.
			r.fail("%s was not running at the step's %s: its CPU is not measured", p.Name, map[bool]string{true: "end", false: "start"}[okB])
		case cpu < 0:
			r.fail("%s's CPU went from %v to %v: another process (a restart) at the step's end", p.Name, b.CPU, a.CPU)
		}
		if p.Group == groupTrainer {
			// Started after the first snapshot, gone before the last: what
			// the samples saw (an exited trainer's last sample, as a
			// zombie, still has its CPU times but no memory).
			cpu = seen.CPU
		}
		peak := max(a.PeakRS, seen.PeakRS)
		f := ProcFigs{Name: p.Name, Group: p.Group, CPUS: cpu.Seconds(), PerActMs: ms(cpu) / actsN, PerCallMs: ms(cpu) / callsN,
			PeakRSSMB: mb(peak), StartRSSMB: mb(b.RSS), MeanCores: cpu.Seconds() / r.Run.MakespanS}
		wb, okB := before.Wakes[p.Name]
		wa, okA := after.Wakes[p.Name]
		if okB && okA {
			f.Wakes = &WakeFigs{Switches: float64(wa.Switches-wb.Switches) / actsN,
				Reads: float64(wa.Reads-wb.Reads) / actsN, Writes: float64(wa.Writes-wb.Writes) / actsN}
			if wa.Switches > wb.Switches {
				f.Wakes.CPUPerSwitchUs = 1e6 * f.CPUS / float64(wa.Switches-wb.Switches)
			}
		}
		r.Processes = append(r.Processes, f)
		r.Run.StepCPUSeconds += f.CPUS
		for _, g := range []string{p.Group, combinedGroup(p.Group)} {
			if g == "" {
				continue
			}
			gf := r.Groups[g]
			gf.Processes++
			gf.CPUS += f.CPUS
			gf.PeakRSSMB += f.PeakRSSMB
			gf.StartRSSMB += f.StartRSSMB
			gf.GrowthMB += max(0, f.PeakRSSMB-f.StartRSSMB)
			if f.Wakes != nil {
				if gf.Wakes == nil {
					gf.Wakes = &WakeFigs{}
				}
				gf.Wakes.Switches += f.Wakes.Switches
				gf.Wakes.Reads += f.Wakes.Reads
				gf.Wakes.Writes += f.Wakes.Writes
				gf.wakesCPUS += f.CPUS
			}
			r.Groups[g] = gf
		}
	}
	for g, gf := range r.Groups {
		gf.PerActMs, gf.PerCallMs = 1000*gf.CPUS/actsN, 1000*gf.CPUS/callsN
		if gf.Wakes != nil && gf.Wakes.Switches > 0 {
			gf.Wakes.CPUPerSwitchUs = 1e6 * gf.wakesCPUS / (gf.Wakes.Switches * actsN)
		}
		if r.Run.EpisodesPeak > 0 {
			gf.KBPerEpisode = 1024 * gf.GrowthMB / float64(r.Run.EpisodesPeak)
		}
		r.Groups[g] = gf
	}
	sort.Slice(r.Processes, func(i, j int) bool {
		gi, gj := groupOrder(r.Processes[i].Group), groupOrder(r.Processes[j].Group)
		return gi < gj || (gi == gj && r.Processes[i].Name < r.Processes[j].Name)
	})
	r.cores(samples, t0)

	// Messages.
	r.Messages = Messages{StoredByStream: map[string]float64{}, StoredMBByStr: map[string]float64{}}
	for name, st := range after.Streams {
		if strings.HasPrefix(name, "BENCH_") {
			continue
		}
		d := float64(st.LastSeq - min(before.Streams[name].LastSeq, st.LastSeq))
		if d > 0 {
			r.Messages.StoredByStream[name] = d / actsN
			r.Messages.StoredPerAct += d / actsN
		}
		r.Messages.StoredMBByStr[name] = mb(int64(st.Bytes))
	}
	in, out := float64(after.Varz.InMsgs-before.Varz.InMsgs), float64(after.Varz.OutMsgs-before.Varz.OutMsgs)
	r.Messages.NATSInPerAct, r.Messages.NATSOutPerAct = in/actsN, out/actsN
	r.Messages.NATSPerAct = (in + out) / actsN
	r.Messages.PerEngineCall = (in + out) / callsN
	r.Messages.NATSKBPerAct = float64(after.Varz.InBytes-before.Varz.InBytes+after.Varz.OutBytes-before.Varz.OutBytes) / 1024 / actsN

	// Ratios and goals.
	pn := r.Groups["planact+nats"]
	r.Ratios = Ratios{CPUPerAct: pn.PerActMs / r.Raw.CPUPerMsgMs, NATSPerAct: r.Messages.NATSPerAct / r.Raw.NATSMsgsPerMsg, StoredPerAct: r.Messages.StoredPerAct}
	r.Goals = []Goal{
		{Goal: "planact's CPU per engine call ≤ 0.1 ms (services + nats-server)", Figure: "planact+nats CPU ms per engine call",
			Value: pn.PerCallMs, Met: pn.PerCallMs <= 0.1, FromItem: "issue 18, 2"},
		keptFull(rolePlanner, r.Planner, r.Replay.PeakInFlight[0]),
		keptFull(roleActor, r.Actor, r.Replay.PeakInFlight[1]),
		{Goal: "makespan ≤ 1.05 × the engine-bound lower bound", Figure: "makespan ÷ bound",
			Value: r.Run.RatioToBound, Met: r.Run.RatioToBound <= 1.05, FromItem: "issue 18, 4"},
		{Goal: "no duplicate engine call that no abort explains", Figure: "unexplained extra calls",
			Value: float64(r.Dups.Unexplained), Met: r.Dups.Unexplained == 0, FromItem: "issue 16, 1"},
	}
	return nil
}

// keptFull is the goal that an engine ran its limit at once. The
// zero-cost replay's peak says how many the workload gives it at once:
// below the limit, no scheduler fills it, and the note says so.
func keptFull(role string, ef EngFigs, replayPeak int) Goal {
	g := Goal{Goal: "the " + role + " engine kept full: peak in flight = its limit", Figure: role + " engine peak in flight ÷ limit",
		Value: float64(ef.PeakInFlight) / float64(ef.Limit), Met: ef.PeakInFlight >= ef.Limit, FromItem: "issue 18, 3"}
	if replayPeak < ef.Limit {
		g.Note = fmt.Sprintf("the workload gives it at most %d at once, the zero-cost replay's peak; planact ran %d", replayPeak, ef.PeakInFlight)
	}
	return g
}

func combinedGroup(g string) string {
	if g == groupPlanact || g == groupNATS {
		return "planact+nats"
	}
	return ""
}

func groupOrder(g string) int {
	return slices.Index([]string{groupPlanact, groupNATS, groupEngines, groupTrainer}, g)
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// maxSample is the most CPU and the highest peak RSS the samples saw of a
// process.
func maxSample(samples []sample, name string) procStat {
	var m procStat
	for _, smp := range samples {
		if s, ok := smp.Stats[name]; ok {
			m.CPU, m.PeakRS, m.RSS = max(m.CPU, s.CPU), max(m.PeakRS, s.PeakRS), max(m.RSS, s.RSS)
		}
	}
	return m
}

// generatedToTheEnd counts the planner turns and acts with a call that
// ended ok (or cut): what the per-act figures divide by. A generation
// whose every call was aborted or left (its episode stopped) was not
// generated.
func generatedToTheEnd(seen map[genKey][]Call) (turns, acts int) {
	for k, cs := range seen {
		if !slices.ContainsFunc(cs, func(c Call) bool { return c.Outcome == "ok" || c.Outcome == "cut" }) {
			continue
		}
		if k.role == rolePlanner {
			turns++
		} else {
			acts++
		}
	}
	return turns, acts
}

// duplicates counts engine calls beyond one per generation, by what the
// call before it had come to when it was sent.
func duplicates(seen map[genKey][]Call) Dups {
	d := Dups{Identity: "routing key (X-SMG-Routing-Key <rollout>-<episode>) + the prompt: <observation> blocks for a planner turn, the act's \"t<turn> n<node>\" input for an act"}
	withHeader := 0
	type ex struct {
		k genKey
		n int
	}
	var examples []ex
	for k, cs := range seen {
		if k.role == rolePlanner {
			d.PlannerTurns++
		} else {
			d.Acts++
		}
		for _, c := range cs {
			if c.Generation != "" {
				withHeader++
			}
		}
		if len(cs) < 2 {
			continue
		}
		sort.Slice(cs, func(i, j int) bool { return cs[i].ArrivedNs < cs[j].ArrivedNs })
		for i := 1; i < len(cs); i++ {
			c := cs[i]
			// What the earlier calls had come to when this one was sent.
			cause := "after_abort"
			for _, prev := range cs[:i] {
				switch {
				case prev.DoneNs > c.ArrivedNs:
					cause = "while_running"
				case prev.Outcome == "ok" || prev.Outcome == "cut":
					if cause != "while_running" {
						cause = "after_completed"
					}
				}
			}
			switch cause {
			case "after_abort":
				d.AfterAbort++
			case "while_running":
				d.WhileRunning++
			default:
				d.AfterComplete++
			}
		}
		if k.role == rolePlanner {
			d.PlannerExtra += len(cs) - 1
		} else {
			d.ActorExtra += len(cs) - 1
		}
		examples = append(examples, ex{k, len(cs)})
	}
	if withHeader > 0 {
		d.Identity += fmt.Sprintf("; %d calls also named their generation in a %s header", withHeader, strings.Join(GenerationHeaders, "/"))
	}
	d.Unexplained = d.WhileRunning + d.AfterComplete
	if d.PlannerTurns > 0 {
		d.PerTurn = float64(d.PlannerExtra) / float64(d.PlannerTurns)
	}
	if d.Acts > 0 {
		d.PerAct = float64(d.ActorExtra) / float64(d.Acts)
	}
	sort.Slice(examples, func(i, j int) bool {
		return examples[i].n > examples[j].n || (examples[i].n == examples[j].n && examples[i].k.String() < examples[j].k.String())
	})
	for _, e := range examples[:min(5, len(examples))] {
		var outcomes []string
		for _, c := range seen[e.k] {
			outcomes = append(outcomes, c.Outcome)
		}
		d.Examples = append(d.Examples, fmt.Sprintf("%s: %d calls (%s)", e.k, e.n, strings.Join(outcomes, ", ")))
	}
	return d
}

// series bins the engines' calls: utilisation, waiting, episodes in flight.
func (r *Report) series(calls [2]Calls, t0, end int64) {
	span := float64(end-t0) / 1e9
	bin := max(0.25, span/400)
	n := int(math.Ceil(span/bin)) + 1
	r.Series.BinS = bin
	add := func(v []float64, from, to int64, w float64) {
		a, b := float64(from-t0)/1e9, float64(to-t0)/1e9
		if b <= a {
			return
		}
		for i := max(0, int(a/bin)); i < n && float64(i)*bin < b; i++ {
			lo, hi := max(a, float64(i)*bin), min(b, float64(i+1)*bin)
			if hi > lo {
				v[i] += w * (hi - lo) / bin
			}
		}
	}
	episodes := map[[2]int64][2]int64{}
	for i, cs := range calls {
		util, wait := make([]float64, n), make([]float64, n)
		busy := 0.0
		var evs []event
		for _, c := range cs.Calls {
			if c.Outcome == "refused" {
				continue
			}
			queued, left := max(c.QueuedNs, c.ArrivedNs), c.DoneNs
			if c.AdmittedNs > 0 {
				left = c.AdmittedNs
				add(util, c.AdmittedNs, c.DoneNs, 1/float64(cs.Limit))
				busy += float64(c.DoneNs-c.AdmittedNs) / 1e9
				evs = append(evs, event{c.AdmittedNs, 1, 0}, event{c.DoneNs, -1, 0})
			}
			add(wait, queued, left, 1)
			evs = append(evs, event{queued, 0, 1}, event{left, 0, -1})
			k := [2]int64{c.Rollout, int64(c.Episode)}
			iv, ok := episodes[k]
			if !ok {
				iv = [2]int64{c.ArrivedNs, c.DoneNs}
			}
			episodes[k] = [2]int64{min(iv[0], c.ArrivedNs), max(iv[1], c.DoneNs)}
		}
		peakRun, peakWait, peakSent := peaks(evs)
		ef := &r.Planner
		if i == 1 {
			ef = &r.Actor
			r.Series.ActorUtil, r.Series.ActorWait = util, wait
		} else {
			r.Series.PlannerUtil, r.Series.PlannerWait = util, wait
		}
		ef.PeakInFlight, ef.PeakWaiting, ef.PeakSent = peakRun, peakWait, peakSent
		if span > 0 {
			ef.MeanUtil = busy / (float64(cs.Limit) * span)
		}
	}
	eps := make([]float64, n)
	var evs []event
	for _, iv := range episodes {
		add(eps, iv[0], iv[1], 1)
		evs = append(evs, event{iv[0], 1, 0}, event{iv[1], -1, 0})
	}
	r.Series.Episodes = eps
	r.Run.EpisodesPeak, _, _ = peaks(evs)
}

// event changes the count of running (dr) and waiting (dw) at a time.
type event struct {
	at     int64
	dr, dw int
}

// peaks are the largest counts of running, waiting and both at once; at
// equal times ends count first.
func peaks(evs []event) (run, wait, both int) {
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].dr+evs[i].dw < evs[j].dr+evs[j].dw
	})
	cr, cw := 0, 0
	for _, e := range evs {
		cr += e.dr
		cw += e.dw
		run, wait, both = max(run, cr), max(wait, cw), max(both, cr+cw)
	}
	return run, wait, both
}

// cores turns the samples into CPU cores used per group over time.
func (r *Report) cores(samples []sample, t0 int64) {
	r.Series.CoresByGroup = map[string][]float64{}
	group, index := map[string]string{}, map[string]int{}
	for i, p := range r.Processes {
		group[p.Name], index[p.Name] = p.Group, i
	}
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1], samples[i]
		dt := b.At.Sub(a.At).Seconds()
		if dt <= 0 {
			continue
		}
		r.Series.SampleS = append(r.Series.SampleS, float64(b.At.UnixNano()-t0)/1e9)
		sum := map[string]float64{}
		for name, st := range b.Stats {
			prev, ok := a.Stats[name]
			if !ok {
				continue // started in between
			}
			c := (st.CPU - prev.CPU).Seconds() / dt
			sum[group[name]] += c
			if i, ok := index[name]; ok {
				r.Processes[i].PeakCores = max(r.Processes[i].PeakCores, c)
			}
		}
		for _, g := range []string{groupPlanact, groupNATS, groupEngines, groupTrainer} {
			r.Series.CoresByGroup[g] = append(r.Series.CoresByGroup[g], sum[g])
		}
	}
}

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

package chaos

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/schema"
)

// SoakOptions configure a soak run on one topology: no faults, many
// rollouts, resources sampled as it goes.
type SoakOptions struct {
	Topology string
	Root     string
	Bin      Binaries
	Dir      string

	Duration     time.Duration // of the load
	Interval     time.Duration // between samples
	Seed         int64
	Concurrency  int
	Tasks        int
	PerPrompt    int
	FirstRollout int64

	RolloutTimeout time.Duration
	BarrierTimeout time.Duration
	Grace          time.Duration
	ActTimeout     time.Duration
	// Retention is passed to the services when the binary takes the flags;
	// after the load the soak goes on sampling until no key or object is
	// left, or the retention and RetentionSlack have passed.
	Retention      Retention
	RetentionSlack time.Duration
	Auth           bool
	Processes      map[string]int
	LogLevel       string   // of the services
	ServeFlags     []string // more flags of `planact serve`
	Progress       io.Writer
}

// SoakSample is one reading.
type SoakSample struct {
	Seconds  float64          `json:"t"` // since the load began
	Phase    string           `json:"phase"`
	Rollouts int              `json:"rollouts"` // finished so far
	RSS      map[string]int64 `json:"rss"`      // per process, bytes
	State    BusState         `json:"state"`
	Err      string           `json:"err,omitempty"`
}

// Soak phases.
const (
	PhaseLoad      = "load"      // rollouts start
	PhaseDrain     = "drain"     // no more start; those in flight end (a hung one at its deadline)
	PhaseRetention = "retention" // waiting for the retention to empty the buckets
)

// MemoryTrend compares a process's mean RSS over the second third of the
// load (after warm-up) with its mean over the last third.
type MemoryTrend struct {
	Proc   string  `json:"proc"`
	WarmMB float64 `json:"second_third_mean_mb"`
	LastMB float64 `json:"last_third_mean_mb"`
	Ratio  float64 `json:"ratio"`
	MaxMB  float64 `json:"max_mb"`
}

// ConsumerTrend is the number of consumers of one stream over the soak.
type ConsumerTrend struct {
	Stream         string `json:"stream"`
	FirstHalfMax   int    `json:"first_half_max"`
	SecondHalfMax  int    `json:"second_half_max"`
	EndOfLoad      int    `json:"end_of_load"`
	AfterRetention int    `json:"after_retention"`
}

// SoakReport is the outcome of a soak on one topology.
type SoakReport struct {
	Topology       string          `json:"topology"`
	Started        time.Time       `json:"started"`
	Seconds        float64         `json:"seconds"`
	Machine        Machine         `json:"machine"`
	Settings       Settings        `json:"settings"`
	Tally          Tally           `json:"ledger"`
	RolloutsPerSec float64         `json:"rollouts_per_second"`
	Pickup         Pickup          `json:"result_pickup"`
	Memory         []MemoryTrend   `json:"memory"`
	Consumers      []ConsumerTrend `json:"consumers"`
	KeysEndOfLoad  map[string]int  `json:"keys_end_of_load"`
	ObjectsEnd     int             `json:"objects_end_of_load"`
	Leftovers      Leftovers       `json:"leftovers"`
	Exits          []Exit          `json:"unexpected_exits,omitempty"`
	Problems       []RolloutCheck  `json:"problems,omitempty"`
	EngineCalls    CallsSummary    `json:"engine_calls"` // taken as the load goes, so the engines keep little
	Samples        []SoakSample    `json:"-"`            // in the CSV
	Err            string          `json:"err,omitempty"`
}

// FlatRatio is the growth of mean RSS from the second to the last third of
// the load above which memory is reported as growing.
const FlatRatio = 1.10

// MemoryFlat reports whether every process's memory stayed within
// FlatRatio after warm-up.
func (r *SoakReport) MemoryFlat() bool {
	for _, m := range r.Memory {
		if m.Ratio > FlatRatio {
			return false
		}
	}
	return len(r.Memory) > 0
}

// ConsumersBounded reports whether no stream had more consumers in the
// second half of the load than in the first.
func (r *SoakReport) ConsumersBounded() bool {
	for _, c := range r.Consumers {
		if c.SecondHalfMax > c.FirstHalfMax {
			return false
		}
	}
	return len(r.Consumers) > 0
}

// Soak runs the topology under load for Duration, sampling every Interval,
// then samples on until the retention has emptied the buckets.
func Soak(ctx context.Context, o SoakOptions) (*SoakReport, error) {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	co := Options{Concurrency: o.Concurrency, Tasks: o.Tasks, PerPrompt: o.PerPrompt, FirstRollout: o.FirstRollout,
		RolloutTimeout: o.RolloutTimeout, BarrierTimeout: o.BarrierTimeout, Grace: o.Grace, ActTimeout: o.ActTimeout,
		RetentionSlack: o.RetentionSlack, Rollouts: 1, Bin: o.Bin, Retention: o.Retention}
	co.defaults()
	rep := &SoakReport{Topology: o.Topology, Started: time.Now(), Machine: ThisMachine()}
	rep.Settings = Settings{
		Seed: o.Seed, Concurrency: co.Concurrency, Tasks: co.Tasks, PerPrompt: co.PerPrompt,
		RolloutTimeout: co.RolloutTimeout.String(), BarrierTimeout: co.BarrierTimeout.String(),
		ActTimeout: co.ActTimeout.String(), Span: o.Duration.String(), Auth: o.Auth,
	}
	say := progressFunc(o.Progress, o.Topology)
	fail := func(err error) (*SoakReport, error) {
		rep.Err = err.Error()
		rep.Seconds = time.Since(rep.Started).Seconds()
		return rep, err
	}
	if err := co.checkRetention(); err != nil {
		return fail(err)
	}
	retention := o.Retention
	if !o.Bin.RetentionFlags {
		retention = Retention{}
	}
	top, err := StartTopology(ctx, TopologyOptions{
		Kind: o.Topology, Dir: o.Dir, Root: o.Root, Bin: o.Bin, Auth: o.Auth,
		Retention: retention, Processes: o.Processes, Progress: o.Progress, LogLevel: o.LogLevel, ServeFlags: o.ServeFlags,
	})
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", o.Topology, err))
	}
	defer top.Close()
	rep.Settings.ServeArgs = top.ServeArgs("<service>")
	calls := NewEngineCalls(top.PlannerURL, top.ActorURL)
	callsCtx, stopCalls := context.WithCancel(ctx)
	callsDone := make(chan struct{})
	go func() { defer close(callsDone); calls.Run(callsCtx, time.Second) }()
	defer func() { stopCalls(); <-callsDone }()
	admin, err := top.Connect("", "planact-soak-admin")
	if err != nil {
		return fail(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		return fail(err)
	}
	obs, err := NewObserver(ctx, js, false)
	if err != nil {
		return fail(err)
	}
	defer obs.Stop()
	planner, err := top.Connect(top.TrainerUser(schema.RolePlanner), "planact-soak-planner")
	if err != nil {
		return fail(err)
	}
	defer planner.Close()
	actor, err := top.Connect(top.TrainerUser(schema.RoleActor), "planact-soak-actor")
	if err != nil {
		return fail(err)
	}
	defer actor.Close()

	var mu sync.Mutex
	var recs []RolloutRecord
	start := time.Now()
	sample := func(phase string, state *BusState) {
		s := SoakSample{Seconds: time.Since(start).Seconds(), Phase: phase, RSS: map[string]int64{}}
		for _, p := range top.Procs() {
			s.RSS[p.Name] = p.RSS()
		}
		if state != nil {
			s.State = *state
		} else {
			st, err := ReadBusState(ctx, js)
			s.State = st
			if err != nil {
				s.Err = err.Error()
			}
		}
		mu.Lock()
		s.Rollouts = len(recs)
		rep.Samples = append(rep.Samples, s)
		mu.Unlock()
	}

	loadDone := make(chan struct{})
	samplerDone := make(chan struct{})
	until := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(o.Interval)
		defer tick.Stop()
		sample(PhaseLoad, nil)
		for {
			select {
			case <-loadDone:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				phase := PhaseLoad
				select {
				case <-until:
					phase = PhaseDrain
				default:
				}
				sample(phase, nil)
				mu.Lock()
				n := len(recs)
				mu.Unlock()
				say("%s %s: %d rollouts finished", phase, time.Since(start).Round(time.Second), n)
			}
		}
	}()
	go func() {
		select {
		case <-time.After(o.Duration):
		case <-ctx.Done():
		}
		close(until)
	}()
	_, err = Drive(ctx, DriverOptions{
		Planner: planner, Actor: actor,
		PlannerEngine: schema.Engine{URL: top.PlannerURL, Protocol: "sglang"},
		ActorEngine:   schema.Engine{URL: top.ActorURL, Protocol: "sglang"},
		EngineSeeds:   top.EngineSeeds,
		FirstRollout:  co.FirstRollout, Concurrency: co.Concurrency,
		Tasks: co.Tasks, PerPrompt: co.PerPrompt, Seed: o.Seed, Config: co.rolloutConfig(),
		Wait: co.wait(), Until: until,
		Done: func(r RolloutRecord) {
			mu.Lock()
			recs = append(recs, r)
			mu.Unlock()
		},
	})
	drained := time.Since(start)
	close(loadDone)
	<-samplerDone
	if err != nil {
		return fail(err)
	}
	sample(PhaseDrain, nil)
	rep.RolloutsPerSec = float64(len(recs)) / o.Duration.Seconds()
	say("load done: %d rollouts in %s (%.1f/s), the last ended after %s; checking the ledger",
		len(recs), o.Duration, rep.RolloutsPerSec, drained.Round(time.Second))

	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = obs.CaughtUp(cctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	stopCalls()
	<-callsDone
	calls.Take(ctx) // the calls since the last take
	rep.EngineCalls = calls.Summary()
	executed, outcomes, actCalls := obs.Executed(), obs.Outcomes(), calls.Acts()
	sort.Slice(recs, func(i, j int) bool { return recs[i].Rollout < recs[j].Rollout })
	for _, rec := range recs {
		c := Check(rec, obs.Results(rec.Rollout), executed[rec.Rollout], JoinCalls(outcomes[rec.Rollout], actCalls[rec.Rollout]))
		rep.Tally.Add(c)
		if c.Verdict != VerdictOK {
			rep.Problems = append(rep.Problems, c)
		}
	}
	rep.Pickup = PickupOf(recs, obs.ResultAt)
	obs.Stop()

	end := rep.Samples[len(rep.Samples)-1].State
	rep.KeysEndOfLoad, rep.ObjectsEnd = end.Keys, end.ObjectCount()
	deadline := time.Now()
	desc := "none: planact serve has no --history/--result-retention; counted right after the load"
	if o.Bin.RetentionFlags && (o.Retention.History > 0 || o.Retention.Results > 0) {
		desc = fmt.Sprintf("--history %s --result-retention %s", o.Retention.History, o.Retention.Results)
		deadline = time.Now().Add(max(o.Retention.History, o.Retention.Results) + co.RetentionSlack)
		say("sampling until the retention has passed: until %s at the latest", deadline.Format("15:04:05"))
	}
	last := time.Now()
	l, _ := WaitLeftovers(ctx, js, deadline, func(s BusState) {
		if time.Since(last) >= o.Interval {
			last = time.Now()
			sample(PhaseRetention, &s)
		}
	})
	sample(PhaseRetention, nil)
	l.Retention = desc
	l.Waited = time.Since(start) - drained
	rep.Leftovers = l
	rep.Memory, rep.Consumers = trends(rep.Samples)
	rep.Exits = top.Exits()
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, nil
}

// trends computes the memory and consumer figures from the samples.
func trends(samples []SoakSample) ([]MemoryTrend, []ConsumerTrend) {
	var load []SoakSample
	for _, s := range samples {
		if s.Phase == PhaseLoad {
			load = append(load, s)
		}
	}
	if len(load) < 3 {
		return nil, nil
	}
	end := load[len(load)-1].Seconds
	var procs []string
	for p := range load[len(load)-1].RSS {
		procs = append(procs, p)
	}
	sort.Strings(procs)
	var mem []MemoryTrend
	for _, p := range procs {
		var warm, last []float64
		m := MemoryTrend{Proc: p}
		for _, s := range load {
			mb := float64(s.RSS[p]) / (1 << 20)
			m.MaxMB = max(m.MaxMB, mb)
			switch {
			case s.Seconds >= 2*end/3:
				last = append(last, mb)
			case s.Seconds >= end/3:
				warm = append(warm, mb)
			}
		}
		m.WarmMB, m.LastMB = mean(warm), mean(last)
		if m.WarmMB > 0 {
			m.Ratio = m.LastMB / m.WarmMB
		}
		mem = append(mem, m)
	}
	var cons []ConsumerTrend
	for _, st := range names(samples, func(s BusState) map[string]int { return s.Consumers }) {
		c := ConsumerTrend{Stream: st}
		for _, s := range load {
			n := s.State.Consumers[st]
			if s.Seconds < end/2 {
				c.FirstHalfMax = max(c.FirstHalfMax, n)
			} else {
				c.SecondHalfMax = max(c.SecondHalfMax, n)
			}
		}
		c.EndOfLoad = load[len(load)-1].State.Consumers[st]
		c.AfterRetention = samples[len(samples)-1].State.Consumers[st]
		cons = append(cons, c)
	}
	return mem, cons
}

// names returns the keys that field has in any sample, sorted.
func names[V any](samples []SoakSample, field func(BusState) map[string]V) []string {
	seen := map[string]bool{}
	for _, s := range samples {
		for k := range field(s.State) {
			seen[k] = true
		}
	}
	return sortedKeys(seen)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

// Package chaos proves planact's crash safety from outside: it runs the
// real topology as processes (nats-server nodes, one process per service,
// simulated engines), plays both trainers for many rollouts at once, breaks
// the topology on a seeded schedule (kill -9, SIGSTOP past the ack wait,
// node and leader loss, whole-cluster restart), and holds everything that
// came out against a ledger: no rollout lost, hung or doubled, samples that
// match what was executed, nothing left after retention. Soak runs the same
// topology without faults for a long time and samples memory, consumers,
// keys and objects.
package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/schema"
)

// Options configure a chaos run on one topology.
type Options struct {
	Topology string // Cluster or Single
	Root     string // the repository
	Bin      Binaries
	Dir      string // work directory (configs, stores, logs)

	Seed        int64
	Rollouts    int // at least this many; more while faults remain
	Concurrency int
	Tasks       int // distinct tasks per rollout
	PerPrompt   int // copies of each task
	// FirstRollout is the id of the first rollout; 0 takes one from the
	// clock so that runs do not share ids.
	FirstRollout int64

	Faults int           // how many faults
	Kinds  []string      // nil = every kind of the topology
	Span   time.Duration // faults are spread over it
	Gap    time.Duration // at least this between a fault's repair and the next fault
	// Settle is how long rollouts keep starting after the last fault, so
	// that the system is seen working after it.
	Settle time.Duration

	// RolloutTimeout is the rollouts' deadline (rollout_timeout_s) and
	// BarrierTimeout how long one role waits for the other
	// (barrier_timeout_s); the trainers wait both and Grace longer for
	// planact to say so.
	RolloutTimeout time.Duration
	BarrierTimeout time.Duration
	Grace          time.Duration
	ActTimeout     time.Duration // act_timeout_s
	// Mode is the rollouts' coordination mode (schema.Modes); "" is plan_act.
	Mode string
	// EnsemblePick is ensemble_pick with mode ensemble; "" is vote.
	EnsemblePick string
	// Retention is passed to the services when the planact binary takes
	// the flags (Bin.RetentionFlags); then the leftover check waits for it.
	Retention Retention
	// RetentionSlack is how long past the retention the leftover check
	// waits for keys and objects to go (expiry runs on timers).
	RetentionSlack time.Duration
	Auth           bool
	Processes      map[string]int
	LogLevel       string   // of the services
	ServeFlags     []string // more flags of `planact serve`, e.g. --stall-timeout 30s
	// SimFlags are more flags of the simulated engines (`planact sim`),
	// e.g. --ttft 100ms for slower ones: fewer rollouts a second, as many
	// in flight.
	SimFlags []string
	Progress io.Writer
}

func (o *Options) defaults() {
	if o.Rollouts <= 0 {
		o.Rollouts = 100
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Tasks <= 0 {
		o.Tasks = 2
	}
	if o.PerPrompt <= 0 {
		o.PerPrompt = 2
	}
	if o.FirstRollout == 0 {
		o.FirstRollout = time.Now().Unix() * 100_000
	}
	if o.Span <= 0 {
		o.Span = 3 * time.Minute
	}
	if o.Gap <= 0 {
		o.Gap = 3 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 15 * time.Second
	}
	if o.RolloutTimeout <= 0 {
		o.RolloutTimeout = 5 * time.Minute
	}
	if o.BarrierTimeout <= 0 {
		o.BarrierTimeout = time.Minute
	}
	if o.Grace <= 0 {
		o.Grace = time.Minute
	}
	if o.ActTimeout <= 0 {
		o.ActTimeout = 10 * time.Second
	}
	if o.RetentionSlack <= 0 {
		o.RetentionSlack = 2 * time.Minute
	}
}

// rolloutConfig is what the planner's arrival asks for.
func (o *Options) rolloutConfig() schema.Config {
	return schema.Config{
		RolloutTimeoutS: o.RolloutTimeout.Seconds(), BarrierTimeoutS: o.BarrierTimeout.Seconds(),
		ActTimeoutS: o.ActTimeout.Seconds(), Mode: o.Mode, EnsemblePick: o.EnsemblePick,
	}
}

// wait is how long a trainer waits for its result.
func (o *Options) wait() time.Duration { return o.BarrierTimeout + o.RolloutTimeout + o.Grace }

// checkRetention refuses a history that a rollout could outlive: planact
// would forget a rollout (its session, its messages) while it runs.
func (o *Options) checkRetention() error {
	if h := o.Retention.History; o.Bin.RetentionFlags && h > 0 && h <= o.BarrierTimeout+o.RolloutTimeout {
		return fmt.Errorf("history %s: want more than the barrier and rollout time-outs (%s + %s)", h, o.BarrierTimeout, o.RolloutTimeout)
	}
	return nil
}

// Run carries out one chaos run and returns its report; an error means the
// run itself could not be carried out (the report says how far it got).
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	rep := &Report{Topology: o.Topology, Started: time.Now(), Machine: ThisMachine()}
	rep.Settings = Settings{
		Seed: o.Seed, Rollouts: o.Rollouts, Concurrency: o.Concurrency, Tasks: o.Tasks, PerPrompt: o.PerPrompt,
		RolloutTimeout: o.RolloutTimeout.String(), BarrierTimeout: o.BarrierTimeout.String(),
		ActTimeout: o.ActTimeout.String(), Span: o.Span.String(), Auth: o.Auth, Mode: o.Mode, EnsemblePick: o.EnsemblePick,
	}
	say := progressFunc(o.Progress, o.Topology)
	fail := func(err error) (*Report, error) {
		rep.Err = err.Error()
		rep.Seconds = time.Since(rep.Started).Seconds()
		rep.Verdict()
		return rep, err
	}

	if err := o.checkRetention(); err != nil {
		return fail(err)
	}
	retention := o.Retention
	if !o.Bin.RetentionFlags {
		retention = Retention{}
	}
	top, err := StartTopology(ctx, TopologyOptions{
		Kind: o.Topology, Dir: o.Dir, Root: o.Root, Bin: o.Bin, Auth: o.Auth,
		Retention: retention, Processes: o.Processes, Progress: o.Progress, LogLevel: o.LogLevel, ServeFlags: o.ServeFlags,
		SimFlags: o.SimFlags,
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

	admin, err := top.Connect("", "planact-chaos-admin")
	if err != nil {
		return fail(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		return fail(err)
	}
	obs, err := NewObserver(ctx, js, true)
	if err != nil {
		return fail(err)
	}
	defer obs.Stop()
	planner, err := top.Connect(top.TrainerUser(schema.RolePlanner), "planact-chaos-planner")
	if err != nil {
		return fail(err)
	}
	defer planner.Close()
	actor, err := top.Connect(top.TrainerUser(schema.RoleActor), "planact-chaos-actor")
	if err != nil {
		return fail(err)
	}
	defer actor.Close()

	ackWaits := AckWaits(ctx, js)
	rep.Settings.AckWaits = map[string]string{}
	for svc, d := range ackWaits {
		rep.Settings.AckWaits[svc] = d.String()
	}
	schedule := NewSchedule(ScheduleOptions{Topology: o.Topology, Faults: o.Faults, Span: o.Span, Kinds: o.Kinds, Seed: o.Seed, AckWaits: ackWaits})
	rep.Settings.Faults = schedule
	say("seed %d, ack waits %v, %d faults planned:", o.Seed, rep.Settings.AckWaits, len(schedule))
	for _, f := range schedule {
		say("  %s", f)
	}

	start := time.Now()
	faultsDone, settled := make(chan struct{}), make(chan struct{})
	var faults []FaultRecord
	in := &Injector{T: top, JS: js, Rng: rand.New(rand.NewPCG(uint64(o.Seed), 1))}
	go func() {
		defer close(settled)
		func() {
			defer close(faultsDone)
			faults = in.RunSchedule(ctx, start, schedule, o.Gap, say)
		}()
		say("faults done; rollouts go on for %s", o.Settle)
		select {
		case <-time.After(o.Settle):
		case <-ctx.Done():
		}
	}()

	var mu sync.Mutex
	var recs []RolloutRecord
	finished := 0
	started, err := Drive(ctx, DriverOptions{
		Planner: planner, Actor: actor,
		PlannerEngine: schema.Engine{URL: top.PlannerURL, Protocol: "sglang"},
		ActorEngine:   schema.Engine{URL: top.ActorURL, Protocol: "sglang"},
		EngineSeeds:   top.EngineSeeds,
		FirstRollout:  o.FirstRollout, Rollouts: o.Rollouts, Concurrency: o.Concurrency,
		Tasks: o.Tasks, PerPrompt: o.PerPrompt, Seed: o.Seed, Config: o.rolloutConfig(),
		Wait: o.wait(), Until: settled,
		Done: func(r RolloutRecord) {
			mu.Lock()
			defer mu.Unlock()
			recs = append(recs, r)
			finished++
			if finished%25 == 0 {
				say("%d rollouts finished", finished)
			}
		},
	})
	<-faultsDone
	rep.Faults = faults
	if err != nil {
		return fail(err)
	}
	say("%d rollouts finished; checking the ledger", started)

	caughtUp := func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return obs.CaughtUp(cctx)
	}
	if err := caughtUp(); err != nil {
		return fail(err)
	}
	// The services go on after the trainers stop: a message delivered
	// again can run an act once its rollout has ended. The engines' calls
	// and the outcomes are taken once the retention has passed, when the
	// rollouts' states are gone, so that such a call counts too.
	rep.Leftovers = checkLeftovers(ctx, js, o, obs.Last(), say)
	if err := caughtUp(); err != nil {
		return fail(err)
	}
	stopCalls()
	<-callsDone
	calls.Take(ctx) // the calls since the last take
	rep.EngineCalls = calls.Summary()
	sort.Slice(recs, func(i, j int) bool { return recs[i].Rollout < recs[j].Rollout })
	executed, outcomes, actCalls := obs.Executed(), obs.Outcomes(), calls.Acts()
	for _, rec := range recs {
		c := Check(rec, obs.Results(rec.Rollout), executed[rec.Rollout], JoinCalls(outcomes[rec.Rollout], actCalls[rec.Rollout]))
		rep.Tally.Add(c)
		if c.Verdict != VerdictOK {
			rep.Problems = append(rep.Problems, c)
		}
	}
	rep.Unsolicited = append(Unsolicited(recs, obs.AllResults(), executed), UnplayedCalls(recs, actCalls)...)
	rep.Unread = obs.Unread()
	rep.Pickup = PickupOf(recs, obs.ResultAt)
	for i := range rep.Faults {
		f := &rep.Faults[i]
		f.Recovery = RecoveryOf(f.At, recs, obs.Events)
		moved := "all in-flight episodes moved after " + secs(f.Recovery.Full)
		if f.Recovery.Unrecovered > 0 {
			moved = fmt.Sprintf("%d in-flight episodes never moved", f.Recovery.Unrecovered)
		}
		say("%s at %s: first progress after %s, next rollout completed after %s, %s",
			f.Kind, f.At.Format("15:04:05.000"), secs(f.Recovery.FirstProgress), secs(f.Recovery.NextCompletion), moved)
	}
	rep.Recovery = SumRecovery(rep.Faults)
	rep.Exits = top.Exits()
	if o.Auth {
		rep.Violations = top.Violations()
	}
	rep.ObserverErrors = obs.Errors()
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.Verdict()
	return rep, nil
}

// checkLeftovers counts keys and objects once the retention has passed
// since the last result, or right away when the services could not be
// told a retention (then the defaults, a day, apply and the count says
// what a run leaves behind).
func checkLeftovers(ctx context.Context, js jetstream.JetStream, o Options, last time.Time, say func(string, ...any)) Leftovers {
	r := o.Retention
	deadline := time.Now()
	desc := "none: planact serve has no --history/--result-retention; counted right after the run"
	if o.Bin.RetentionFlags {
		if r.History == 0 && r.Results == 0 {
			desc = "the services' defaults; counted right after the run"
		} else {
			desc = fmt.Sprintf("--history %s --result-retention %s", r.History, r.Results)
			if last.IsZero() {
				last = time.Now()
			}
			deadline = last.Add(max(r.History, r.Results) + o.RetentionSlack)
			say("waiting for the retention: until %s at the latest", deadline.Format("15:04:05"))
		}
	}
	l, _ := WaitLeftovers(ctx, js, deadline, nil)
	l.Retention = desc
	if !last.IsZero() {
		l.Waited = time.Since(last)
	}
	return l
}

func progressFunc(w io.Writer, topology string) func(string, ...any) {
	if w == nil {
		return func(string, ...any) {}
	}
	var mu sync.Mutex
	return func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "%s  %-7s "+format+"\n", append([]any{time.Now().Format("15:04:05.000"), topology}, a...)...)
	}
}

// WorkDir makes a fresh work directory under parent ("" = the system's
// temporary directory).
func WorkDir(parent, topology string) (string, error) {
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return "", err
		}
	}
	return os.MkdirTemp(parent, "planact-chaos-"+topology+"-")
}

// LogFiles lists the logs in a work directory.
func LogFiles(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	return m
}

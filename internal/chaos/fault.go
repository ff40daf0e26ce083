package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
)

// Fault kinds. A kill is kill -9 of the process group, then a restart after
// the fault's down time; a stop is SIGSTOP for longer than the service's
// consumers' ack wait, then SIGCONT.
const (
	FaultStopDispatcher = "stop:" + ActDispatcher
	FaultStopPlanner    = "stop:" + PlannerGateway
	FaultKillMetaLeader = "kill:nats-meta-leader"   // the node leading the JetStream meta group
	FaultKillLeader     = "kill:nats-stream-leader" // the node leading one of planact's streams
	FaultRestartCluster = "restart:nats-cluster"    // all three nodes down, then up
	FaultKillNATS       = "kill:nats"               // the single node, restarted on its data directory
)

// FaultKill is the kind that kills a process of service.
func FaultKill(service string) string { return "kill:" + service }

// FaultKinds lists every fault a topology can take.
func FaultKinds(topology string) []string {
	var kinds []string
	for _, s := range ServiceNames {
		kinds = append(kinds, FaultKill(s))
	}
	kinds = append(kinds, FaultStopDispatcher, FaultStopPlanner)
	if topology == Cluster {
		return append(kinds, FaultKillMetaLeader, FaultKillLeader, FaultRestartCluster)
	}
	return append(kinds, FaultKillNATS)
}

// DefaultAckWaits are the ack waits of the services' consumers, which a
// stop must outlast: the act-dispatcher's are 30s, the planner-gateway's
// 60s.
func DefaultAckWaits() map[string]time.Duration {
	return map[string]time.Duration{ActDispatcher: 30 * time.Second, PlannerGateway: 60 * time.Second}
}

// AckWaits reads the ack wait of every durable consumer of planact's
// streams and returns the longest per service (a consumer belongs to the
// service its name starts with). Services it cannot read keep the
// defaults.
func AckWaits(ctx context.Context, js jetstream.JetStream) map[string]time.Duration {
	out := DefaultAckWaits()
	found := map[string]time.Duration{}
	for _, stream := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamTimeout, bus.StreamTrainer("planner"), bus.StreamTrainer("actor")} {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := js.Stream(lctx, stream)
		if err != nil {
			cancel()
			continue
		}
		lister := st.ListConsumers(lctx)
		for info := range lister.Info() {
			for _, svc := range ServiceNames {
				if strings.HasPrefix(info.Config.Durable, svc) {
					found[svc] = max(found[svc], info.Config.AckWait)
				}
			}
		}
		cancel()
	}
	for svc, d := range found {
		out[svc] = d
	}
	return out
}

// Fault is one planned fault.
type Fault struct {
	Kind string        `json:"kind"`
	At   time.Duration `json:"at"`   // after the start of the run, at the earliest
	Down time.Duration `json:"down"` // how long the target stays dead or stopped
}

func (f Fault) String() string {
	return fmt.Sprintf("+%-6s %-26s down %s", f.At.Round(100*time.Millisecond), f.Kind, f.Down.Round(100*time.Millisecond))
}

// ScheduleOptions shape a fault schedule.
type ScheduleOptions struct {
	Topology string
	Faults   int           // how many; each kind once before any twice
	Span     time.Duration // faults are spread over it
	Kinds    []string      // nil = FaultKinds(Topology)
	Seed     int64
	AckWaits map[string]time.Duration // nil = DefaultAckWaits
}

// NewSchedule plans faults at random (from Seed): the kinds in a shuffled
// order, repeated when there are more faults than kinds, spread evenly
// over Span with jitter.
func NewSchedule(o ScheduleOptions) []Fault {
	kinds := o.Kinds
	if kinds == nil {
		kinds = FaultKinds(o.Topology)
	}
	ack := o.AckWaits
	if ack == nil {
		ack = DefaultAckWaits()
	}
	if len(kinds) == 0 || o.Faults <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x6368616f73))
	var order []string
	for len(order) < o.Faults {
		round := slices.Clone(kinds)
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		order = append(order, round...)
	}
	order = order[:o.Faults]
	slot := o.Span / time.Duration(o.Faults+1)
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	var faults []Fault
	for i, k := range order {
		f := Fault{Kind: k, At: slot*time.Duration(i+1) + between(-slot/4, slot/4)}
		switch {
		case strings.HasPrefix(k, "stop:"):
			f.Down = ack[strings.TrimPrefix(k, "stop:")] + between(2*time.Second, 8*time.Second)
		case k == FaultRestartCluster:
			f.Down = between(2*time.Second, 6*time.Second)
		case strings.Contains(k, "nats"):
			f.Down = between(time.Second, 5*time.Second)
		default:
			f.Down = between(300*time.Millisecond, 3*time.Second)
		}
		faults = append(faults, f)
	}
	return faults
}

// FaultRecord is a fault as it happened.
type FaultRecord struct {
	Kind     string    `json:"kind"`
	Target   string    `json:"target"`
	Note     string    `json:"note,omitempty"`
	Err      string    `json:"err,omitempty"` // the harness could not inject or repair it
	At       time.Time `json:"at"`            // killed or stopped
	Repaired time.Time `json:"repaired"`      // restarted or continued
	Ready    time.Time `json:"ready"`         // the target is ready again
	Recovery Recovery  `json:"recovery"`
}

// Injector carries out faults on a topology.
type Injector struct {
	T   *Topology
	JS  jetstream.JetStream // to find stream leaders
	Rng *rand.Rand
}

// Inject carries out f now: it kills or stops the target, waits its down
// time, restarts or continues it and waits until it is ready.
func (in *Injector) Inject(ctx context.Context, f Fault) FaultRecord {
	r := FaultRecord{Kind: f.Kind}
	fail := func(err error) FaultRecord {
		r.Err = err.Error()
		return r
	}
	switch {
	case strings.HasPrefix(f.Kind, "kill:") && slices.Contains(ServiceNames, strings.TrimPrefix(f.Kind, "kill:")):
		p := in.pick(strings.TrimPrefix(f.Kind, "kill:"))
		if p == nil {
			return fail(fmt.Errorf("no running %s process", strings.TrimPrefix(f.Kind, "kill:")))
		}
		r.Target = p.Name
		r.At = time.Now()
		p.Kill()
		in.sleep(ctx, f.Down)
		r.Repaired = time.Now()
		if err := p.Start(); err != nil {
			return fail(err)
		}
		if err := in.T.WaitService(ctx, p); err != nil {
			return fail(err)
		}
		r.Ready = time.Now()
	case strings.HasPrefix(f.Kind, "stop:"):
		p := in.pick(strings.TrimPrefix(f.Kind, "stop:"))
		if p == nil {
			return fail(fmt.Errorf("no running %s process", strings.TrimPrefix(f.Kind, "stop:")))
		}
		r.Target = p.Name
		r.At = time.Now()
		if err := p.Stop(); err != nil {
			return fail(err)
		}
		in.sleep(ctx, f.Down)
		r.Repaired = time.Now()
		if err := p.Cont(); err != nil {
			return fail(err)
		}
		r.Ready = r.Repaired
	case f.Kind == FaultKillMetaLeader:
		n, err := in.T.MetaLeader(ctx)
		if err != nil {
			return fail(err)
		}
		r.Target, r.Note = n.Spec.Name, "meta leader"
		if err := in.restartNodes(ctx, &r, f.Down, n); err != nil {
			return fail(err)
		}
	case f.Kind == FaultKillLeader:
		n, note, err := in.streamLeader(ctx)
		if err != nil {
			return fail(err)
		}
		r.Target, r.Note = n.Spec.Name, note
		if err := in.restartNodes(ctx, &r, f.Down, n); err != nil {
			return fail(err)
		}
	case f.Kind == FaultRestartCluster || f.Kind == FaultKillNATS:
		var names []string
		for _, n := range in.T.Nodes {
			names = append(names, n.Spec.Name)
		}
		r.Target = strings.Join(names, ",")
		if err := in.restartNodes(ctx, &r, f.Down, in.T.Nodes...); err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unknown fault kind %q", f.Kind))
	}
	return r
}

// pick returns a random running process of service.
func (in *Injector) pick(service string) *Proc {
	var running []*Proc
	for _, p := range in.T.ServiceProcs(service) {
		if p.Running() {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return nil
	}
	return running[in.Rng.IntN(len(running))]
}

// streamLeader picks one of planact's streams at random, preferring one
// whose leader does not lead the meta group too (that is the other fault).
func (in *Injector) streamLeader(ctx context.Context) (*Node, string, error) {
	streams := []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamTimeout, bus.StreamTrainer("planner"), bus.StreamTrainer("actor"),
		"KV_" + bus.BucketSession, "KV_" + bus.BucketRuns}
	in.Rng.Shuffle(len(streams), func(i, j int) { streams[i], streams[j] = streams[j], streams[i] })
	meta, _ := in.T.MetaLeader(ctx)
	var first *Node
	var firstStream string
	for _, s := range streams {
		n, err := in.T.StreamLeader(ctx, in.JS, s)
		if err != nil {
			continue
		}
		if meta == nil || n != meta {
			return n, "leader of stream " + s, nil
		}
		if first == nil {
			first, firstStream = n, s
		}
	}
	if first == nil {
		return nil, "", fmt.Errorf("no stream leader found")
	}
	return first, "leader of stream " + firstStream + ", and meta leader", nil
}

// restartNodes kills the nodes at once, waits down, starts them again on
// their data directories and waits until they are healthy.
func (in *Injector) restartNodes(ctx context.Context, r *FaultRecord, down time.Duration, nodes ...*Node) error {
	r.At = time.Now()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Proc.Kill() }()
	}
	wg.Wait()
	in.sleep(ctx, down)
	r.Repaired = time.Now()
	for _, n := range nodes {
		if err := n.Proc.Start(); err != nil {
			return err
		}
	}
	if err := in.T.WaitNodes(ctx, nodes...); err != nil {
		return err
	}
	r.Ready = time.Now()
	return nil
}

func (in *Injector) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// RunSchedule carries out the faults in order, each no earlier than its
// time after start and at least gap after the previous one is repaired,
// and returns what happened. progress, if set, gets a line per fault.
func (in *Injector) RunSchedule(ctx context.Context, start time.Time, faults []Fault, gap time.Duration, progress func(string, ...any)) []FaultRecord {
	var out []FaultRecord
	next := start
	for _, f := range faults {
		at := start.Add(f.At)
		if at.Before(next) {
			at = next
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(time.Until(at)):
		}
		if progress != nil {
			progress("fault: %s (down %s)", f.Kind, f.Down.Round(100*time.Millisecond))
		}
		r := in.Inject(ctx, f)
		if progress != nil {
			if r.Err != "" {
				progress("fault: %s on %s FAILED: %s", f.Kind, r.Target, r.Err)
			} else {
				progress("fault: %s on %s %s: ready after %s", f.Kind, r.Target, r.Note, r.Ready.Sub(r.At).Round(time.Millisecond))
			}
		}
		out = append(out, r)
		next = time.Now().Add(gap)
	}
	return out
}

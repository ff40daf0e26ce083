// Package actdispatcher is the act-dispatcher service: it owns execution.
// For every parsed plan it creates the turn's run state, releases each node
// as soon as its dependencies allow, executes the acts (through the
// actor-gateway or an HTTP tool) with retries and time-outs, and when the
// turn is over asks the planner for the next turn or ends the episode.
// Replicas share one durable consumer of plans: each turn is run by the
// replica that took its plan (see turn.go), and another takes it over from
// what JetStream holds if that one stops.
package actdispatcher

import (
	"cmp"
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// Name is the service's name on the bus.
const Name = "act-dispatcher"

// Deps are what the act-dispatcher needs.
type Deps struct {
	Bus *bus.Bus
	Log zerolog.Logger
	// ActConcurrency bounds the acts this replica executes at once; default
	// 256. The acts on an actor engine that states its capacity
	// (engine.max_in_flight) are bounded by twice that instead, on their
	// own: the capacity runs and as much waits at the actor-gateways (which
	// share the capacity), so that however their queue group spreads the
	// requests each has the work to fill its share, and a slot the engine
	// frees is taken at once by a request already there.
	ActConcurrency int
	// Turns bounds the turns this replica runs at once (each holds its plan
	// message until the turn is over); default 4096.
	Turns int
	// HTTP calls HTTP tools; nil means a client with sane time-outs.
	HTTP *http.Client
	// RetryBase is the first retry back-off; it doubles, with jitter; default 200ms.
	RetryBase time.Duration
	// RunAckWait is how long JetStream waits for a sign of life of the
	// replica running a turn before it hands the turn's plan to another
	// replica, which takes the turn over; the consume loop signals progress
	// every third of it while the turn runs. Default bus.DefaultAckWait.
	RunAckWait time.Duration
	// UnavailablePatience is how long an act waits for an actor-gateway to
	// answer at all before it fails as unavailable; default 30s.
	UnavailablePatience time.Duration
	// Stall is how long an episode may go without progress before the
	// watchdog drives it on from what JetStream holds; default 5m. An
	// episode waiting for acts or a planner turn that may legitimately take
	// longer (its time-outs and retries) is given that long.
	Stall time.Duration
	// PlannerSlack is how much longer than the planner's time-out an
	// episode waiting for a planner turn may go without progress (the turn
	// may wait for engine capacity, then be parsed); default 30s.
	PlannerSlack time.Duration
}

// Service is a running act-dispatcher replica.
type Service struct {
	Deps
	sessions *session.Cache

	// follow knows which rollouts run (the watchdog's), cancels the acts
	// of one that ends, and holds acts while the actor role is paused.
	follow  *session.Follower
	moved   moved         // the plan messages of each episode this replica handled (the watchdog's)
	prior   priorCache    // the successful calls of finished turns (the duplicate guard's)
	runners runners       // the turns this replica runs
	slots   chan struct{} // acts in flight (but those of engines with a stated capacity)
	engMu   sync.Mutex
	engines map[schema.Engine]chan struct{} // acts in flight on each actor engine with a stated capacity
	replies bus.Inbox                       // the actor-gateways' answers (actor.go)
	// overdueTools counts the calls of Go tools still running past the
	// deadline of their attempt (they ignored their context): each left
	// behind, and logged with the count, so that a leak shows.
	overdueTools atomic.Int64
	// now is the clock the watchdog counts stalls on and an act its
	// budget (the time it was held, the time it took); nil is time.Now.
	// A test moves it rather than sleep.
	now func() time.Time
}

// clock reads the replica's clock (now).
func (s *Service) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	s := newService(d)
	d = s.Deps
	consumers := []struct {
		c bus.Consumer
		h bus.Handler
	}{
		{Consumers(d)[0], s.handlePlan},
	}
	// One part that fails stops the others: the service fails as a whole,
	// never half of it in silence.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(consumers)+2)
	var wg sync.WaitGroup
	part := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	part(s.follow.Run)
	part(s.watchdog)
	for _, c := range consumers {
		part(func(ctx context.Context) error { return d.Bus.Consume(ctx, c.c, c.h) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// newService is a replica with d's defaults applied, not yet running.
func newService(d Deps) *Service {
	if d.ActConcurrency == 0 {
		d.ActConcurrency = 256
	}
	if d.HTTP == nil {
		d.HTTP = &http.Client{Timeout: 5 * time.Minute}
	}
	if d.RunAckWait == 0 {
		d.RunAckWait = bus.DefaultAckWait
	}
	if d.UnavailablePatience == 0 {
		d.UnavailablePatience = 30 * time.Second
	}
	if d.Stall == 0 {
		d.Stall = 5 * time.Minute
	}
	if d.PlannerSlack == 0 {
		d.PlannerSlack = 30 * time.Second
	}
	if d.RetryBase == 0 {
		d.RetryBase = 200 * time.Millisecond
	}
	if d.Turns == 0 {
		d.Turns = 4096
	}
	s := &Service{Deps: d, sessions: session.NewCache(d.Bus),
		runners: runners{m: map[string]*runner{}}, slots: make(chan struct{}, d.ActConcurrency), engines: map[schema.Engine]chan struct{}{}}
	s.follow = session.NewFollower(d.Bus, d.Log)
	s.follow.OnEnd = s.rolloutEnded
	return s
}

// rolloutEnded drops what the replica kept of rollout n, which ended: its
// number may be used again by a later rollout, which must find none of it.
func (s *Service) rolloutEnded(n int64) {
	s.sessions.Forget(n)
	s.prior.forget(n)
	s.moved.forget(n)
}

// rolloutID names one rollout for good: its number and when its session
// was created. Numbers start again when a training run does, once the
// earlier run's sessions are gone; what a replica kept of an earlier
// rollout of the number is not this one's.
type rolloutID struct {
	n         int64
	createdMs int64
}

func identify(sess *schema.Session) rolloutID { return rolloutID{sess.Rollout, sess.CreatedMs} }

// Consumers are the act-dispatcher's durable consumers (`planact
// provision` creates them): the parsed plans, answers and parse errors,
// each held by the replica that runs its turn.
func Consumers(d Deps) []bus.Consumer {
	return []bus.Consumer{{Stream: bus.StreamPlan, Durable: Name + "-plan", Concurrency: cmp.Or(d.Turns, 4096), AckWait: cmp.Or(d.RunAckWait, bus.DefaultAckWait),
		Filters: []string{subject.AllPlanDAG, subject.AllPlanAnswer, subject.AllPlanError}}}
}

// info returns the rollout's session, or nil when the rollout is over and
// its messages are to be dropped.
func (s *Service) info(ctx context.Context, n int64) (*session.Info, context.Context, error) {
	info, err := s.sessions.Get(ctx, n)
	if err != nil {
		return nil, ctx, err
	}
	if !info.Active() {
		zerolog.Ctx(ctx).Debug().Str("state", info.Session.State).Msg("rollout is over; message dropped")
		return nil, ctx, nil
	}
	return info, bus.WithTrace(ctx, info.Session.Trace), nil
}

// HdrTakeover, on a plan message the watchdog publishes again, names the
// runner (Run.Runner) the turn is taken from: the replica that handles the
// copy runs the turn from then on.
const HdrTakeover = "Planact-Takeover"

// parseSeq reads a runner's sequence from a header; ok is false when the
// header is absent or not a number.
func parseSeq(s string) (seq uint64, ok bool) {
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// replicaName names this replica for people: in metrics and spans.
func (s *Service) replicaName() string {
	if svc := s.Bus.Service(); svc != nil {
		return svc.Replica()
	}
	return ""
}

// replica names this replica in the outcomes of the acts it runs.
func (s *Service) replica() string {
	if svc := s.Bus.Service(); svc != nil {
		return svc.ID()
	}
	return ""
}

// slotsFor is the bound on acts in flight that act a runs under: its actor
// engine's when the act is the actor model's and the engine states its
// capacity, else the replica's. A Go or HTTP tool, or the mode's own (a
// vote), is no work of the actor engine: before, a Go tool's acts took the
// actor engine's slots, and slow ones held the actor's acts back.
func (s *Service) slotsFor(info *session.Info, a *act) chan struct{} {
	md, err := mode.For(info.Session.Config)
	if err != nil {
		return s.slots
	}
	if tool, ok := md.Tool(info.Session.Config, a.Node.Tool); !ok || tool.Kind != schema.ToolActor {
		return s.slots
	}
	eng, _, err := info.Engine(schema.RoleActor)
	if err != nil || eng.MaxInFlight <= 0 {
		return s.slots
	}
	s.engMu.Lock()
	defer s.engMu.Unlock()
	c := s.engines[eng]
	if c == nil {
		c = make(chan struct{}, 2*eng.MaxInFlight)
		s.engines[eng] = c
	}
	return c
}

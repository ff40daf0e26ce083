// Package plannergateway is the planner-gateway service: it turns a plan
// request into a call to the planner engine and publishes the output with
// the episode's token-exact trajectory.
package plannergateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// Name is the service's name on the bus.
const Name = "planner-gateway"

// Deps are what the planner-gateway needs.
type Deps struct {
	Bus *bus.Bus
	Log zerolog.Logger
	// Engines bounds the generations in flight per planner engine.
	Engines *engine.Pool
	// Concurrency of plan requests handled at once before an engine is
	// known; default 64. Then the width follows the engines: the sum of
	// what this replica may keep in flight on each (engine.Pool).
	Concurrency int
	// AckWait is how long a plan request may go without a sign of life
	// from this replica before JetStream hands it to another; default
	// bus.DefaultAckWait.
	AckWait time.Duration
	// MaxAttempts of a turn whose engine fails transiently before the
	// turn is given up as failed; default 5.
	MaxAttempts int
	// RetryBase is the first back-off between attempts; it doubles; default 500ms.
	RetryBase time.Duration
}

// Service is a running planner-gateway.
type Service struct {
	Deps
	sessions *session.Cache
	// follow cancels the turns of rollouts that end and holds them while
	// the planner role is paused.
	follow *session.Follower

	// id names this instance in the claims of the turns it generates
	// (claim.go); replica names it for people.
	id, replica string
	mu          sync.Mutex
	held        map[string]int // claim keys of the turns this instance generates now: its handlers' marks of each (claim.go)
	// left holds what handlers that handed their turn back had of it (an
	// output not published, the generations sent), by claim key, for the
	// next handler of this instance that takes the turn on (claim.go).
	left map[string]leftTurn
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	if d.Engines == nil {
		d.Engines = &engine.Pool{}
	}
	if d.Concurrency == 0 {
		d.Concurrency = 64
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = 5
	}
	if d.RetryBase == 0 {
		d.RetryBase = 500 * time.Millisecond
	}
	s := &Service{Deps: d, sessions: session.NewCache(d.Bus), follow: session.NewFollower(d.Bus, d.Log), held: map[string]int{}, left: map[string]leftTurn{},
		id: d.Bus.Service().ID(), replica: d.Bus.Service().Replica()}
	if s.id == "" {
		s.id = nuid.Next() // not registered as a service: still named in its claims
	}
	s.follow.OnEnd = func(n int64) {
		s.sessions.Forget(n)
		s.forgetLeft(n)
	}
	go func() { _ = s.follow.Run(ctx) }()
	if id := d.Bus.Service().ID(); id != "" {
		go s.follow.AnswerPauses(ctx, schema.RolePlanner, id)
	}
	// Other instances ask this one whether it still generates a turn it
	// claimed, before they take it over.
	holds, err := d.Bus.NC.Subscribe(holdsSubject(s.id), s.answerHolds)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	defer func() { _ = holds.Unsubscribe() }()
	// The replicas share each engine's stated capacity (max_in_flight),
	// and each pulls only the plan requests its shares can run.
	c := Consumers(d)[0]
	c.Slots = bus.NewSlots(d.Concurrency)
	peers := d.Bus.Peers(ctx)
	d.Engines.Replicas = peers.N
	d.Engines.OnLimits = func(total int) {
		if total == 0 {
			// No engine known (none yet, or every one forgotten, idle): as
			// at the start, until a plan request names one.
			total = d.Concurrency
		}
		c.Slots.SetLimit(total)
	}
	peers.OnChange(func(int) { d.Engines.Rebalance() })
	// Recorded as running before it takes a turn: a pause waits for it.
	if id := d.Bus.Service().ID(); id != "" {
		gone, err := d.Bus.Present(ctx, schema.RolePlanner, id)
		if err != nil {
			return fmt.Errorf("%s: %w", Name, err)
		}
		defer gone() // after the turns it took ended (Consume waits for them)
	}
	// A pause answered before this gateway's presence was recorded is
	// read now, before it takes a turn, however late the watch brings it.
	if err := s.follow.SyncRole(ctx, schema.RolePlanner); err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	return d.Bus.Consume(ctx, c, s.handle)
}

// Consumers are the planner-gateway's durable consumers (`planact
// provision` creates them): the plan requests.
func Consumers(d Deps) []bus.Consumer {
	return []bus.Consumer{{Stream: bus.StreamPlan, Durable: Name, Filters: []string{subject.AllPlanReq},
		Concurrency: cmp.Or(d.Concurrency, 64), AckWait: d.AckWait, MaxAckPending: schema.MaxEngineInFlight}}
}

// handle runs one planner turn, trying a transiently failing engine again
// with back-off. When the turn cannot be had (out of attempts, or refused
// for good: a 4xx from the engine, a missing trajectory) the episode must
// not hang, so the failure goes on as a plan error that the act-dispatcher
// turns into its end.
func (s *Service) handle(ctx context.Context, m bus.Msg) (rerr error) {
	var req schema.PlanRequest
	if err := m.Decode(&req); err != nil {
		return err
	}
	log := zerolog.Ctx(ctx)
	// The generation's span hangs under the turn's (the parent the request
	// named), with every attempt in it; what is published after it names
	// the turn as its parent, not this span.
	gctx, span := telemetry.StartSpan(ctx, "plan generation")
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyRollout.Int64(req.Rollout), telemetry.KeyEpisode.Int(req.Episode), telemetry.KeyTurn.Int(req.Turn),
			telemetry.KeyRole.String(schema.RolePlanner), telemetry.KeyReplica.String(s.Bus.Service().Replica()), telemetry.KeyService.String(Name))
	}
	defer span.End()
	t := &turn{key: schema.ClaimKey(req.Rollout, req.Episode, req.Turn), rollout: req.Rollout}
	defer func() { s.release(t, rerr == nil) }()
	// The rollout's end ends a wait between attempts: nothing of the turn
	// is wanted any more.
	rctx, stop := s.follow.Rollout(ctx, req.Rollout)
	defer stop()
	var err error
	attempts := 0
	for attempt := 1; ; attempt++ {
		var stale *session.StaleError
		attempts = attempt
		if err = s.plan(gctx, &req, t); err == nil || !fail.IsRetryable(err) || errors.As(err, &stale) || errors.Is(err, session.ErrNoSession) || ctx.Err() != nil {
			break
		}
		// A handler that holds the turn's output keeps it, and tries to
		// publish it, with the request in progress, until the rollout ends
		// (by its deadline at the latest), whatever did not answer and
		// however many attempts it takes: a request handed back may be
		// delivered to another instance, which would generate the turn
		// again.
		if (t.out == nil && (attempt >= s.MaxAttempts || errors.Is(err, bus.ErrNotAnswered))) || (t.out != nil && !time.Now().Before(t.until)) {
			break
		}
		wait := min(s.RetryBase<<min(attempt-1, 16), 30*time.Second)
		if d, ok := fail.RetryAfter(err); ok {
			wait = max(wait, d) // the engine said when: not before
		}
		log.Warn().Err(err).Int("attempt", attempt).Bool("generated", t.out != nil).Dur("retry_in", wait).Msg("planner turn failed; trying again")
		select {
		case <-time.After(wait):
		case <-rctx.Done():
		}
		if context.Cause(rctx) == session.ErrRolloutOver {
			log.Debug().Msg("rollout over; planner turn abandoned")
			err = nil
			break
		}
	}
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("planact.attempts", attempts))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	if err == nil || errors.Is(err, session.ErrNoSession) || ctx.Err() != nil {
		return err
	}
	if errors.Is(err, bus.ErrNotAnswered) || (t.out != nil && fail.IsRetryable(err)) {
		// planact's own streams did not answer (a NATS leader moving), or
		// took no output until the rollout's deadline: no fault of the
		// planner, so the turn does not fail; the request is handed back and
		// delivered again once they answer (to this instance, it publishes
		// the output it keeps: release).
		return err
	}
	if t.failed == nil {
		t.failed = s.failure(ctx, &req, err)
		if t.holding {
			// Failed in this instance's hands: the turn fails only while they
			// still hold it. Another instance that took it over (this one
			// answered nothing for a while) generates it; its output answers
			// the turn, and the request is handed back to wait for it. A
			// claim that could not be read hands the request back too: the
			// failure decided is kept for the redelivery (release).
			if herr := s.checkHeld(ctx, t); herr != nil {
				log.Warn().Err(err).AnErr("claim", herr).Msg("planner turn failed; its claim not confirmed, the request handed back")
				return herr
			}
		}
	} else {
		log.Info().Str("kind", t.failed.ErrorKind).Msg("planner turn failed for good before; publishing its failure again")
	}
	// Kept on t until it is out: handed back, the request's redelivery
	// publishes the same failure, and the engine is not asked again for a
	// turn decided failed.
	return publishFailure(ctx, s.Bus, t.failed)
}

// publishFailure publishes a turn's failure; a test makes it fail.
var publishFailure = func(ctx context.Context, b *bus.Bus, pe *schema.PlanError) error { return b.Publish(ctx, pe) }

// failure decides the plan error of req's turn, which err failed for good.
func (s *Service) failure(ctx context.Context, req *schema.PlanRequest, err error) *schema.PlanError {
	log := zerolog.Ctx(ctx)
	kind := schema.PlanErrPlannerRejected
	var stale *session.StaleError
	var drift *engine.DriftError
	switch {
	case errors.As(err, &stale):
		kind = schema.PlanErrStale
	case errors.As(err, &drift):
		// The engine's input was not the episode's trajectory: what it
		// generated is never trained on; the episode is quarantined.
		telemetry.TokenDrift.WithLabelValues(schema.RolePlanner).Inc()
		log.Error().Err(err).Str("kind", schema.PlanErrTokenDrift).Msg("planner turn drifted: episode quarantined")
		return &schema.PlanError{
			Rollout: req.Rollout, Episode: req.Episode, Turn: req.Turn, ErrorKind: schema.PlanErrTokenDrift,
			Message: fmt.Sprintf("turn %d: %s", req.Turn, drift.Where()),
		}
	case fail.IsRetryable(err) || errors.Is(err, engine.ErrBusy):
		// Busy past the turn's deadline (its Retry-After): the engine's
		// words say why, and nothing tried it again before it said.
		kind = schema.PlanErrPlannerUnavailable
	}
	log.Error().Err(err).Str("kind", kind).Msg("planner turn failed for good")
	return &schema.PlanError{Rollout: req.Rollout, Episode: req.Episode, Turn: req.Turn, ErrorKind: kind, Message: err.Error()}
}

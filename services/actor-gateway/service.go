// Package actorgateway is the actor-gateway service: the door to the actor
// engines. It answers generation requests on a NATS service endpoint whose
// replicas share a queue group, and bounds the generations in flight on
// each engine.
package actorgateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/telemetry"
)

// Name is the service's name on the bus (`nats micro ls`).
const Name = "actor-gateway"

// Version of the service, reported by `nats micro info`.
const Version = "0.1.0"

// QueueGroup is shared by every actor-gateway replica.
const QueueGroup = "actor-gateway"

// Error codes of the endpoint: like HTTP, 4xx means the request will never
// work, 5xx that it may work later.
const (
	CodeInvalid     = schema.ActorCodeInvalid
	CodeUnavailable = schema.ActorCodeUnavailable
	CodeTimeout     = schema.ActorCodeTimeout
	CodePaused      = schema.ActorCodePaused
	CodeStale       = schema.ActorCodeStale
	CodeBusy        = schema.ActorCodeBusy
	CodeTokenDrift  = schema.ActorCodeTokenDrift
)

// Deps are what the actor-gateway needs.
type Deps struct {
	Bus *bus.Bus
	Log zerolog.Logger
	// Engines bounds the generations in flight per actor engine.
	Engines *engine.Pool
	// MaxInFlight bounds the requests this replica handles at once; default 256.
	MaxInFlight int
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	if d.Engines == nil {
		d.Engines = &engine.Pool{}
	}
	if d.MaxInFlight == 0 {
		d.MaxInFlight = 256
	}
	// The endpoint's statistics (`nats micro stats actor-gateway`) count the
	// time of each generation, until its reply: it runs on its own
	// goroutine, so the subscription's callback returns at once.
	ep := d.Bus.Service().Endpoint("generate", schema.ActorSubject, QueueGroup, map[string]string{"schema": "actor.generate/1"})
	// The actor role's state: generations are not sent while it is paused,
	// and the gateway says when it runs none any more.
	follow := session.NewFollower(d.Bus, d.Log)
	go func() { _ = follow.Run(ctx) }()
	gate := follow.Gate(schema.RoleActor)
	if id := d.Bus.Service().ID(); id != "" {
		go follow.AnswerPauses(ctx, schema.RoleActor, id)
	}
	slots := make(chan struct{}, d.MaxInFlight)
	var wg sync.WaitGroup
	sub, err := d.Bus.NC.QueueSubscribe(schema.ActorSubject, QueueGroup, func(m *nats.Msg) {
		began := time.Now()
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			ep.Record(time.Since(began), replyError(m, CodeUnavailable, "actor-gateway shutting down"))
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			err := serve(ctx, d, follow, gate, m)
			ep.Record(time.Since(began), err)
		}()
	})
	if err != nil {
		return fmt.Errorf("actor-gateway: %w", err)
	}
	<-ctx.Done()
	_ = sub.Drain()
	wg.Wait()
	return nil
}

// serve answers one request and returns the error it answered with. While
// the actor role is paused it runs nothing: the caller is told to send the
// request again after the resume, and a pause that aborts generations
// answers those running the same way.
func serve(ctx context.Context, d Deps, follow *session.Follower, gate *session.Gate, m *nats.Msg) error {
	var req schema.ActorRequest
	if err := schema.Unmarshal(m.Data, &req); err != nil {
		return replyError(m, CodeInvalid, err.Error())
	}
	// The generation's span hangs under the act's attempt that asked for it.
	ctx, span := telemetry.StartSpan(bus.ExtractSpan(ctx, m.Header), "actor generation")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyRollout.Int64(req.Rollout), telemetry.KeyEpisode.Int(req.Episode), telemetry.KeyNode.String(req.Key),
			telemetry.KeyRole.String(schema.RoleActor), telemetry.KeyReplica.String(d.Bus.Service().Replica()), telemetry.KeyService.String(Name))
	}
	err := generate(ctx, d, follow, gate, m, &req)
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// generate runs req on its engine and answers m, as serve says.
func generate(ctx context.Context, d Deps, follow *session.Follower, gate *session.Gate, m *nats.Msg, req *schema.ActorRequest) error {
	if st := gate.State(); st.Paused {
		return replyError(m, CodePaused, fmt.Sprintf("the actor role is paused (pause %d): send it again after the resume", st.Epoch))
	}
	ctx, done := gate.Track(ctx)
	defer done()
	// A rollout that ends (cancelled, timed out, enough groups) stops its
	// generations on the engine at once.
	ctx, stop := follow.Rollout(ctx, req.Rollout)
	defer stop()
	log := d.Log.With().Int64("rollout", req.Rollout).Int("episode", req.Episode).Str("node", req.Key).Str("role", schema.RoleActor).Logger()
	if req.DeadlineMs > 0 {
		// The caller has stopped waiting by then: a generation still running
		// would only hold one of the engine's slots.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.UnixMilli(req.DeadlineMs))
		defer cancel()
	}
	gen, err := Generate(ctx, d.Engines, req, session.Newest(d.Bus, schema.RoleActor))
	if err != nil {
		code := CodeUnavailable
		var stale *session.StaleError
		var drift *engine.DriftError
		switch {
		case errors.As(err, &stale):
			code = CodeStale // refused before it ran: the act fails, saying why
		case errors.As(err, &drift):
			// The engine took another input than the act's prompt: the act
			// fails, its episode is quarantined, saying where.
			telemetry.TokenDrift.WithLabelValues(schema.RoleActor).Inc()
			log.Warn().Err(err).Msg("actor generation drifted")
			return replyError(m, CodeTokenDrift, drift.Where())
		case errors.Is(context.Cause(ctx), session.ErrPaused):
			code = CodePaused // aborted by the pause; sent again after the resume
		case context.Cause(ctx) == session.ErrRolloutOver:
			log.Info().Msg("rollout over; generation stopped")
			return replyError(m, CodeUnavailable, "rollout is over")
		case errors.Is(err, engine.ErrBusy):
			code = CodeBusy // the engine's wait ends past the act's deadline
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded:
			code = CodeTimeout
		case !fail.IsRetryable(err):
			code = CodeInvalid
		}
		log.Warn().Err(err).Str("code", code).Msg("actor generation failed")
		return replyFailure(m, code, err)
	}
	body, err := schema.Marshal(&schema.ActorReply{Generation: gen})
	if err != nil {
		return replyError(m, CodeInvalid, err.Error())
	}
	if err := m.Respond(body); err != nil {
		log.Warn().Err(err).Msg("reply")
		return err
	}
	return nil
}

// replyError answers m with an error in the NATS service protocol's
// headers (code and description, no body), and returns it.
func replyError(m *nats.Msg, code, description string) error {
	return replyFailure(m, code, errors.New(description))
}

// replyFailure is replyError with err's words, and the wait the engine
// asked for (its Retry-After), when it named one.
func replyFailure(m *nats.Msg, code string, err error) error {
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set(micro.ErrorCodeHeader, code)
	reply.Header.Set(micro.ErrorHeader, err.Error())
	if d, ok := fail.RetryAfter(err); ok {
		reply.Header.Set(schema.ActorRetryAfterHeader, strconv.FormatInt(d.Milliseconds(), 10))
	}
	_ = m.RespondMsg(reply)
	return fmt.Errorf("%s: %s", code, err.Error())
}

// Generate runs one actor generation, token-exact: the prompt is tokenized
// by the engine itself and the output ids come back as generated. With the
// request's max_staleness, the engine is asked which weights it serves
// right before it generates, and weights further behind newest (what reads
// the actor role's newest version) are refused with a *session.StaleError.
func Generate(ctx context.Context, pool *engine.Pool, req *schema.ActorRequest, newest func(context.Context) (string, error)) (schema.Generation, error) {
	if req.Prompt == "" {
		return schema.Generation{}, fail.Invalidf("actor request without a prompt")
	}
	lease, err := pool.Acquire(ctx, req.Engine.Protocol, req.Engine.URL, req.Engine.Model)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return schema.Generation{}, fail.E(fail.Transient, err)
		}
		return schema.Generation{}, err
	}
	defer lease.Release()
	ids, err := lease.Tokenize(ctx, req.Prompt)
	if err != nil {
		return schema.Generation{}, fmt.Errorf("tokenize: %w", err)
	}
	unchecked, err := session.Check(ctx, lease, newest, req.MaxStaleness)
	if err != nil {
		return schema.Generation{}, err
	}
	start := time.Now()
	s := req.Sampling
	temperature, topP := s.Values()
	r := engine.Request{InputIDs: ids, Text: req.Prompt, RoutingKey: engine.EpisodeKey(req.Rollout, req.Episode), Sampling: engine.Sampling{
		Temperature: temperature, TopP: topP, MaxNewTokens: s.MaxNewTokens, Stop: s.Stop,
		Seed: s.GenerationSeed(req.Rollout, req.Episode, req.Key),
	}}
	ectx, span := telemetry.StartSpan(ctx, "actor engine")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("planact.engine", req.Engine.URL), attribute.Int("planact.input_tokens", len(ids)))
	}
	g, err := lease.Generate(ectx, r)
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyWeightVersion.String(g.WeightVersion), attribute.Int("planact.output_tokens", len(g.OutputIDs)))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
	if err != nil {
		if errors.Is(err, engine.ErrPromptCut) {
			telemetry.Truncations.WithLabelValues(schema.RoleActor, "engine_context").Inc()
		}
		return schema.Generation{}, err
	}
	truncated := ""
	if g.FinishReason == engine.FinishLength {
		truncated = fmt.Sprintf("actor_sampling.max_new_tokens %d: the act's generation was cut there", s.MaxNewTokens)
		telemetry.Truncations.WithLabelValues(schema.RoleActor, "max_new_tokens").Inc()
	}
	ids = engine.TrajectoryIDs(r, g, ids) // a chat engine's rendering of the prompt
	telemetry.EngineSeconds.WithLabelValues(schema.RoleActor).Observe(time.Since(start).Seconds())
	return schema.Generation{
		Prompt: req.Prompt, PromptIDs: ids, Text: g.Text, OutputIDs: g.OutputIDs, LogProbs: g.LogProbs, LogProbsMissing: g.LogProbsMissing,
		FinishReason: g.FinishReason, WeightVersion: g.WeightVersion, LatencyMs: time.Since(start).Milliseconds(),
		StalenessUnchecked: unchecked, Truncated: truncated,
	}, nil
}

// Package actorgateway is the actor-gateway service: the door to the actor
// engines. It answers generation requests on a NATS service endpoint whose
// replicas share a queue group, and bounds the generations in flight on
// each engine.
package actorgateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
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
	slots := make(chan struct{}, d.MaxInFlight)
	svc, err := micro.AddService(d.Bus.NC, micro.Config{
		Name:        Name,
		Version:     Version,
		Description: "planact: generations from the actor engines",
		QueueGroup:  QueueGroup,
		Endpoint: &micro.EndpointConfig{
			Subject: schema.ActorSubject,
			Handler: micro.HandlerFunc(func(r micro.Request) {
				// micro calls handlers one at a time per endpoint; a generation
				// takes long, so each runs on its own goroutine.
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					_ = r.Error(CodeUnavailable, "actor-gateway shutting down", nil)
					return
				}
				go func() {
					defer func() { <-slots }()
					serve(ctx, d, r)
				}()
			}),
			Metadata: map[string]string{"schema": "actor.generate/1"},
		},
	})
	if err != nil {
		return fmt.Errorf("actor-gateway: %w", err)
	}
	<-ctx.Done()
	return svc.Stop()
}

func serve(ctx context.Context, d Deps, r micro.Request) {
	var req schema.ActorRequest
	if err := schema.Unmarshal(r.Data(), &req); err != nil {
		_ = r.Error(CodeInvalid, err.Error(), nil)
		return
	}
	log := d.Log.With().Int64("rollout", req.Rollout).Int("episode", req.Episode).Str("node", req.Key).Str("role", schema.RoleActor).Logger()
	if req.DeadlineMs > 0 {
		// The caller has stopped waiting by then: a generation still running
		// would only hold one of the engine's slots.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.UnixMilli(req.DeadlineMs))
		defer cancel()
	}
	gen, err := Generate(ctx, d.Engines, &req)
	if err != nil {
		code := CodeUnavailable
		switch {
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded:
			code = CodeTimeout
		case !fail.IsRetryable(err):
			code = CodeInvalid
		}
		log.Warn().Err(err).Str("code", code).Msg("actor generation failed")
		_ = r.Error(code, err.Error(), nil)
		return
	}
	body, err := schema.Marshal(&schema.ActorReply{Generation: gen})
	if err != nil {
		_ = r.Error(CodeInvalid, err.Error(), nil)
		return
	}
	if err := r.Respond(body); err != nil {
		log.Warn().Err(err).Msg("reply")
	}
}

// Generate runs one actor generation, token-exact: the prompt is tokenized
// by the engine itself and the output ids come back as generated.
func Generate(ctx context.Context, pool *engine.Pool, req *schema.ActorRequest) (schema.Generation, error) {
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
	start := time.Now()
	s := req.Sampling
	temperature, topP := s.Values()
	g, err := lease.Generate(ctx, engine.Request{InputIDs: ids, Sampling: engine.Sampling{
		Temperature: temperature, TopP: topP, MaxNewTokens: s.MaxNewTokens, Stop: s.Stop,
	}})
	if err != nil {
		return schema.Generation{}, err
	}
	telemetry.EngineSeconds.WithLabelValues(schema.RoleActor).Observe(time.Since(start).Seconds())
	return schema.Generation{
		Prompt: req.Prompt, PromptIDs: ids, Text: g.Text, OutputIDs: g.OutputIDs, LogProbs: g.LogProbs,
		FinishReason: g.FinishReason, WeightVersion: g.WeightVersion, LatencyMs: time.Since(start).Milliseconds(),
	}, nil
}

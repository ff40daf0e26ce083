package plannergateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// plan runs one planner turn. The trajectory is token-exact: turn 1
// tokenizes the rendered prompt; later turns take the previous turn's
// trajectory from the PLAN stream as it was, and only tokenize the new
// observation, with the engine's own tokenizer.
// A turn is streamed only while no partial plan of it was published: a turn
// tried again is a new generation whose nodes could differ from those an
// earlier attempt already released, and a turn's acts must all come from
// the plan it trains on.
func (s *Service) plan(ctx context.Context, req *schema.PlanRequest, t *turn) error {
	log := zerolog.Ctx(ctx)
	info, err := s.sessions.Get(ctx, req.Rollout)
	if err != nil {
		return err
	}
	if !info.Active() {
		log.Debug().Str("state", info.Session.State).Msg("rollout is over; plan request dropped")
		return nil
	}
	ctx = bus.WithTrace(ctx, info.Session.Trace)
	task, err := info.Task(req.Episode)
	if err != nil {
		return err
	}
	eng, _, err := info.Engine(schema.RolePlanner)
	if err != nil {
		return err
	}
	cfg := info.Session.Config
	prev, served, err := s.lastOutput(ctx, req)
	if err != nil || served {
		return err // served: the turn's output is there (a request asked again)
	}
	// The turn is abandoned at once when its rollout ends (cancelled, timed
	// out, enough groups): its engine request is aborted.
	ctx, stop := s.follow.Rollout(ctx, req.Rollout)
	defer stop()
	// Recorded before any engine request: this instance generates the turn
	// (or waits for the live instance that does).
	if served, err := s.claim(ctx, req, t); err != nil || served {
		if err != nil && ctx.Err() != nil {
			return s.over(ctx, err)
		}
		return err
	}
	mayStream := false
	if cfg.StreamPlans {
		if mayStream, err = s.unstreamed(ctx, req); err != nil {
			return err
		}
	}
	// Every engine request of the turn names it (engine.GenerationHeader).
	ctx = engine.WithGeneration(ctx, engine.TurnGeneration(req.Rollout, req.Episode, req.Turn))
	lease, err := s.Engines.AcquireShare(ctx, eng.Protocol, eng.URL, eng.Model, eng.MaxInFlight)
	if err != nil {
		return fail.E(fail.Transient, err)
	}
	defer lease.Release()
	// No engine work while the planner role is paused: the turn waits at
	// the gate, and the wait is no part of its time-out. Passing the gate
	// registers the turn in the same step, for all of its engine work, the
	// tokenizing included: a pause answered before that holds the turn at
	// the gate; one that comes after waits for it (or, in abort mode,
	// aborts it, and the turn goes through the gate again after the
	// resume).
	gate := s.follow.Gate(schema.RolePlanner)
	for {
		gctx, left, err := gate.Enter(ctx)
		if err != nil {
			return s.over(ctx, err)
		}
		out, err := s.onEngine(gctx, lease, req, t, task, eng, cfg, prev, mayStream, gate)
		paused := errors.Is(context.Cause(gctx), session.ErrPaused)
		left()
		if paused && ctx.Err() == nil {
			// Aborted by a pause: sent again, to the new weights, once the
			// role is resumed (and not streamed: partials went out).
			log.Info().Msg("planner turn aborted by a pause; sent to the engine again after the resume")
			t.retry, t.retryWhy = "paused", "aborted by a pause of the planner role; generated again after the resume"
			mayStream = false
			continue
		}
		if err != nil && ctx.Err() != nil {
			return s.over(ctx, err)
		}
		if err != nil {
			return err
		}
		return s.Bus.Publish(ctx, out)
	}
}

// onEngine does the turn's engine work, inside the planner role's gate
// (ctx ends with session.ErrPaused when a pause aborts it): the turn's new
// text tokenized, its generation, and returns the output to publish.
func (s *Service) onEngine(ctx context.Context, lease *engine.Lease, req *schema.PlanRequest, t *turn, task schema.Task, eng schema.Engine,
	cfg schema.Config, prev *schema.PlanOutput, mayStream bool, gate *session.Gate) (*schema.PlanOutput, error) {
	log := zerolog.Ctx(ctx)
	var segs []schema.Segment
	prompt := ""
	if prev == nil {
		// The planner's first turn (turn 1, or later in a mode whose actor
		// goes first: its request's observation follows the prompt).
		m, err := mode.For(cfg)
		if err != nil {
			return nil, fail.E(fail.Invalid, err)
		}
		prompt = m.PlannerPrompt(task, cfg)
		ids, err := lease.Tokenize(ctx, prompt)
		if err != nil {
			return nil, fmt.Errorf("tokenize prompt: %w", err)
		}
		segs = []schema.Segment{{Kind: schema.SegPrompt, Turn: req.Turn, Text: prompt, IDs: ids}}
		if req.Observation != "" {
			ids, err := lease.Tokenize(ctx, req.Observation)
			if err != nil {
				return nil, fmt.Errorf("tokenize observation: %w", err)
			}
			segs = append(segs, schema.Segment{Kind: schema.SegObservation, Turn: req.Turn, Text: req.Observation, IDs: ids})
		}
	} else {
		ids, err := lease.Tokenize(ctx, req.Observation)
		if err != nil {
			return nil, fmt.Errorf("tokenize observation: %w", err)
		}
		segs = append(slices.Clip(prev.Segments), schema.Segment{Kind: schema.SegObservation, Turn: req.Turn, Text: req.Observation, IDs: ids})
	}

	var input []int
	for _, seg := range segs {
		input = append(input, seg.IDs...)
	}
	sampling := toEngine(cfg.PlannerSampling)
	sampling.Seed = cfg.PlannerSampling.GenerationSeed(req.Rollout, req.Episode, req.Turn)
	maxNew := sampling.MaxNewTokens
	if room := cfg.MaxContextTokens - len(input); room < sampling.MaxNewTokens {
		sampling.MaxNewTokens = room
	}
	out := &schema.PlanOutput{Rollout: req.Rollout, Episode: req.Episode, Turn: req.Turn, Prompt: prompt}
	if sampling.MaxNewTokens <= 0 {
		// No room left to generate: the episode is out of context. An empty
		// turn cut off by length lets the parser and dispatcher end it as
		// truncated, through the same path as any plan cut off by length,
		// with the reason naming the limit. An observation that itself does
		// not fit is left out, and said so: the sample never holds more
		// than the context a trainer was promised.
		out.Truncated = contextFull(cfg.MaxContextTokens, req.Turn, segs)
		if len(input) > cfg.MaxContextTokens && len(segs) > 1 && segs[len(segs)-1].Kind == schema.SegObservation {
			segs = segs[:len(segs)-1]
		}
		out.Segments, out.FinishReason = segs, engine.FinishLength
		telemetry.Truncations.WithLabelValues(schema.RolePlanner, "max_context_tokens").Inc()
		log.Warn().Int("context", len(input)).Int("max", cfg.MaxContextTokens).Str("truncated", out.Truncated).Msg("context full")
		return out, nil
	}
	// Bounded staleness, checked right before every generation (one sent
	// again after a pause runs on the new weights): the engine is asked
	// which weights it serves now.
	unchecked, err := session.Check(ctx, lease, session.Newest(s.Bus, schema.RolePlanner), cfg.MaxStaleness)
	if err != nil {
		return nil, err
	}
	if t.calls > 0 {
		// Sent again (an engine failure, an abort by a pause): said first,
		// in the turn's claim.
		if err := s.recordRetry(ctx, t); err != nil {
			return nil, err
		}
	}
	t.calls++
	start := time.Now()
	r := engine.Request{InputIDs: input, Messages: messages(segs), RoutingKey: engine.EpisodeKey(req.Rollout, req.Episode), Sampling: sampling}
	ectx, span := telemetry.StartSpan(ctx, "planner engine")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attribute.String("planact.engine", eng.URL), attribute.Int("planact.input_tokens", len(input)))
	}
	ectx, cancel := context.WithTimeout(ectx, schema.Seconds(cfg.PlannerTimeoutS))
	gen, err := s.generate(ectx, lease.Client, cfg, req, r, mayStream)
	cancel()
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyWeightVersion.String(gen.WeightVersion), attribute.Int("planact.output_tokens", len(gen.OutputIDs)),
			attribute.String("planact.finish_reason", gen.FinishReason))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	if errors.Is(err, engine.ErrPromptCut) && ctx.Err() == nil {
		// The engine's context is shorter than the episode's: the episode
		// is out of context, as when max_context_tokens is reached, in the
		// engine's words. What the engine did not see whole (the new
		// observation) is left out of the trajectory.
		if len(segs) > 1 && segs[len(segs)-1].Kind == schema.SegObservation {
			segs = segs[:len(segs)-1]
		}
		out.Segments, out.FinishReason, out.Truncated = segs, engine.FinishLength, "the planner engine's context: "+err.Error()
		telemetry.Truncations.WithLabelValues(schema.RolePlanner, "engine_context").Inc()
		log.Warn().Err(err).Msg("the engine cut the prompt; context full")
		return out, nil
	}
	if err != nil {
		if ctx.Err() == nil {
			t.retry, t.retryWhy = "failed", "the engine failed: "+err.Error()
		}
		return nil, fmt.Errorf("planner generate: %w", err)
	}
	// A chat engine rendered the newest segment with its template: those are its ids.
	segs[len(segs)-1].IDs = engine.TrajectoryIDs(r, gen, segs[len(segs)-1].IDs)
	// The version of the weights that generated the turn: what the engine
	// reports wins (it generated it); else the role's version as its trainer
	// last announced it (a resume, an arrival), else the arrival's.
	out.Text, out.FinishReason, out.WeightVersion = gen.Text, gen.FinishReason, gen.WeightVersion
	if out.WeightVersion == "" {
		out.WeightVersion = cmp.Or(gate.State().WeightVersion, req.WeightVersion)
	}
	if gen.FinishReason == engine.FinishLength {
		// Cut short: the reason names the limit it reached.
		limit := "max_new_tokens"
		out.Truncated = fmt.Sprintf("planner_sampling.max_new_tokens %d: turn %d was cut there", maxNew, req.Turn)
		if sampling.MaxNewTokens < maxNew {
			limit = "max_context_tokens"
			out.Truncated = fmt.Sprintf("max_context_tokens %d: turn %d had room for %d tokens (planner_sampling.max_new_tokens %d) and was cut there",
				cfg.MaxContextTokens, req.Turn, sampling.MaxNewTokens, maxNew)
		}
		telemetry.Truncations.WithLabelValues(schema.RolePlanner, limit).Inc()
	}
	out.LatencyMs = time.Since(start).Milliseconds()
	telemetry.EngineSeconds.WithLabelValues(schema.RolePlanner).Observe(time.Since(start).Seconds())
	out.Segments = append(segs, schema.Segment{
		Kind: schema.SegGenerated, Turn: req.Turn, Text: gen.Text, Version: out.WeightVersion,
		IDs: gen.OutputIDs, LogProbs: gen.LogProbs, LogProbsMissing: gen.LogProbsMissing, StalenessUnchecked: unchecked,
	})
	log.Debug().Int("tokens", len(gen.OutputIDs)).Str("finish", gen.FinishReason).Msg("planner turn")
	return out, nil
}

// contextFull says why a turn of an episode whose trajectory is segs has
// no room to generate in max tokens: the limit, and what did not fit.
func contextFull(max, turn int, segs []schema.Segment) string {
	n := 0
	for _, seg := range segs {
		n += len(seg.IDs)
	}
	last := segs[len(segs)-1]
	switch {
	case len(segs) == 1 && n > max:
		return fmt.Sprintf("the prompt is %d tokens, more than max_context_tokens %d: nothing was generated", n, max)
	case len(segs) == 1:
		return fmt.Sprintf("the prompt is %d tokens, all of max_context_tokens %d: nothing was generated", n, max)
	case n > max && last.Kind == schema.SegObservation:
		return fmt.Sprintf("max_context_tokens %d: the trajectory holds %d tokens before turn %d, and its observation (%d tokens) does not fit: it is left out, and nothing more was generated",
			max, n-len(last.IDs), turn, len(last.IDs))
	default:
		return fmt.Sprintf("max_context_tokens %d: the trajectory holds %d tokens before turn %d: no room to generate", max, n, turn)
	}
}

// over says what a turn that could not go on returns: nothing when its
// rollout ended (the request is dropped), else err (a pause that expired:
// permanent; shutting down: the request is redelivered).
func (s *Service) over(ctx context.Context, err error) error {
	if context.Cause(ctx) == session.ErrRolloutOver {
		zerolog.Ctx(ctx).Debug().Msg("rollout over; planner turn abandoned")
		return nil
	}
	return err
}

// generate runs the planner engine. When the rollout streams plans and the
// engine can stream, the text so far is published as a PlanPartial each time
// it gains a complete node, so that acts start before the plan is finished.
func (s *Service) generate(ctx context.Context, c engine.Client, cfg schema.Config, req *schema.PlanRequest, r engine.Request, mayStream bool) (engine.Generation, error) {
	st, ok := c.(engine.Streamer)
	if !cfg.StreamPlans || !ok || !mayStream {
		return c.Generate(ctx, r)
	}
	p := &partials{ctx: ctx, bus: s.Bus, cfg: cfg, req: req}
	return st.GenerateStream(ctx, r, p.chunk)
}

// partials publishes the plan so far of one streamed planner turn.
type partials struct {
	ctx   context.Context
	bus   *bus.Bus
	cfg   schema.Config
	req   *schema.PlanRequest
	end   int // length of the text last parsed
	nodes int // complete nodes in the last partial published
	seq   int
}

// chunk sees the text generated so far. Nodes end at a newline, a closing
// tag or a closing brace (whatever the format), so the text is parsed only
// up to the last of those, and only when that end has moved: the node being
// written is never taken for a complete one, and most chunks cost nothing.
func (p *partials) chunk(text string) {
	end := strings.LastIndexAny(text, "\n>}") + 1
	if end <= p.end {
		return
	}
	p.end = end
	res, err := plan.Parse(text[:end], p.cfg.ParseOptions())
	if err != nil || res.Plan == nil {
		return
	}
	nodes := len(p.cfg.PartialNodes(res.Plan.Nodes))
	if nodes <= p.nodes {
		return
	}
	p.nodes, p.seq = nodes, p.seq+1
	msg := &schema.PlanPartial{Rollout: p.req.Rollout, Episode: p.req.Episode, Turn: p.req.Turn, Seq: p.seq, Text: text[:end]}
	if err := p.bus.Publish(p.ctx, msg); err != nil {
		// Partials only start acts early; the final output still decides.
		zerolog.Ctx(p.ctx).Warn().Err(err).Int("seq", p.seq).Msg("partial plan not published")
	}
}

// lastOutput fetches the episode's last planner output, which must be the
// turn before req's (none for the mode's first planner turn). served is true when req's turn is
// already answered: a request asked again (redelivered, re-issued).
func (s *Service) lastOutput(ctx context.Context, req *schema.PlanRequest) (prev *schema.PlanOutput, served bool, err error) {
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(req.Rollout, req.Episode))
	if err != nil {
		return nil, false, err
	}
	if m != nil {
		prev = &schema.PlanOutput{}
		if err := schema.Unmarshal(m.Data, prev); err != nil {
			return nil, false, err
		}
	}
	switch {
	case prev != nil && prev.Turn >= req.Turn:
		return nil, true, nil
	case req.Turn <= 1:
		return nil, false, nil
	case prev == nil:
		// A later first turn, in a mode whose actor goes first?
		first, err := s.firstTurn(ctx, req.Rollout)
		if err != nil || req.Turn <= first {
			return nil, false, err
		}
		return nil, false, fail.Permanentf("turn %d: episode has no earlier planner output", req.Turn)
	case prev.Turn != req.Turn-1:
		return nil, false, fail.Permanentf("turn %d: last planner output is of turn %d", req.Turn, prev.Turn)
	}
	return prev, false, nil
}

// firstTurn is the turn of the planner's first request in rollout n's
// mode: 1, or later when the actor goes first.
func (s *Service) firstTurn(ctx context.Context, n int64) (int, error) {
	info, err := s.sessions.Get(ctx, n)
	if err != nil {
		return 0, err
	}
	m, err := mode.For(info.Session.Config)
	if err != nil {
		return 0, fail.E(fail.Invalid, err)
	}
	return m.FirstPlannerTurn(), nil
}

// unstreamed reports whether no partial plan of req's turn was published.
func (s *Service) unstreamed(ctx context.Context, req *schema.PlanRequest) (bool, error) {
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanPartial(req.Rollout, req.Episode))
	if err != nil || m == nil {
		return m == nil, err
	}
	var pp schema.PlanPartial
	if err := schema.Unmarshal(m.Data, &pp); err != nil {
		return false, err
	}
	return pp.Turn < req.Turn, nil
}

// messages are the episode's segments as a conversation, for chat engines:
// the prompt and the observations are the user's turns, generations the
// assistant's.
func messages(segs []schema.Segment) []engine.Message {
	msgs := make([]engine.Message, len(segs))
	for i, seg := range segs {
		role := engine.RoleUser
		if seg.Kind == schema.SegGenerated {
			role = engine.RoleAssistant
		}
		msgs[i] = engine.Message{Role: role, Text: seg.Text, IDs: seg.IDs}
	}
	return msgs
}

func toEngine(s schema.Sampling) engine.Sampling {
	temperature, topP := s.Values()
	return engine.Sampling{Temperature: temperature, TopP: topP, MaxNewTokens: s.MaxNewTokens, Stop: s.Stop}
}

package plannergateway

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// plan runs one planner turn. The trajectory is token-exact: turn 1
// tokenizes the rendered prompt; later turns take the previous turn's
// trajectory from the PLAN stream as it was, and only tokenize the new
// observation, with the engine's own tokenizer.
// Only a first delivery streams partial plans: a retried turn is a new
// generation whose nodes could differ from those a failed attempt already
// released, and a turn's acts must all come from the plan it trains on.
func (s *Service) plan(ctx context.Context, req *schema.PlanRequest, mayStream bool) error {
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
	lease, err := s.Engines.Acquire(ctx, eng.Protocol, eng.URL, eng.Model)
	if err != nil {
		return fail.E(fail.Transient, err)
	}
	defer lease.Release()

	var segs []schema.Segment
	prompt := ""
	if req.Turn <= 1 {
		prompt = RenderPrompt(task, cfg)
		ids, err := lease.Tokenize(ctx, prompt)
		if err != nil {
			return fmt.Errorf("tokenize prompt: %w", err)
		}
		segs = []schema.Segment{{Kind: schema.SegPrompt, Turn: 1, Text: prompt, IDs: ids}}
	} else {
		prev, err := s.previousTurn(ctx, req)
		if err != nil || prev == nil {
			return err
		}
		ids, err := lease.Tokenize(ctx, req.Observation)
		if err != nil {
			return fmt.Errorf("tokenize observation: %w", err)
		}
		segs = append(prev.Segments, schema.Segment{Kind: schema.SegObservation, Turn: req.Turn, Text: req.Observation, IDs: ids})
	}

	var input []int
	for _, seg := range segs {
		input = append(input, seg.IDs...)
	}
	sampling := toEngine(cfg.PlannerSampling)
	if room := cfg.MaxContextTokens - len(input); room < sampling.MaxNewTokens {
		sampling.MaxNewTokens = room
	}
	out := &schema.PlanOutput{Rollout: req.Rollout, Episode: req.Episode, Turn: req.Turn, Prompt: prompt}
	if sampling.MaxNewTokens <= 0 {
		// No room left to generate: the episode is out of context. An empty
		// turn cut off by length lets the parser and dispatcher end it as
		// truncated, through the same path as any plan cut off by length.
		out.Segments, out.FinishReason = segs, engine.FinishLength
		log.Warn().Int("context", len(input)).Int("max", cfg.MaxContextTokens).Msg("context full")
		return s.Bus.Publish(ctx, out)
	}
	start := time.Now()
	gen, err := s.generate(ctx, lease.Client, cfg, req, engine.Request{InputIDs: input, Sampling: sampling}, mayStream)
	if err != nil {
		return fmt.Errorf("planner generate: %w", err)
	}
	out.Text, out.FinishReason, out.WeightVersion = gen.Text, gen.FinishReason, gen.WeightVersion
	if out.WeightVersion == "" {
		out.WeightVersion = req.WeightVersion
	}
	out.LatencyMs = time.Since(start).Milliseconds()
	telemetry.EngineSeconds.WithLabelValues(schema.RolePlanner).Observe(time.Since(start).Seconds())
	out.Segments = append(segs, schema.Segment{
		Kind: schema.SegGenerated, Turn: req.Turn, Text: gen.Text, Version: out.WeightVersion,
		IDs: gen.OutputIDs, LogProbs: gen.LogProbs,
	})
	log.Debug().Int("tokens", len(gen.OutputIDs)).Str("finish", gen.FinishReason).Msg("planner turn")
	return s.Bus.Publish(ctx, out)
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

// previousTurn fetches the episode's last planner output, which must be
// the turn before req. nil, nil means req was already served (a redelivery).
func (s *Service) previousTurn(ctx context.Context, req *schema.PlanRequest) (*schema.PlanOutput, error) {
	data, found, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(req.Rollout, req.Episode))
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fail.Permanentf("turn %d: episode has no earlier planner output", req.Turn)
	}
	var prev schema.PlanOutput
	if err := schema.Unmarshal(data, &prev); err != nil {
		return nil, err
	}
	switch {
	case prev.Turn == req.Turn:
		return nil, nil
	case prev.Turn != req.Turn-1:
		return nil, fail.Permanentf("turn %d: last planner output is of turn %d", req.Turn, prev.Turn)
	}
	return &prev, nil
}

func toEngine(s schema.Sampling) engine.Sampling {
	temperature, topP := s.Values()
	return engine.Sampling{Temperature: temperature, TopP: topP, MaxNewTokens: s.MaxNewTokens, Stop: s.Stop}
}

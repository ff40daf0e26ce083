package plannergateway

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// plan runs one planner turn. The trajectory is token-exact: turn 1
// tokenizes the rendered prompt; later turns take the previous turn's
// trajectory from the PLAN stream as it was, and only tokenize the new
// observation, with the engine's own tokenizer.
func (s *Service) plan(ctx context.Context, req *schema.PlanRequest) error {
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
	gen, err := lease.Generate(ctx, engine.Request{InputIDs: input, Sampling: sampling})
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

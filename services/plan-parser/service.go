// Package planparser is the plan-parser service: it parses every planner
// output into a validated DAG, a final answer, or a precise error, and
// publishes which one it found. The parsing itself is pkg/plan.
package planparser

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// Name is the service's name on the bus.
const Name = "plan-parser"

// Deps are what the plan-parser needs.
type Deps struct {
	Bus         *bus.Bus
	Log         zerolog.Logger
	Concurrency int // default 32
}

// Service is a running plan-parser.
type Service struct {
	Deps
	sessions *session.Cache
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	if d.Concurrency == 0 {
		d.Concurrency = 32
	}
	s := &Service{Deps: d, sessions: session.NewCache(d.Bus)}
	return d.Bus.Consume(ctx, Consumers(d)[0], s.handle)
}

// Consumers are the plan-parser's durable consumers (`planact provision`
// creates them): the planner's outputs and partial plans.
func Consumers(d Deps) []bus.Consumer {
	return []bus.Consumer{{Stream: bus.StreamPlan, Durable: Name, Filters: []string{subject.AllPlanOut, subject.AllPlanPart}, Concurrency: cmp.Or(d.Concurrency, 32)}}
}

func (s *Service) handle(ctx context.Context, m bus.Msg) error {
	p, err := subject.Parse(m.Subject)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	if p.Verb == "partial" {
		return s.handlePartial(ctx, m)
	}
	// The parser reads the output's text, not the episode's trajectory the
	// message also carries (thousands of token ids): those are skipped.
	var head struct {
		schema.Envelope
		Rollout      int64  `json:"rollout"`
		Episode      int    `json:"episode"`
		Turn         int    `json:"turn"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Truncated    string `json:"truncated"`
	}
	if err := schema.UnmarshalPart(m.Data, &schema.PlanOutput{}, &head); err != nil {
		return fmt.Errorf("%s: %w", m.Subject, err)
	}
	out := schema.PlanOutput{Rollout: head.Rollout, Episode: head.Episode, Turn: head.Turn, Text: head.Text, FinishReason: head.FinishReason, Truncated: head.Truncated}
	info, err := s.sessions.Get(ctx, out.Rollout)
	if err != nil {
		return err
	}
	if !info.Active() {
		return nil
	}
	ctx = bus.WithTrace(ctx, info.Session.Trace)
	md, err := mode.For(info.Session.Config)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	observation := ""
	if md.ParseNeedsObservation(info.Session.Config) {
		// Only a mode that reads what the planner answered pays for the
		// trajectory.
		var full schema.PlanOutput
		if err := m.Decode(&full); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		observation = mode.Observed(md, full.Segments)
	}
	pctx, span := s.startParse(ctx, out.Rollout, out.Episode, out.Turn, false)
	msg, err := md.Parse(pctx, &out, observation, info.Session.Config)
	endParse(span, msg)
	if err != nil {
		return err // stopping: the output is parsed again when redelivered
	}
	if pe, ok := msg.(*schema.PlanError); ok {
		zerolog.Ctx(ctx).Info().Str("kind", pe.ErrorKind).Str("error", pe.Message).Msg("plan rejected")
	}
	return s.Bus.Publish(ctx, msg)
}

// startParse starts the span of one parse, under the turn's span (the
// parent the planner output named).
func (s *Service) startParse(ctx context.Context, n int64, e, turn int, partial bool) (context.Context, trace.Span) {
	ctx, span := telemetry.StartSpan(ctx, "plan parsing")
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyRollout.Int64(n), telemetry.KeyEpisode.Int(e), telemetry.KeyTurn.Int(turn),
			attribute.Bool("planact.partial", partial), telemetry.KeyReplica.String(s.Bus.Service().Replica()), telemetry.KeyService.String(Name))
	}
	return ctx, span
}

// endParse ends a parse's span with what the parse found.
func endParse(span trace.Span, msg schema.Message) {
	if span.IsRecording() {
		switch m := msg.(type) {
		case *schema.PlanDAG:
			span.SetAttributes(attribute.String("planact.outcome", "plan"), attribute.Int("planact.nodes", len(m.Plan.Nodes)))
		case *schema.PlanAnswer:
			span.SetAttributes(attribute.String("planact.outcome", "answer"))
		case *schema.PlanError:
			span.SetAttributes(attribute.String("planact.outcome", "error"), attribute.String("planact.error_kind", m.ErrorKind))
		}
	}
	span.End()
}

// handlePartial parses the plan so far of a streamed turn, and publishes
// its complete nodes as a partial DAG.
func (s *Service) handlePartial(ctx context.Context, m bus.Msg) error {
	var pp schema.PlanPartial
	if err := m.Decode(&pp); err != nil {
		return err
	}
	info, err := s.sessions.Get(ctx, pp.Rollout)
	if err != nil {
		return err
	}
	if !info.Active() {
		return nil
	}
	ctx = bus.WithTrace(ctx, info.Session.Trace)
	pctx, span := s.startParse(ctx, pp.Rollout, pp.Episode, pp.Turn, true)
	d, err := parsePartial(pctx, &pp, info.Session.Config)
	if d != nil {
		endParse(span, d)
	} else {
		span.End()
	}
	if err != nil {
		return err
	}
	if d == nil {
		return nil
	}
	return s.Bus.Publish(ctx, d)
}

// ParsePartial turns the plan so far of a streamed turn into a partial
// DAG of its complete nodes, or nil when it holds none yet. Errors and
// answers are left to the turn's final output, which decides.
// Only the complete nodes are kept (schema.Config.PartialNodes).
func ParsePartial(pp *schema.PlanPartial, cfg schema.Config) *schema.PlanDAG {
	d, _ := parsePartial(context.Background(), pp, cfg)
	return d
}

// waitingTool is the tool of a partial plan's nodes that name none: not a
// tool name a config allows, so schema.Config.PartialNodes leaves them out.
const waitingTool = "(waiting for its call)"

// parsePartial is ParsePartial that stops when ctx ends, with its error.
func parsePartial(ctx context.Context, pp *schema.PlanPartial, cfg schema.Config) (*schema.PlanDAG, error) {
	if cfg.Mode != "" && cfg.Mode != schema.ModePlanAct {
		// Only plan_act's planner output is a plan whose nodes may run as
		// they are (schema.Config.Validate refuses stream_plans for the
		// others): a review or a plan to be made into candidates is not.
		return nil, nil
	}
	opts := cfg.ParseOptions()
	opts.Partial = true // tasks may still wait for their calls
	// A task waiting for its call has the default tool until the call
	// comes; one that no tool can be named keeps such a task from being
	// released when the rollout has a tool named like the default.
	opts.DefaultTool = waitingTool
	res, err := plan.ParseContext(ctx, pp.Text, opts)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, err
	}
	if err != nil || res.Plan == nil {
		return nil, nil
	}
	p := *res.Plan
	if p.Nodes = cfg.PartialNodes(p.Nodes); len(p.Nodes) == 0 {
		return nil, nil
	}
	return &schema.PlanDAG{Rollout: pp.Rollout, Episode: pp.Episode, Turn: pp.Turn, Plan: p, Partial: true, Seq: pp.Seq}, nil
}

// Parse turns one planner output into the message the rest of planact acts
// on: a *schema.PlanDAG, *schema.PlanAnswer or *schema.PlanError.
func Parse(out *schema.PlanOutput, cfg schema.Config) schema.Message {
	msg, _ := ParseContext(context.Background(), out, cfg)
	return msg
}

// ParseContext is Parse that stops when ctx ends: then it returns ctx's
// error (wrapped) and no message, for the output to be parsed again. The
// rollout's mode parses (pkg/mode); out's trajectory gives it the
// observation it answered.
func ParseContext(ctx context.Context, out *schema.PlanOutput, cfg schema.Config) (schema.Message, error) {
	m, err := mode.For(cfg)
	if err != nil {
		return nil, fail.E(fail.Invalid, err)
	}
	return m.Parse(ctx, out, mode.Observed(m, out.Segments), cfg)
}

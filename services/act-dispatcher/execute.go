package actdispatcher

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/redirect"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
	gotool "github.com/planact/planact/pkg/tool"
)

// outcome returns the act's outcome if one was published, read from the
// ACT stream's leader.
func (s *Service) outcome(ctx context.Context, n int64, e int, key string) (*schema.ActDone, error) {
	m, err := s.Bus.LastMsg(ctx, bus.StreamAct, subject.ActDone(n, e, key))
	if err != nil || m == nil {
		return nil, err
	}
	var d schema.ActDone
	if err := schema.Unmarshal(m.Data, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// execute runs the act with its retries and returns its outcome, or nil
// when the rollout ended meanwhile (the act is abandoned). ctx is the
// turn's: it ends when the rollout does (cancel, time-out, enough groups).
func (s *Service) execute(ctx context.Context, info *session.Info, run *act) (*schema.ActDone, error) {
	log := zerolog.Ctx(ctx)
	cfg := info.Session.Config
	began := s.clock()
	done := &schema.ActDone{
		Rollout: run.Rollout, Episode: run.Episode, Turn: run.Turn, Key: run.Key,
		NodeID: run.Node.ID, Tool: run.Node.Tool, Input: run.Node.Input(), ReleasedMs: run.ReleasedMs, StartedMs: began.UnixMilli(),
		Replica: s.replica(),
	}
	// The act's span hangs under its turn's (the parent its plan message
	// named); each attempt is a span under it, and the actor-gateway's
	// generation one under the attempt.
	ctx, span := telemetry.StartSpan(ctx, "act")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyRollout.Int64(run.Rollout), telemetry.KeyEpisode.Int(run.Episode), telemetry.KeyTurn.Int(run.Turn),
			telemetry.KeyNode.String(run.Key), telemetry.KeyRole.String(schema.RoleActor), attribute.String("planact.tool", run.Node.Tool),
			telemetry.KeyReplica.String(s.replicaName()), telemetry.KeyService.String(Name))
	}
	var unavailableSince time.Time
	// held is the time the act spent held rather than tried: waiting for
	// the actor role's resume, sent again after a pause stopped or refused
	// it, waiting for an actor-gateway to run at all. None of it is an
	// attempt or a back-off, so none of it is spent of the act's budget
	// (waitFits): before, an act held by a weight swap's pause for longer
	// than its budget failed at once when the engine asked for a short
	// wait after the resume, "past the act's deadline".
	var held time.Duration
	// superseded: a gateway refused the act's retry because another run's
	// outcome stands (runAct reads it). This run's outcome is no act's:
	// the metrics of acts count the one that stands, counted by its run.
	superseded := false
	md, err := mode.For(cfg)
	if err != nil {
		return nil, fail.E(fail.Invalid, err)
	}
	tool, _ := md.Tool(cfg, run.Node.Tool)
	gate := s.follow.Gate(schema.RoleActor)
	for attempt := 1; ; {
		done.Attempts = attempt
		if tool.Kind == schema.ToolActor {
			// No generation while the actor role is paused: the act waits,
			// and the wait is no attempt and no part of its time-out.
			from := s.clock()
			err := gate.Wait(ctx)
			held += s.clock().Sub(from)
			if err != nil {
				if ctx.Err() == nil {
					done.Status, done.Error, done.ErrorKind = schema.ActFailed, err.Error(), schema.ActErrPaused
					break
				}
				if context.Cause(ctx) == errRolloutOver {
					return nil, nil
				}
				return nil, ctx.Err()
			}
		}
		tried := s.clock()
		actx, cancel := context.WithTimeout(ctx, schema.Seconds(cfg.ActTimeoutS))
		actx, attemptSpan := telemetry.StartSpan(actx, "act attempt")
		out, gen, err := s.try(actx, info, run)
		endAttempt(attemptSpan, attempt, gen, err)
		cancel()
		if !errors.Is(err, errNoActorGateway) {
			// The patience counts attempts in a row that found no
			// gateway: an outage after one was reached waits as long.
			unavailableSince = time.Time{}
		}
		if drift := (*tokenDrift)(nil); errors.As(err, &drift) {
			// The engine took another input than the act's prompt: never
			// tried again (it would drift again), and its episode is
			// quarantined when the turn ends (finishTurn).
			done.Status, done.Error, done.ErrorKind = schema.ActFailed, drift.where, schema.ActErrTokenDrift
			break
		}
		if stale := (*session.StaleError)(nil); errors.As(err, &stale) {
			// Bounded staleness: the actor-gateway asked the engine right
			// before it would have generated, and its weights were too old.
			done.Status, done.Error, done.ErrorKind = schema.ActFailed, err.Error(), schema.ActErrStale
			break
		}
		if errors.Is(err, errActorPaused) && ctx.Err() == nil {
			// Stopped or refused by a pause: sent again once it is resumed.
			// The gate may not have seen the pause yet: a little wait.
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
			held += s.clock().Sub(tried)
			continue
		}
		if err == nil {
			done.Status, done.Output, done.Generation, done.Error, done.ErrorKind = schema.ActDoneOK, out, gen, "", ""
			break
		}
		if errors.Is(err, errActHasOutcome) {
			done.Status, done.Error, done.ErrorKind = schema.ActFailed, err.Error(), schema.ActErrInvalid
			superseded = true
			break
		}
		kind := schema.ActErrTransient
		if !fail.IsRetryable(err) && !errors.Is(err, errEngineBusy) {
			kind = schema.ActErrInvalid
		}
		if (actx.Err() == context.DeadlineExceeded || errors.Is(err, errActorTimedOut)) && ctx.Err() == nil {
			err, kind = fail.Transientf("act timed out after %gs", cfg.ActTimeoutS), schema.ActErrTimeout
		}
		if context.Cause(ctx) == errRolloutOver {
			log.Info().Int("attempt", attempt).Msg("rollout over; act abandoned")
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err() // shutting down: another replica takes over
		}
		wait := backoff(s.RetryBase, attempt)
		retryKind := kind // what the next attempt, if any, tries again after
		waiting := false  // for a gateway: this try and its wait are held
		switch {
		case errors.Is(err, errNoActorGateway):
			// Not the act's failure (planact is starting, say): it waits
			// for a gateway without using its attempts, for a while.
			if unavailableSince.IsZero() {
				unavailableSince = patienceClock()
			}
			if now := patienceClock(); now.Sub(unavailableSince) < s.UnavailablePatience {
				log.Warn().Msg("no actor-gateway is running; act postponed")
				postponed(run.Key, now)
				wait = min(wait, time.Second)
				retryKind, waiting = schema.ActErrUnavailable, true
				break
			}
			done.Status, done.Error, done.ErrorKind = schema.ActFailed, err.Error(), schema.ActErrUnavailable
		default:
			done.Status, done.Error, done.ErrorKind = schema.ActFailed, err.Error(), kind
			attempt++
		}
		if done.ErrorKind == schema.ActErrUnavailable || !fail.IsRetryable(err) || attempt > max(cfg.ActRetries, 0)+1 {
			break
		}
		if d, ok := fail.RetryAfter(err); ok {
			// The engine said when it may be asked again: not before. A
			// wait that leaves no time for the attempts the act has left
			// (past the act's deadline, as the watchdog counts it: its
			// attempts and back-offs, not the time it was held) fails the
			// act now, in the engine's words.
			if !s.waitFits(cfg, s.clock().Sub(began)-held, attempt, d) {
				done.Error = fmt.Sprintf("%s (the engine asked to be tried again in %v: past the act's deadline, act_timeout_s %g for each attempt left)", done.Error, d, cfg.ActTimeoutS)
				break
			}
			wait = max(wait, d)
		}
		telemetry.ActRetries.WithLabelValues(retryKind).Inc()
		log.Debug().Err(err).Int("attempt", attempt).Dur("retry_in", wait).Msg("act failed, retrying")
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			if context.Cause(ctx) == errRolloutOver {
				log.Info().Int("attempt", attempt).Msg("rollout over; act not retried")
				return nil, nil
			}
			return nil, ctx.Err()
		}
		if waiting {
			held += s.clock().Sub(tried)
		}
		if s.overBetween(ctx, info) {
			log.Info().Msg("rollout over; act not retried")
			return nil, nil
		}
	}
	done.EndedMs, done.Retries = nowMs(), run.retries
	if superseded {
		log.Info().Str("error", done.Error).Int("attempts", done.Attempts).Msg("act not generated again: another run's outcome stands")
	} else {
		telemetry.Acts.WithLabelValues(done.Status).Inc()
		telemetry.ActSeconds.WithLabelValues(done.Status).Observe(s.clock().Sub(began).Seconds())
		if done.Status == schema.ActFailed {
			telemetry.ActFailures.WithLabelValues(done.ErrorKind).Inc()
			log.Warn().Str("error", done.Error).Int("attempts", done.Attempts).Msg("act failed")
		}
	}
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyStatus.String(done.Status), attribute.Int("planact.attempts", done.Attempts))
		if done.Generation != nil {
			span.SetAttributes(telemetry.KeyWeightVersion.String(done.Generation.WeightVersion))
		}
		if done.Status == schema.ActFailed {
			span.SetAttributes(attribute.String("planact.error_kind", done.ErrorKind))
			span.SetStatus(codes.Error, done.Error)
		}
	}
	return done, nil
}

// overBetween says whether the rollout of info is over, asked between two
// attempts of one of its acts: the act is then abandoned, with no outcome.
// The cached session only says when to ask the leader (rolloutOver): it
// may be another rollout's of the number, ended, while this one runs (the
// number used again). A cached running session of this rollout, or a read
// that fails, abandons nothing; the rollout's end cancels the act anyway.
func (s *Service) overBetween(ctx context.Context, info *session.Info) bool {
	cached, err := s.sessions.Get(ctx, info.Session.Rollout)
	if err != nil || cached.Active() && cached.Session.CreatedMs == info.Session.CreatedMs {
		return false
	}
	over, _, err := s.rolloutOver(ctx, info)
	if err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("the rollout's session cannot be read from the leader; the act is tried again")
		return false
	}
	return over
}

// publishActOutcome publishes done as its act's outcome unless the act has
// one: stored is false when another runner's came first. The retries the
// actor-gateways recorded of the act (schema.ActRetries: each before its
// engine was called, by whichever runner's request) are merged into done
// first, by compare-and-set on the act's last message, so that the
// outcome that counts carries every generation of the act that reached an
// engine: one runner's retries were lost once with its outcome, refused
// as a second, while the first said none (the chaos ledger's count of
// engine calls found it).
func publishActOutcome(ctx context.Context, b *bus.Bus, done *schema.ActDone) (stored bool, err error) {
	filter := subject.ActOf(done.Rollout, done.Episode, done.Key)
	own := done.Retries
	var after uint64
	for {
		stored, dup, err := b.PublishAfter(ctx, done, filter, after)
		if err != nil || stored {
			return stored && !dup, err
		}
		last, err := b.LastMsg(ctx, bus.StreamAct, filter)
		if err != nil {
			return false, err
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if last == nil {
			after = 0 // refused while another write was under way: again
			continue
		}
		if last.Subject == done.Subject() {
			return false, nil
		}
		var rec schema.ActRetries
		if err := last.Decode(&rec); err != nil {
			// A record that cannot be read (another version wrote it, or
			// something that may write there should not have) still says
			// a retry was recorded: the outcome says so, and is published
			// after it, rather than never.
			zerolog.Ctx(ctx).Error().Err(err).Str("subject", last.Subject).Uint64("seq", last.Seq).Msg("the retries recorded of an act cannot be read")
			rec.Retries = []schema.Retry{{By: "unknown", Why: fmt.Sprintf("a retry was recorded (%s, sequence %d), but its record cannot be read: %v", last.Subject, last.Seq, err), AtMs: last.Time.UnixMilli()}}
		}
		done.Retries, after = mergeRetries(rec.Retries, own), last.Seq
	}
}

// mergeRetries returns the retries recorded of an act with those of own
// (the runner's) that are not among them, oldest first.
func mergeRetries(recorded, own []schema.Retry) []schema.Retry {
	out := slices.Clone(recorded)
	left := slices.Clone(recorded)
	for _, r := range own {
		if i := slices.Index(left, r); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b schema.Retry) int { return cmp.Compare(a.AtMs, b.AtMs) })
	return out
}

// endAttempt ends the span of one attempt of an act with how it went.
func endAttempt(span trace.Span, attempt int, gen *schema.Generation, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("planact.attempt", attempt))
		if gen != nil {
			span.SetAttributes(telemetry.KeyWeightVersion.String(gen.WeightVersion))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// errActorTimedOut: the actor-gateway stopped the generation at the act's
// deadline, just before the act would have timed out here.
var errActorTimedOut = fail.Transientf("the generation reached the act's deadline")

// errActorPaused: the actor-gateway did not run the generation (or stopped
// it) because the actor role is paused.
var errActorPaused = fail.Transientf("the actor role is paused")

// errActHasOutcome: an actor-gateway did not generate a retry of the act,
// whose outcome another runner published first.
var errActHasOutcome = errors.New("the act has an outcome already")

// errNoActorGateway: nothing answers on the actor-gateway's endpoint.
var errNoActorGateway = fail.Transientf("no actor-gateway is running")

// errEngineBusy: the actor engine asked to be tried again (its
// Retry-After) only after the act's deadline. The act fails in the
// engine's words, an error of the engine (not of the act's input), and is
// not tried again before the engine said.
var errEngineBusy = errors.New("the actor engine is busy past the act's deadline")

// backoff is base·2^(attempt-1), with ±50% jitter, capped at 30s.
func backoff(base time.Duration, attempt int) time.Duration {
	d := base << min(attempt-1, 16)
	d = min(d, 30*time.Second)
	return d/2 + time.Duration(rand.Int64N(int64(d)+1))
}

// try runs the node's tool once.
func (s *Service) try(ctx context.Context, info *session.Info, run *act) (string, *schema.Generation, error) {
	cfg := info.Session.Config
	md, err := mode.For(cfg)
	if err != nil {
		return "", nil, fail.E(fail.Invalid, err)
	}
	tool, ok := md.Tool(cfg, run.Node.Tool)
	if !ok {
		return "", nil, fail.Permanentf("unknown tool %q", run.Node.Tool)
	}
	input := run.Node.Input()
	if input == "" {
		return "", nil, fail.Permanentf("invalid arguments: %s has no input", run.Node.ID)
	}
	switch tool.Kind {
	case schema.ToolHTTP:
		out, err := s.callHTTP(ctx, tool, input)
		return out, nil, err
	case schema.ToolGo:
		// A Go function this process registered (pkg/tool).
		fn, ok := gotool.Lookup(tool.Name)
		if !ok {
			return "", nil, fail.Permanentf("tool %q is of kind go, and this act-dispatcher's program registered no such tool (tool.Register in its main; it has %v)", tool.Name, gotool.Registered())
		}
		out, err := s.callGo(ctx, tool.Name, fn, input)
		return out, nil, err
	case mode.KindLocal:
		// The mode runs it (ensemble's vote): no engine, no generation.
		out, err := md.RunLocal(tool, mode.Node{ID: run.Node.ID, Tool: run.Node.Tool, Args: run.Node.Args})
		if err != nil {
			return "", nil, fail.E(fail.Permanent, err)
		}
		return out, nil, nil
	default:
		g, err := s.callActor(ctx, info, run, tool, input)
		if err != nil {
			return "", nil, err
		}
		return strings.TrimSpace(g.Text), g, nil
	}
}

// callGo calls the Go tool name on its own goroutine, and returns at ctx's
// end however long the call goes on: a tool that ignores its context must
// not hold the act, its turn and a slot for ever. A call left running is
// counted (Service.overdueTools) and logged until it returns.
func (s *Service) callGo(ctx context.Context, name string, fn gotool.Func, input string) (string, error) {
	type result struct {
		out string
		err error
	}
	const running, returned, left = 0, 1, 2
	var state atomic.Int32
	res := make(chan result, 1) // a call that returns late leaves its result there
	log := zerolog.Ctx(ctx)
	go func() {
		out, err := fn(ctx, input)
		res <- result{out, err}
		if !state.CompareAndSwap(running, returned) { // left behind, and counted
			n := s.overdueTools.Add(-1)
			log.Info().Str("tool", name).Int64("overdue_tool_calls", n).Msg("a Go tool call left running past its deadline returned")
		}
	}()
	select {
	case r := <-res:
		return r.out, r.err
	case <-ctx.Done():
	}
	// Counted before it is left, so that its return never counts it below
	// zero.
	n := s.overdueTools.Add(1)
	if !state.CompareAndSwap(running, left) {
		s.overdueTools.Add(-1) // it returned as its time ran out
		r := <-res
		return r.out, r.err
	}
	log.Warn().Str("tool", name).Int64("overdue_tool_calls", n).Msg("a Go tool ignored its context; its call is left running past its deadline")
	return "", fail.Transientf("tool %s: %w", name, ctx.Err())
}

// ActorPrompt is what the plan_act actor is asked for one act
// (mode.StepPrompt; a rollout's mode asks its own).
func ActorPrompt(tool schema.Tool, input string) string { return mode.StepPrompt(tool, input) }

// callActor asks the actor-gateway service for a generation.
func (s *Service) callActor(ctx context.Context, info *session.Info, run *act, tool schema.Tool, input string) (*schema.Generation, error) {
	eng, version, err := info.Engine(schema.RoleActor)
	if err != nil {
		return nil, err
	}
	if run.aborted != "" {
		// The last try was aborted by a pause while it ran: this one is
		// its generation again, a retry once a gateway starts it (the
		// gateway records it, and so does the exchange).
		run.resendAlso(schema.Retry{By: s.replica(), From: run.aborted, Why: "aborted by a pause of the actor role; generated again after the resume"}, "paused")
		run.aborted = ""
	}
	// A new try only after one a gateway took: the tries of an act are
	// then numbered alike by every runner, so that a runner that takes a
	// turn over attaches to the generation its predecessor started.
	if run.try == 0 || run.taken {
		run.try, run.taken = run.try+1, false
	}
	md, err := mode.For(info.Session.Config)
	if err != nil {
		return nil, fail.E(fail.Invalid, err)
	}
	task, err := info.Task(run.Episode)
	if err != nil {
		return nil, err
	}
	prompt := md.ActorPrompt(task, tool, mode.Node{ID: run.Node.ID, Tool: run.Node.Tool, Args: run.Node.Args}, input)
	req := &schema.ActorRequest{
		Rollout: run.Rollout, Episode: run.Episode, Key: run.Key, Engine: eng,
		Prompt: prompt, Sampling: info.Session.Config.ActorSampling, Try: run.try,
		MaxStaleness: info.Session.Config.MaxStaleness,
	}
	if d, ok := ctx.Deadline(); ok {
		req.DeadlineMs = d.UnixMilli()
	}
	msg, err := bus.NewMsg(ctx, req)
	if err != nil {
		return nil, fail.E(fail.Permanent, err)
	}
	bus.InjectSpan(ctx, msg.Header) // the generation is the attempt's child
	reply, acked, err := s.exchange(ctx, run, msg)
	// Taken: a gateway acknowledged it, or answered from a generation of
	// it (anything but a refusal because the role is paused).
	run.taken = acked || (err == nil && reply.Header.Get(micro.ErrorCodeHeader) != schema.ActorCodePaused)
	if err != nil {
		if errors.Is(err, errNoActorGateway) {
			return nil, err
		}
		return nil, fail.Transientf("actor-gateway: %w", err)
	}
	if code := reply.Header.Get(micro.ErrorCodeHeader); code == schema.ActorCodeTimeout {
		return nil, errActorTimedOut // the gateway gave up at our deadline
	} else if code == schema.ActorCodePaused {
		if acked {
			run.aborted = cmp.Or(reply.Header.Get(schema.HdrActorGateway), "?")
		}
		return nil, errActorPaused
	} else if code == schema.ActorCodeStale {
		// Refused before it ran: the engine's weights are too far behind.
		return nil, fail.E(fail.Permanent, &session.StaleError{Why: reply.Header.Get(micro.ErrorHeader)})
	} else if code == schema.ActorCodeTokenDrift {
		return nil, fail.E(fail.Permanent, &tokenDrift{where: reply.Header.Get(micro.ErrorHeader)})
	} else if code == schema.ActorCodeBusy {
		return nil, fail.E(fail.Permanent, fmt.Errorf("%w: %s", errEngineBusy, reply.Header.Get(micro.ErrorHeader)))
	} else if code == schema.ActorCodeGone {
		// The try ran, and its answer was lost longer than the gateway
		// keeps it: the next attempt is a new generation, and says why.
		g := reply.Header.Get(schema.HdrActorGateway)
		why := fmt.Sprintf("actor-gateway %s no longer keeps the answer of try %d: %s", g, req.Try, reply.Header.Get(micro.ErrorHeader))
		run.resendAlso(schema.Retry{By: s.replica(), From: g, Why: why}, "") // no reason of the metric's
		return nil, fail.Transientf("%s", why)
	} else if code == schema.ActorCodeDone {
		// A retry asked of an act whose outcome another runner published
		// meanwhile: not generated again. That outcome counts (runAct reads
		// it when this one is refused).
		return nil, fail.E(fail.Permanent, fmt.Errorf("%w: %s", errActHasOutcome, reply.Header.Get(micro.ErrorHeader)))
	} else if code != "" {
		kind := fail.Transient
		if strings.HasPrefix(code, "4") {
			kind = fail.Permanent
		}
		err := fail.E(kind, fmt.Errorf("actor-gateway %s: %s", code, reply.Header.Get(micro.ErrorHeader)))
		if ms, perr := strconv.ParseInt(reply.Header.Get(schema.ActorRetryAfterHeader), 10, 64); perr == nil && ms > 0 && kind == fail.Transient {
			err = fail.After(time.Duration(ms)*time.Millisecond, err) // as the engine asked
		}
		return nil, err
	}
	var r schema.ActorReply
	if err := schema.Unmarshal(reply.Data, &r); err != nil {
		return nil, err
	}
	// The version of the weights that generated the act: what the engine
	// reports wins (it generated it); else the actor role's version as its
	// trainer last announced it (a resume, an arrival), else the arrival's.
	if r.Generation.WeightVersion == "" {
		r.Generation.WeightVersion = cmp.Or(s.follow.Gate(schema.RoleActor).State().WeightVersion, version)
	}
	return &r.Generation, nil
}

// resendAlso makes r the retry the act's next exchange is, or, with one
// outstanding already, adds r's reason to it: still one retry (one more
// generation at most), keeping what made it first (the gateway whose
// generation may have reached the engine), as a send again in an exchange
// does. It was overwritten, the earlier gateway and reason lost from the
// act's record.
func (run *act) resendAlso(r schema.Retry, reason string) {
	if run.resend == nil {
		run.resend, run.resendReason = &r, reason
		return
	}
	merged := *run.resend
	why := r.Why
	if r.From != "" && r.From != merged.From && !strings.Contains(why, r.From) {
		why = fmt.Sprintf("actor-gateway %s: %s", r.From, why)
	}
	merged.From = cmp.Or(merged.From, r.From)
	merged.Why += "; then " + why
	run.resend, run.resendReason = &merged, cmp.Or(run.resendReason, reason)
}

// callHTTP calls a retrieval-style HTTP tool: POST {"queries":[input],"topk":3}.
func (s *Service) callHTTP(ctx context.Context, tool schema.Tool, input string) (string, error) {
	body, _ := json.Marshal(map[string]any{"queries": []string{input}, "topk": 3})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tool.URL, bytes.NewReader(body))
	if err != nil {
		return "", fail.Permanentf("tool %s: %w", tool.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := redirect.SameHostPOST(s.HTTP).Do(req)
	if err != nil {
		return "", fail.Transientf("tool %s: %w", tool.Name, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxToolAnswer+1))
	if err != nil {
		return "", fail.Transientf("tool %s: %w", tool.Name, err)
	}
	switch {
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return "", fail.Transientf("tool %s: HTTP %d: %s", tool.Name, resp.StatusCode, strings.TrimSpace(string(data)))
	case resp.StatusCode >= 400:
		return "", fail.Permanentf("tool %s: HTTP %d: %s", tool.Name, resp.StatusCode, strings.TrimSpace(string(data)))
	case resp.StatusCode < 200 || resp.StatusCode >= 300:
		// A redirect the client did not follow (304, 300, one elsewhere):
		// no answer.
		where := ""
		if loc := resp.Header.Get("Location"); loc != "" {
			where = fmt.Sprintf(" (to %q: a redirect is followed only to the same scheme and host, keeping the POST: 307 or 308)", loc)
		}
		return "", fail.Permanentf("tool %s: HTTP %d %s from %s%s: want a 2xx answer", tool.Name, resp.StatusCode, http.StatusText(resp.StatusCode), tool.URL, where)
	case len(data) > MaxToolAnswer:
		// Cut, it would be taken for the whole answer: the observation,
		// and the input of the acts that depend on it.
		return "", fail.Permanentf("tool %s: its answer is longer than %d bytes, the most an HTTP tool may answer: have it answer less (fewer or shorter passages)", tool.Name, MaxToolAnswer)
	}
	return strings.TrimSpace(string(data)), nil
}

// MaxToolAnswer bounds the answer of an HTTP tool, in bytes; a longer one
// fails its act (invalid) rather than being cut.
const MaxToolAnswer = 1 << 20

func nowMs() int64 { return time.Now().UnixMilli() }

// actBudget is how long an act of a rollout with cfg may legitimately take,
// all its attempts and back-offs included.
func (s *Service) actBudget(cfg schema.Config) time.Duration {
	cfg = cfg.WithDefaults()
	attempts := max(cfg.ActRetries, 0) + 1
	budget := time.Duration(attempts) * schema.Seconds(cfg.ActTimeoutS)
	for a := 1; a < attempts; a++ {
		budget += maxBackoff(s.RetryBase, a)
	}
	return budget
}

// maxBackoff is the longest backoff(base, attempt) can be (with its jitter).
func maxBackoff(base time.Duration, attempt int) time.Duration {
	return min(base<<min(attempt-1, 16), 30*time.Second) * 3 / 2
}

// waitFits reports whether an act that began elapsed ago, waiting d before
// its attempt next, still has time within its budget for every attempt it
// has left, with their back-offs.
func (s *Service) waitFits(cfg schema.Config, elapsed time.Duration, next int, d time.Duration) bool {
	cfg = cfg.WithDefaults()
	attempts := max(cfg.ActRetries, 0) + 1
	need := d
	for a := next; a <= attempts; a++ {
		need += schema.Seconds(cfg.ActTimeoutS)
		if a < attempts {
			need += maxBackoff(s.RetryBase, a)
		}
	}
	return elapsed+need <= s.actBudget(cfg)
}

// tokenDrift is an actor-gateway's answer that the engine took another
// input than the act's prompt; where says where and how.
type tokenDrift struct{ where string }

func (e *tokenDrift) Error() string { return "token_drift: " + e.where }

// The clock an act's patience for a gateway is counted on, and what is
// told of each postponement for want of one (the act, and the clock's
// reading it was decided at): variables so that a test can move the clock
// and see each decision, with no margin of real time.
var (
	patienceClock = time.Now
	postponed     = func(key string, at time.Time) {}
)

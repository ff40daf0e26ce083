// Package actorgateway is the actor-gateway service: the door to the actor
// engines. It answers generation requests on a NATS service endpoint whose
// replicas share a queue group, and bounds the generations in flight on
// each engine.
package actorgateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
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
	CodeGone        = schema.ActorCodeGone
	CodeDone        = schema.ActorCodeDone
)

// Deps are what the actor-gateway needs.
type Deps struct {
	Bus *bus.Bus
	Log zerolog.Logger
	// Engines bounds the generations in flight per actor engine.
	Engines *engine.Pool
	// MaxInFlight bounds the generations this replica runs or waits to run
	// at once, a guard on its memory; default schema.MaxEngineInFlight.
	// What reaches an engine is bounded by Engines, per engine: its stated
	// capacity (engine.max_in_flight) shared with the other replicas, or
	// Engines.Limit. Requests beyond either wait, acknowledged and told
	// that they wait.
	MaxInFlight int
}

// A generation is asked for once per try (schema.ActorRequest.ActorID) and
// runs once, however many times its request comes: a caller that hears
// nothing for a few seconds sends it again (to this instance's own subject,
// schema.ActorInstanceSubject, once it knows which instance has it), and
// the request is attached to the generation that runs, or answered from
// the one that ran. A caller that asks for it (the request's
// HdrActorProgress header) is told at once that this instance has it, and
// every Beat while it runs. A try that a pause in abort mode stopped ran to
// no answer: its callers are told so, again if they ask again, but a
// caller that comes after it gets what a fresh request gets (refused while
// the pause lasts, generated after the resume), not the abort for 30 s.

// Beat is how often a running generation tells its callers it is alive.
const Beat = time.Second

// KeepAnswer is how long the answer of a generation is kept for a caller
// that did not get it; after that, until the caller's deadline, a request
// for the same try is told CodeGone.
const KeepAnswer = 30 * time.Second

// gateway is a running actor-gateway instance.
type gateway struct {
	Deps
	id     string
	follow *session.Follower
	gate   *session.Gate

	slots chan struct{} // generations running

	mu   sync.Mutex
	gens map[string]*generation // by ActorID
}

// generation is one try of an act on this instance.
type generation struct {
	callers  []string  // reply subjects of the requests for it
	answer   *nats.Msg // once answered; nil again after KeepAnswer
	answered time.Time
	forget   time.Time // when the record goes (the caller's deadline, or later)
	// aborted: a pause in abort mode stopped it. Its answer is its
	// callers' only: the try has no answer to keep for a caller that comes
	// after (a runner that took the act over and numbers its tries alike),
	// which is told what a fresh request is (paused, or a new generation).
	aborted bool
	// sent: it had a slot and went on to its engine. A try a pause aborted
	// after that and generated again may be a second engine call of the act.
	sent bool
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	if d.Engines == nil {
		d.Engines = &engine.Pool{}
	}
	if d.MaxInFlight == 0 {
		d.MaxInFlight = schema.MaxEngineInFlight
	}
	g := &gateway{Deps: d, id: d.Bus.Service().ID(), gens: map[string]*generation{}}
	if g.id == "" {
		g.id = nuid.Next() // not registered as a service: still named in its answers
	}
	// The endpoint's statistics (`nats micro stats actor-gateway`) count the
	// time of each generation, until its reply: it runs on its own
	// goroutine, so the subscription's callback returns at once.
	ep := d.Bus.Service().Endpoint("generate", schema.ActorSubject, QueueGroup, map[string]string{"schema": "actor.generate/1"})
	// The actor role's state: generations are not sent while it is paused,
	// and the gateway says when it runs none any more.
	g.follow = session.NewFollower(d.Bus, d.Log)
	go func() { _ = g.follow.Run(ctx) }()
	g.gate = g.follow.Gate(schema.RoleActor)
	if id := d.Bus.Service().ID(); id != "" {
		go g.follow.AnswerPauses(ctx, schema.RoleActor, id)
	}
	go g.sweep(ctx)
	g.slots = make(chan struct{}, d.MaxInFlight)
	// The replicas share each engine's stated capacity.
	peers := d.Bus.Peers(ctx)
	d.Engines.Replicas = peers.N
	peers.OnChange(func(int) { d.Engines.Rebalance() })
	var wg sync.WaitGroup
	// Every request is answered at once (acknowledged, attached, refused):
	// only a new generation waits, on its own goroutine, for a slot.
	handle := func(m *nats.Msg) {
		began := time.Now()
		if ctx.Err() != nil {
			ep.Record(time.Since(began), g.replyError(m.Reply, CodeUnavailable, "actor-gateway shutting down"))
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := g.serve(ctx, m)
			ep.Record(time.Since(began), err)
		}()
	}
	// Recorded as running before it serves: a pause waits for it.
	if id := d.Bus.Service().ID(); id != "" {
		gone, err := d.Bus.Present(ctx, schema.RoleActor, id)
		if err != nil {
			return fmt.Errorf("actor-gateway: %w", err)
		}
		defer gone() // after the generations below ended
	}
	// A pause answered before this gateway's presence was recorded is
	// read now, before it serves, however late the watch brings it.
	if err := g.follow.SyncRole(ctx, schema.RoleActor); err != nil {
		return fmt.Errorf("actor-gateway: %w", err)
	}
	sub, err := d.Bus.NC.QueueSubscribe(schema.ActorSubject, QueueGroup, handle)
	if err != nil {
		return fmt.Errorf("actor-gateway: %w", err)
	}
	own, err := d.Bus.NC.Subscribe(schema.ActorInstanceSubject(g.id), handle)
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("actor-gateway: %w", err)
	}
	<-ctx.Done()
	_ = sub.Drain()
	_ = own.Drain()
	wg.Wait()
	return nil
}

// serve answers one request and returns the error it answered with. While
// the actor role is paused it runs nothing: the caller is told to send the
// request again after the resume, and a pause that aborts generations
// answers those running the same way.
func (g *gateway) serve(ctx context.Context, m *nats.Msg) error {
	var req schema.ActorRequest
	if err := schema.Unmarshal(m.Data, &req); err != nil {
		return g.replyError(m.Reply, CodeInvalid, err.Error())
	}
	if req.DeadlineMs <= 0 {
		// Without it nothing would bound the generation: an engine that
		// hangs would hold its slot, and this replica's, for good.
		return g.replyError(m.Reply, CodeInvalid, fmt.Sprintf("deadline_ms %d: want when the caller stops waiting, in unix milliseconds (the act-dispatcher sends its attempt's deadline, act_timeout_s)", req.DeadlineMs))
	}
	// The generation's span hangs under the act's attempt that asked for it.
	ctx, span := telemetry.StartSpan(bus.ExtractSpan(ctx, m.Header), "actor generation")
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(telemetry.KeyRollout.Int64(req.Rollout), telemetry.KeyEpisode.Int(req.Episode), telemetry.KeyNode.String(req.Key),
			telemetry.KeyRole.String(schema.RoleActor), telemetry.KeyReplica.String(g.Bus.Service().Replica()), telemetry.KeyService.String(Name))
	}
	err := g.run(ctx, m, &req)
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// run answers m from the generation of its try: the one running (m is
// attached to it), the one that ran, or a new one.
func (g *gateway) run(ctx context.Context, m *nats.Msg, req *schema.ActorRequest) error {
	progress := m.Header.Get(schema.HdrActorProgress) != ""
	id := req.ActorID()
	g.mu.Lock()
	if gen := g.gens[id]; gen != nil && (!gen.aborted || slices.Contains(gen.callers, m.Reply)) {
		switch {
		case gen.answer != nil:
			a := gen.answer
			g.mu.Unlock()
			telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor).Inc()
			return g.send(m.Reply, a)
		case !gen.answered.IsZero():
			g.mu.Unlock()
			return g.replyError(m.Reply, CodeGone, fmt.Sprintf("try %d of act %s ran here and its answer is no longer kept", req.Try, req.Key))
		}
		if !slices.Contains(gen.callers, m.Reply) {
			gen.callers = append(gen.callers, m.Reply)
		}
		g.mu.Unlock()
		telemetry.GenerationsAwaited.WithLabelValues(schema.RoleActor).Inc()
		if progress {
			return g.send(m.Reply, g.progress(schema.ActorAttached))
		}
		return nil
	}
	// Past the gate and registered with it in one step, for all of the
	// generation (the wait for a slot, the tokenizing): a pause answered
	// before that refuses it; one after waits for it, or aborts it.
	gctx, left, st, ok := g.gate.TryEnter(ctx)
	if !ok {
		g.mu.Unlock()
		return g.replyError(m.Reply, CodePaused, fmt.Sprintf("the actor role is paused (pause %d): send it again after the resume", st.Epoch))
	}
	defer left()
	// A try a pause aborted here once it went on to its engine, asked for
	// again by a request that says no retry (its caller never heard it
	// start: the acknowledgement was lost), is a retry all the same: this
	// gateway's own, recorded as any other.
	var own *schema.Retry
	if prev := g.gens[id]; prev != nil && prev.aborted && prev.sent {
		own = &schema.Retry{By: g.id, From: g.id, AtMs: time.Now().UnixMilli(),
			Why: fmt.Sprintf("a pause of the actor role aborted try %d on actor-gateway %s, where it may have reached its engine; generated again after the resume", req.Try, g.id)}
	}
	gen := &generation{callers: []string{m.Reply}, forget: time.UnixMilli(req.DeadlineMs).Add(time.Minute)}
	g.gens[id] = gen
	g.mu.Unlock()
	// A new generation of a request that says it is a retry is recorded as
	// one before it is acknowledged and its engine called; an act that has
	// an outcome already is not generated again.
	answer, err := g.recordRetry(gctx, m, req, own)
	if answer != nil && answer.Header.Get(micro.ErrorCodeHeader) == CodeUnavailable && errors.Is(context.Cause(gctx), session.ErrPaused) {
		// Not a failure to record: a pause in abort mode stopped it, as it
		// stops one waiting for a slot, and the try is sent again after the
		// resume (a 503 cost the act an attempt).
		answer, err = errorAnswer(CodePaused, "aborted by a pause of the actor role while its retry was recorded: send it again after the resume")
	}
	if progress && answer == nil {
		ack := g.progress(schema.ActorStarted)
		if n := m.Header.Get(schema.HdrActorSend); n != "" {
			ack.Header.Set(schema.HdrActorSend, n) // the send this generation started from
		}
		_ = g.send(m.Reply, ack)
	}
	stop := g.beat(gen, progress && answer == nil)
	if answer == nil {
		answer, err = g.generateInSlot(gctx, req, gen)
	}
	stop()
	left()
	if n, most := int64(len(answer.Data)), g.Bus.NC.MaxPayload()-answerHeaderRoom; n > most {
		// Sent as it is, it would reach no caller (the publish fails), and
		// the act, heard of no more, would be generated again elsewhere.
		answer, err = errorAnswer(CodeInvalid, fmt.Sprintf("the answer of act %s (try %d) is %d bytes, more than the %d the NATS server takes (max_payload %d, less %d for headers): "+
			"raise max_payload, or ask for fewer tokens (actor_sampling.max_new_tokens)", req.Key, req.Try, n, most, g.Bus.NC.MaxPayload(), answerHeaderRoom))
	}
	g.mu.Lock()
	gen.answer, gen.answered = answer, time.Now()
	gen.aborted = answer.Header.Get(micro.ErrorCodeHeader) == CodePaused
	gen.forget = later(gen.forget, gen.answered.Add(KeepAnswer))
	callers := slices.Clone(gen.callers)
	g.mu.Unlock()
	for _, c := range callers {
		if serr := g.send(c, answer); serr != nil {
			zerolog.Ctx(ctx).Warn().Err(serr).Msg("reply")
			err = cmp.Or(err, serr)
		}
	}
	return err
}

// answerHeaderRoom is what an answer leaves of the server's max_payload
// for its headers (the gateway's id, an error's words): more than they take.
const answerHeaderRoom = 4 << 10

// recordRetry records the retry m says a new generation of it is (its
// HdrActorRetry header) on the ACT stream, as the act's retries (ActRetries)
// with this one added, by compare-and-set on the act's last message: the
// outcome of the act, whichever runner publishes it first, carries every
// retry recorded before it (act-dispatcher's outcome publishing merges
// them alike), and one recorded after it cannot be, so none is: an act
// that has an outcome is answered CodeDone and not generated again. A
// request without the header records own, the retry this gateway knows the
// generation is, when not nil. It returns nil, nil when the generation may
// run (recorded, or no retry), else the answer for its callers.
func (g *gateway) recordRetry(ctx context.Context, m *nats.Msg, req *schema.ActorRequest, own *schema.Retry) (*nats.Msg, error) {
	var r schema.Retry
	switch h := m.Header.Get(schema.HdrActorRetry); {
	case h != "":
		if err := json.Unmarshal([]byte(h), &r); err != nil || r.Why == "" {
			if err == nil {
				err = errors.New("it says no why")
			}
			return errorAnswer(CodeInvalid, fmt.Sprintf("header %s: want a retry as JSON (by, from, why, at_ms): %v", schema.HdrActorRetry, err))
		}
	case own != nil:
		r = *own
	default:
		return nil, nil
	}
	filter := subject.ActOf(req.Rollout, req.Episode, req.Key)
	if tid := bus.TraceIDOf(m.Header.Get(schema.HdrTraceparent)); tid != "" {
		ctx = bus.WithTrace(ctx, tid) // in the rollout's trace, as the act's other messages
	}
	turn, _ := subject.TurnOfKey(req.Key)
	tried := "" // the id of the record last refused
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			// A read that stays behind the record that refused the write
			// (a lagging replica) would otherwise be asked again at once,
			// as fast as NATS answers, until it catches up.
			select {
			case <-ctx.Done():
				return failureAnswer(CodeUnavailable, fmt.Errorf("the retry of act %s could not be recorded before its generation: %w", req.Key, context.Cause(ctx)))
			case <-time.After(retryPause(attempt)):
			}
		}
		last, err := g.Bus.LastMsg(ctx, bus.StreamAct, filter)
		if err != nil {
			return failureAnswer(CodeUnavailable, fmt.Errorf("the retry of act %s could not be recorded before its generation: %w", req.Key, err))
		}
		if last != nil && tried != "" && last.Header.Get(jetstream.MsgIDHeader) == tried {
			// Refused because it was stored already: its ack was lost, and a
			// single server checks the last sequence before the duplicate
			// window when it is sent again. Recorded once, not twice.
			return nil, nil
		}
		rec := &schema.ActRetries{Rollout: req.Rollout, Episode: req.Episode, Key: req.Key}
		var after uint64
		if last != nil {
			if last.Subject != rec.Subject() {
				return errorAnswer(CodeDone, fmt.Sprintf("act %s has an outcome already (%s): its retry is not generated", req.Key, last.Subject))
			}
			if err := last.Decode(rec); err != nil {
				return failureAnswer(CodeUnavailable, fmt.Errorf("the retries of act %s could not be read: %w", req.Key, err))
			}
			after = last.Seq
		}
		rec.Retries = append(rec.Retries, r)
		rec.Turn, rec.Gateway, rec.Try, rec.After = turn, g.id, req.Try, after
		stored, err := publishRetries(ctx, g.Bus, rec, filter, after)
		if err != nil {
			return failureAnswer(CodeUnavailable, fmt.Errorf("the retry of act %s could not be recorded before its generation: %w", req.Key, err))
		}
		if stored {
			return nil, nil
		}
		tried = rec.MsgID()
		// Another retry or the outcome came first: read again.
	}
}

// retryPause is the wait before the given attempt (from 1) to record a
// retry whose write was refused: doubling from 10 ms, at most a second.
func retryPause(attempt int) time.Duration {
	return min(10*time.Millisecond<<min(attempt-1, 7), time.Second)
}

// publishRetries publishes an act's retries after its message at seq
// after (bus.PublishAfter); a test loses its ack.
var publishRetries = func(ctx context.Context, b *bus.Bus, rec *schema.ActRetries, filter string, after uint64) (bool, error) {
	stored, _, err := b.PublishAfter(ctx, rec, filter, after)
	return stored, err
}

// generateInSlot runs req, the request of gen, once one of the replica's
// slots is free. A rollout that ends (cancelled, timed out, enough groups)
// stops its generations at once: those on their engine, and those waiting
// for a slot.
func (g *gateway) generateInSlot(ctx context.Context, req *schema.ActorRequest, gen *generation) (*nats.Msg, error) {
	ctx, stop := g.follow.Rollout(ctx, req.Rollout)
	defer stop()
	wctx, cancel := context.WithDeadline(ctx, time.UnixMilli(req.DeadlineMs))
	defer cancel()
	select {
	case g.slots <- struct{}{}:
		defer func() { <-g.slots }()
		if wctx.Err() == nil { // a select takes either when both are ready
			g.mu.Lock()
			gen.sent = true
			g.mu.Unlock()
			return g.generate(ctx, req)
		}
	case <-wctx.Done():
	}
	switch {
	case errors.Is(context.Cause(ctx), session.ErrPaused):
		return errorAnswer(CodePaused, "aborted by a pause of the actor role while it waited for a slot: send it again after the resume")
	case context.Cause(ctx) == session.ErrRolloutOver:
		return errorAnswer(CodeUnavailable, "rollout is over")
	case ctx.Err() != nil:
		return errorAnswer(CodeUnavailable, "actor-gateway shutting down")
	}
	return errorAnswer(CodeTimeout, "the act's deadline passed while it waited for a slot")
}

// beat tells the callers of gen that it runs, every Beat, until stop.
func (g *gateway) beat(gen *generation, progress bool) (stop func()) {
	if !progress {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(Beat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			g.mu.Lock()
			callers := slices.Clone(gen.callers)
			g.mu.Unlock()
			for _, c := range callers {
				_ = g.send(c, g.progress(schema.ActorRunning))
			}
		}
	}()
	return func() { close(done) }
}

// sweep drops the answers kept past KeepAnswer and the records of tries
// whose callers stopped waiting.
func (g *gateway) sweep(ctx context.Context) {
	t := time.NewTicker(KeepAnswer / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		g.mu.Lock()
		for id, gen := range g.gens {
			switch {
			case !gen.answered.IsZero() && now.After(gen.forget):
				delete(g.gens, id)
			case gen.answer != nil && now.Sub(gen.answered) > KeepAnswer:
				gen.answer = nil
			}
		}
		g.mu.Unlock()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// progress is an answer that says the generation runs here.
func (g *gateway) progress(what string) *nats.Msg {
	m := &nats.Msg{Header: nats.Header{}}
	m.Header.Set(schema.HdrActorProgress, what)
	return m
}

// send answers the request whose reply subject is to with a.
func (g *gateway) send(to string, a *nats.Msg) error {
	if to == "" {
		return nil
	}
	m := &nats.Msg{Subject: to, Header: nats.Header{}, Data: a.Data}
	for k, v := range a.Header {
		m.Header[k] = v
	}
	m.Header.Set(schema.HdrActorGateway, g.id)
	return g.Bus.NC.PublishMsg(m)
}

// generate runs req on its engine and returns the answer: the reply, or an
// error in the NATS service protocol's headers, as serve says. ctx is the
// rollout's (generateInSlot).
func (g *gateway) generate(ctx context.Context, req *schema.ActorRequest) (*nats.Msg, error) {
	log := g.Log.With().Int64("rollout", req.Rollout).Int("episode", req.Episode).Str("node", req.Key).Str("role", schema.RoleActor).Logger()
	// The caller has stopped waiting by then: a generation still running
	// would only hold one of the engine's slots.
	ctx, cancel := context.WithDeadline(ctx, time.UnixMilli(req.DeadlineMs))
	defer cancel()
	gen, err := Generate(ctx, g.Engines, req, session.Newest(g.Bus, schema.RoleActor))
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
			return errorAnswer(CodeTokenDrift, drift.Where())
		case errors.Is(context.Cause(ctx), session.ErrPaused):
			code = CodePaused // aborted by the pause; sent again after the resume
		case context.Cause(ctx) == session.ErrRolloutOver:
			log.Info().Msg("rollout over; generation stopped")
			return errorAnswer(CodeUnavailable, "rollout is over")
		case errors.Is(err, engine.ErrBusy):
			code = CodeBusy // the engine's wait ends past the act's deadline
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded:
			code = CodeTimeout
		case !fail.IsRetryable(err):
			code = CodeInvalid
		}
		log.Warn().Err(err).Str("code", code).Msg("actor generation failed")
		return failureAnswer(code, err)
	}
	body, err := schema.Marshal(&schema.ActorReply{Generation: gen})
	if err != nil {
		return errorAnswer(CodeInvalid, err.Error())
	}
	return &nats.Msg{Header: nats.Header{}, Data: body}, nil
}

// errorAnswer is an error in the NATS service protocol's headers (code and
// description, no body), and the error.
func errorAnswer(code, description string) (*nats.Msg, error) {
	return failureAnswer(code, errors.New(description))
}

// failureAnswer is errorAnswer with err's words, and the wait the engine
// asked for (its Retry-After), when it named one.
func failureAnswer(code string, err error) (*nats.Msg, error) {
	m := &nats.Msg{Header: nats.Header{}}
	m.Header.Set(micro.ErrorCodeHeader, code)
	m.Header.Set(micro.ErrorHeader, err.Error())
	if d, ok := fail.RetryAfter(err); ok {
		m.Header.Set(schema.ActorRetryAfterHeader, strconv.FormatInt(d.Milliseconds(), 10))
	}
	return m, fmt.Errorf("%s: %s", code, err.Error())
}

// replyError answers the request whose reply subject is to with an error,
// and returns it.
func (g *gateway) replyError(to, code, description string) error {
	a, err := errorAnswer(code, description)
	_ = g.send(to, a)
	return err
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
	// Every engine request of the act names it (engine.GenerationHeader).
	ctx = engine.WithGeneration(ctx, engine.ActGeneration(req.Rollout, req.Episode, req.Key))
	lease, err := pool.AcquireShare(ctx, req.Engine.Protocol, req.Engine.URL, req.Engine.Model, req.Engine.MaxInFlight)
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
		limit := "max_new_tokens"
		truncated = fmt.Sprintf("actor_sampling.max_new_tokens %d: the act's generation was cut there", s.MaxNewTokens)
		switch {
		case s.MaxNewTokens <= 0:
			// Nothing was asked for: the engine's own default cut it.
			limit = "engine_context"
			truncated = fmt.Sprintf("the actor engine's own limit: the act's generation was cut after %d tokens (no max_new_tokens was asked for)", len(g.OutputIDs))
		case len(g.OutputIDs) < s.MaxNewTokens:
			// Short of what it was asked for: a limit of the engine's own
			// (SGLang's --allow-auto-truncate fits max_new_tokens to its
			// context), not planact's, as a planner turn's.
			limit = "engine_context"
			truncated = fmt.Sprintf("the actor engine's own limit: the act's generation was cut after %d tokens, of the %d it was asked for", len(g.OutputIDs), s.MaxNewTokens)
		}
		telemetry.Truncations.WithLabelValues(schema.RoleActor, limit).Inc()
	}
	ids = engine.TrajectoryIDs(r, g, ids) // a chat engine's rendering of the prompt
	telemetry.EngineSeconds.WithLabelValues(schema.RoleActor).Observe(time.Since(start).Seconds())
	return schema.Generation{
		Prompt: req.Prompt, PromptIDs: ids, Text: g.Text, OutputIDs: g.OutputIDs, LogProbs: g.LogProbs, LogProbsMissing: g.LogProbsMissing,
		FinishReason: g.FinishReason, WeightVersion: g.WeightVersion, LatencyMs: time.Since(start).Milliseconds(),
		StalenessUnchecked: unchecked, Truncated: truncated,
	}, nil
}

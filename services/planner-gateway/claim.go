package plannergateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// A planner turn is generated once. The instance that takes a plan request
// first records, before the turn's first engine request, that it generates
// the turn: a claim in KV runs (schema.Claim, key <N>.<E>.<turn>.planner).
// A request for the same turn delivered again — JetStream redelivers it
// after a NATS restart lost its in-progress signals, the watchdog asks
// again, a stopped replica's work moves on — finds the claim. While the
// holder answers that it still generates the turn, the request waits for
// the turn's output (in progress meanwhile) and calls no engine. Only when
// the holder is gone (it answers nothing for holderPatience: its process
// died or is stopped) or says it no longer generates the turn does another
// instance take the turn over, by compare-and-set on the claim, recording
// who, from whom and why (a retry, unless the holder said it sent none of
// the turn's generations). Every later engine call of the holder itself (an
// attempt after an engine failure, a generation a pause aborted) is
// recorded there too. Nothing is inferred from a delivery count.
//
// A request that finds the claim its own instance wrote, with no handler of
// the instance holding the turn (the write's ack was lost and the request
// handed back, or the handler that held it handed it back), takes the turn
// on as it stands, without a retry: what that handler left of the turn (an
// output it could not publish, a failure it decided and could not publish
// or confirm, the generations it sent) goes on with it.

// holderPatience is how long a holder may answer nothing before it is
// taken for gone: a process that died answers "no responders" at once; a
// stopped one, or one reconnecting after a NATS restart, nothing.
const holderPatience = 3 * time.Second

// awaitPoll is how often a request waiting for a live holder looks again.
const awaitPoll = 500 * time.Millisecond

// holdsSubject is where planner-gateway instance id answers whether it
// generates a turn: the request's body is the turn's claim key, the reply
// "yes", "no", or "none": no, and none of its handlers sent a generation of
// the turn that the turn did not get (its claim's write lost its ack, or
// its handler handed the request back before its engine call). An instance
// that takes the turn over from one that answered none records no retry:
// nothing was generated before. (Older instances answer only yes or no.)
func holdsSubject(id string) string { return "planact." + Name + "." + id + ".holds" }

// turn is one handler's hold on a planner turn.
type turn struct {
	key     string
	rollout int64
	holding bool // this handler holds the claim
	calls   int  // engine generations it sent
	// retry says why the next generation is sent again: set when an
	// attempt failed or a pause aborted the generation.
	retry, retryWhy string
	// out is the turn's output once generated: an attempt after its
	// publish failed publishes it again, and generates nothing, until
	// until (the rollout's deadline).
	out   *schema.PlanOutput
	until time.Time
	// failed is the turn's failure once decided: published instead of
	// anything generated, by this handler or, handed back, by the next
	// one of this instance that takes the turn on.
	failed *schema.PlanError
}

// leftTurn is what a handler that handed its turn back had of it, kept for
// the next handler of this instance that takes the turn on.
type leftTurn struct {
	rollout         int64
	calls           int
	retry, retryWhy string
	out             *schema.PlanOutput
	until           time.Time
	failed          *schema.PlanError
}

// answerHolds answers a holds request.
func (s *Service) answerHolds(m *nats.Msg) {
	yes, none := s.holdsHere(string(m.Data))
	answer := "no"
	switch {
	case yes:
		answer = "yes"
	case none:
		answer = "none"
	}
	_ = m.Respond([]byte(answer))
}

// holdsHere says whether a handler of this instance holds the turn with
// claim key key, and, when none does, whether none of them left a
// generation of it (release keeps what a handler that handed the turn back
// had of it: one that decided its failure may have sent none).
func (s *Service) holdsHere(key string) (yes, none bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, left := s.left[key]
	return s.held[key] > 0, !left || l.calls == 0
}

// mark says this instance holds the turn key, before the write that makes
// it the holder: a holds request that comes while the write is on its way
// is answered yes (answered no, the asker would take the turn over and
// generate it beside this one). Marks are counted: another handler of
// this instance that marked the key meanwhile (a request for the same turn
// delivered again) takes back only its own.
func (s *Service) mark(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[key]++
}

// unmark takes back one mark: one the write did not make true, or the
// hold of a handler that let the turn go.
func (s *Service) unmark(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key]--; s.held[key] <= 0 {
		delete(s.held, key)
	}
}

// claimWritten runs after each write of a claim returns: a test's window
// between the write and what follows it.
var claimWritten = func() {}

// release ends a handler's hold on its turn. A handler that did not
// finish the turn (done false: it hands the request back) leaves what it
// had of it to the next handler of this instance that takes the turn on:
// the output it could not publish is published then, not generated again,
// as is the failure it decided; a generation sent again is recorded as the
// retry it is.
func (s *Service) release(t *turn, done bool) {
	if !t.holding {
		return
	}
	s.mu.Lock()
	if !done && (t.calls > 0 || t.out != nil || t.failed != nil) {
		if s.left == nil {
			s.left = map[string]leftTurn{}
		}
		s.left[t.key] = leftTurn{rollout: t.rollout, calls: t.calls, retry: t.retry, retryWhy: t.retryWhy, out: t.out, until: t.until, failed: t.failed}
	}
	s.mu.Unlock()
	s.unmark(t.key)
	t.holding = false
}

// markIdle marks key held, as mark does, only when no handler of this
// instance holds it: true when this handler may take on the claim its
// instance wrote.
func (s *Service) markIdle(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] > 0 {
		return false
	}
	s.held[key]++
	return true
}

// takeLeft gives t what an earlier handler of this instance left of its turn.
func (s *Service) takeLeft(t *turn) {
	s.mu.Lock()
	l, ok := s.left[t.key]
	delete(s.left, t.key)
	s.mu.Unlock()
	if !ok {
		return
	}
	t.calls, t.retry, t.retryWhy, t.out, t.until, t.failed = l.calls, l.retry, l.retryWhy, l.out, l.until, l.failed
	if t.calls > 0 && t.retry == "" {
		// Its generation ended with its handler's context, which said no
		// more of why.
		t.retry, t.retryWhy = "failed", "a generation sent by an earlier delivery of this instance did not return"
	}
}

// dropLeft drops what a handler of this instance left of the turn with
// claim key key.
func (s *Service) dropLeft(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.left, key)
}

// forgetLeft drops what handlers left of rollout n's turns: it ended.
func (s *Service) forgetLeft(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, l := range s.left {
		if l.rollout == n {
			delete(s.left, key)
		}
	}
}

// createClaim creates a turn's claim; a test loses its ack.
var createClaim = func(ctx context.Context, kv *bus.Bucket, key string, c *schema.Claim) (bool, error) {
	return bus.Create(ctx, kv, key, c)
}

// claim makes this instance the holder of req's turn, waiting while a live
// instance holds it. served is true when the turn's output (or its failure)
// came meanwhile: nothing is left to do.
func (s *Service) claim(ctx context.Context, req *schema.PlanRequest, t *turn) (served bool, err error) {
	if t.holding {
		return false, nil
	}
	log := zerolog.Ctx(ctx)
	mine := schema.Claim{Rollout: req.Rollout, Episode: req.Episode, Turn: req.Turn, Holder: s.id, Replica: s.replica}
	for {
		mine.SinceMs = time.Now().UnixMilli()
		s.mark(t.key)
		created, err := createClaim(ctx, s.Bus.Runs, t.key, &mine)
		claimWritten()
		if err != nil || !created {
			s.unmark(t.key)
		}
		if err != nil {
			return false, handBack(t, err)
		}
		if created {
			t.holding = true
			s.dropLeft(t.key) // kept from before the claim was removed: of no turn now
			return false, nil
		}
		cur, rev, found, err := bus.GetFresh[schema.Claim](ctx, s.Bus.Runs, t.key)
		if err != nil {
			return false, handBack(t, err)
		}
		if !found {
			continue // removed meanwhile (the rollout's run state went): claimed anew
		}
		if cur.Holder == s.id && s.markIdle(t.key) {
			// This instance's claim, which none of its handlers holds: taken
			// on as it stands, by compare-and-set (another instance told
			// that this one does not hold the turn may be taking it over).
			next := cur
			next.SinceMs = time.Now().UnixMilli()
			_, conflict, err := bus.Update(ctx, s.Bus.Runs, t.key, &next, rev)
			claimWritten()
			if err != nil || conflict {
				s.unmark(t.key)
			}
			if err != nil {
				return false, handBack(t, err)
			}
			if conflict {
				continue
			}
			t.holding = true
			s.takeLeft(t)
			if t.calls == 0 && t.out == nil {
				// Nothing generated of it: the handler that held it may have
				// finished the turn (or published its failure) since this one
				// looked for its output (a copy of the request that came
				// while it ran).
				if served, err := s.served(ctx, req); err != nil || served {
					return served, err
				}
			}
			log.Info().Int("calls", t.calls).Bool("generated", t.out != nil).Bool("failed", t.failed != nil).Msg("planner turn claimed before by this instance; taken on again")
			return false, nil
		}
		served, reason, why, err := s.await(ctx, req, t, &cur)
		if err != nil || served {
			return served, err
		}
		if cur.Holder == s.id {
			continue // this instance's handler let go of it: taken on above, no retry
		}
		next := cur
		next.Holder, next.Replica, next.SinceMs = s.id, s.replica, time.Now().UnixMilli()
		if reason != "" {
			// (A holder that sent none of the turn's generations gave no
			// reason: the one this instance sends is no retry.)
			next.Retries = append(next.Retries, schema.Retry{By: s.id, From: cur.Holder, Why: why, AtMs: next.SinceMs})
		}
		s.mark(t.key)
		_, conflict, err := bus.Update(ctx, s.Bus.Runs, t.key, &next, rev)
		claimWritten()
		if err != nil || conflict {
			s.unmark(t.key)
		}
		if err != nil {
			return false, handBack(t, err)
		}
		if conflict {
			continue // another instance took it over first: its claim is awaited
		}
		t.holding = true
		// What a handler of this instance left of the turn before another
		// instance took it over is no part of this hold: a copy of the
		// request that takes on this instance's claim later (this hold
		// finished) must not take it for a generation still unfinished.
		s.dropLeft(t.key)
		if reason == "" {
			log.Info().Str("from", cur.Holder).Str("from_replica", cur.Replica).Str("why", why).Msg("planner turn taken over from a holder that generated none of it")
			return false, nil
		}
		telemetry.GenerationRetries.WithLabelValues(schema.RolePlanner, reason).Inc()
		log.Warn().Str("from", cur.Holder).Str("from_replica", cur.Replica).Str("why", why).Msg("planner turn taken over; generated again")
		return false, nil
	}
}

// await waits while the holder named in c generates req's turn. It returns
// served when the turn's output (or failure) is there, else why the holder
// does not generate it any more (reason: a label of GenerationRetries; ""
// when it answered that it sent none of the turn's generations).
func (s *Service) await(ctx context.Context, req *schema.PlanRequest, t *turn, c *schema.Claim) (served bool, reason, why string, err error) {
	var silentSince time.Time
	counted := false
	for {
		yes, none, lastErr := s.holds(ctx, c.Holder, t.key)
		switch {
		case yes:
			silentSince = time.Time{}
			if !counted {
				counted = true
				telemetry.GenerationsAwaited.WithLabelValues(schema.RolePlanner).Inc()
				zerolog.Ctx(ctx).Info().Str("holder", c.Holder).Str("holder_replica", c.Replica).Msg("planner turn asked for again while its holder generates it; waiting for its output")
			}
		case lastErr == nil && none:
			why = fmt.Sprintf("holder %s (%s) let it go before it sent a generation of it", c.Holder, c.Replica)
		case lastErr == nil:
			reason, why = "gave_up", fmt.Sprintf("holder %s (%s) no longer generates it", c.Holder, c.Replica)
		default:
			if silentSince.IsZero() {
				silentSince = time.Now()
			}
			if silent := time.Since(silentSince); silent >= holderPatience {
				reason, why = "holder_gone", fmt.Sprintf("holder %s (%s) answered nothing for %s: %v", c.Holder, c.Replica, silent.Round(100*time.Millisecond), lastErr)
			}
		}
		if !yes {
			// Read after the holder's answer: an output it published
			// before it let go of the turn is seen.
			if served, err := s.served(ctx, req); err != nil || served {
				return served, "", "", err
			}
			if why != "" {
				return false, reason, why, nil
			}
		}
		select {
		case <-ctx.Done():
			return false, "", "", ctx.Err()
		case <-time.After(awaitPoll):
		}
	}
}

// holds asks instance id whether it generates the turn with claim key
// key: yes, or no (err nil: it answered; none: it sent none of the turn's
// generations), or no answer (err says why).
func (s *Service) holds(ctx context.Context, id, key string) (yes, none bool, err error) {
	if id == s.id {
		yes, none := s.holdsHere(key)
		return yes, none, nil
	}
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	m, err := s.Bus.NC.RequestWithContext(qctx, holdsSubject(id), []byte(key))
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return false, false, fmt.Errorf("not running: %w", err)
		}
		return false, false, err
	}
	return string(m.Data) == "yes", string(m.Data) == "none", nil
}

// served reports whether req's turn has its output, or failed for good.
func (s *Service) served(ctx context.Context, req *schema.PlanRequest) (bool, error) {
	_, served, err := s.lastOutput(ctx, req)
	if err != nil || served {
		return served, err
	}
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanError(req.Rollout, req.Episode))
	if err != nil || m == nil {
		return false, err
	}
	var pe schema.PlanError
	if err := schema.Unmarshal(m.Data, &pe); err != nil {
		return false, err
	}
	return pe.Turn >= req.Turn, nil
}

// recordRetry writes down, before it is sent, why the holder sends its
// turn's generation to the engine again. Unrecorded, it is not sent.
func (s *Service) recordRetry(ctx context.Context, t *turn) error {
	now := time.Now().UnixMilli()
	_, _, err := bus.Mutate(ctx, s.Bus.Runs, t.key, func(c *schema.Claim, exists bool) (bool, error) {
		if !exists || c.Holder != s.id {
			return false, fail.Transientf("planner turn %s: no longer held by this instance", t.key)
		}
		c.Retries = append(c.Retries, schema.Retry{By: s.id, From: s.id, Why: t.retryWhy, AtMs: now})
		return true, nil
	})
	if err != nil {
		return handBack(t, fmt.Errorf("record the retry: %w", err))
	}
	telemetry.GenerationRetries.WithLabelValues(schema.RolePlanner, t.retry).Inc()
	return nil
}

// checkHeld checks, before the turn's first engine call and before its
// failure is published, that this instance still holds its claim: another
// instance takes the turn over from a holder that answered nothing for
// holderPatience (a NATS restart while it waited at the paused role's gate,
// for an engine's share, or for its engine), and generates it; the request
// is handed back, and its redelivery waits for that holder. (A generation
// sent again checks it in recordRetry.)
func (s *Service) checkHeld(ctx context.Context, t *turn) error {
	c, found, err := readClaim(ctx, s.Bus.Runs, t.key)
	if err != nil {
		return handBack(t, fmt.Errorf("read the claim: %w", err))
	}
	if !found {
		return handBack(t, fail.Transientf("its claim is gone"))
	}
	if c.Holder != s.id {
		return handBack(t, fail.Transientf("taken over by %s (%s)", c.Holder, c.Replica))
	}
	return nil
}

// readClaim reads a turn's claim for its holder's check; a test leaves it
// unanswered.
var readClaim = func(ctx context.Context, kv *bus.Bucket, key string) (schema.Claim, bool, error) {
	c, _, found, err := bus.GetFresh[schema.Claim](ctx, kv, key)
	return c, found, err
}

// handBack makes an error of the claim's machinery one that hands the plan
// request back to be delivered again (bus.ErrNotAnswered): planact's own
// bucket did not answer, or the turn is held by another instance now; no
// fault of the planner, so the turn does not fail.
func handBack(t *turn, err error) error {
	return fail.Transientf("planner turn %s: %w (%w)", t.key, err, bus.ErrNotAnswered)
}

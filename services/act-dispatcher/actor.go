package actdispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// An act's generation is asked of the actor-gateways' queue group once per
// try (schema.ActorRequest.Try). The gateway that takes it acknowledges it
// at once, naming itself, and tells every second that it still runs it. A
// request or an answer lost on the way (a NATS restart, a reconnect) is
// found out within seconds, not at the act's time-out: after silence
// without a word the request goes again, to that gateway's own subject,
// where it is attached to the generation running there (or answered from
// the one that ran): the engine is not called twice. Only when that gateway
// is gone — it answered nothing for silence+holderPatience — does the
// request go to the queue group again; a gateway that starts a new
// generation for it (not one that attaches it to the generation it runs)
// makes it a retry, recorded in the act's outcome (schema.ActDone.Retries).
// The request carries the retry it would be (schema.HdrActorRetry), and
// that gateway records it on the ACT stream before the engine is called
// (schema.ActRetries), or generates nothing if the act has an outcome: the
// outcome published first, by whichever runner of the act (one that took
// the turn over attaches to a generation and knows of no retry), carries
// every retry recorded (publishActOutcome).

// silence is how long an act's request may go without a word from the
// gateway before it is sent again.
const silence = 3 * time.Second

// holderPatience is how much longer the gateway that has the act may stay
// silent, the request sent again to it, before it is taken for gone: a
// process that died or is stopped, or one still reconnecting after a NATS
// restart.
const holderPatience = 3 * time.Second

// openReplies returns the reply subject of a new exchange, the channel its
// answers come on, and the function that ends it. Every exchange of the
// replica shares one subscription (s.replies).
func (s *Service) openReplies() (string, <-chan *nats.Msg, func(), error) {
	ch := make(chan *nats.Msg, 64)
	reply, end, err := s.replies.Open(s.Bus.NC, func(m *nats.Msg) {
		select {
		case ch <- m:
		default: // the exchange is not reading: it sends again if it must
		}
	})
	if err != nil {
		return "", nil, nil, fail.Transientf("actor replies: %w", err)
	}
	return reply, ch, end, nil
}

// exchange sends msg (an actor request) and returns the gateway's answer,
// sending the request again as the comment above says, and whether a
// gateway acknowledged it first (it ran, or waited to run). A request sent
// to any gateway again, or one of an act another runner may have
// generated already (run.rerun, until a gateway starts a generation of
// it: an answer a gateway kept of a try, or a generation running that the
// request is attached to, is the other runner's) or
// whose last exchange ended with such a retry outstanding (run.resend),
// is a retry when a gateway starts a new generation for it (its
// acknowledgement says started, not attached): that retry is appended to
// run.retries, with why.
func (s *Service) exchange(ctx context.Context, run *act, msg *nats.Msg) (answer *nats.Msg, acked bool, err error) {
	reply, answers, end, err := s.openReplies()
	if err != nil {
		return nil, false, err
	}
	defer end()
	msg.Reply = reply
	msg.Header.Set(schema.HdrActorProgress, "1") // acknowledgements and progress, please
	// pending is the retry this request is, if a gateway starts a new
	// generation for it from send pendingFrom or a later one: a generation
	// started from an earlier send (a gateway that took the first copy
	// late) is the one the try began with, not a second. Each send from
	// pendingFrom on carries it (HdrActorRetry), as it stands then
	// (carried): the gateway that starts a generation from it records it on
	// the ACT stream before the engine is called, so that the act's
	// outcome carries it whichever runner of the act publishes first.
	var pending *schema.Retry
	pendingReason, pendingFrom := "", 1
	if run.rerun != "" {
		// Outstanding until a gateway starts a generation from it: a try
		// the other runner ran is answered from the record a gateway keeps
		// of it (no acknowledgement, no generation), one it runs is
		// attached to, and the next try may be one the other runner still
		// generates elsewhere.
		pending, pendingReason = &schema.Retry{By: s.replica(), Why: run.rerun}, "rerun"
	}
	resent := run.resend != nil
	if resent {
		// Outstanding since before this exchange (a send that found no
		// gateway, a try a pause aborted, an answer no longer kept): it
		// stays so, for the act's next exchange, until a gateway starts
		// or attaches one (a refusal while paused starts nothing).
		pending, pendingReason = run.resend, run.resendReason
		run.resend = nil
	}
	defer func() {
		// One made here stays outstanding too unless a generation answered
		// the try (or the act has an outcome): after a refusal (paused, or
		// a 503: the gateway could not record the retry), another error
		// with no generation started, the attempt's deadline, a failed
		// send. The copies sent before may have reached a gateway that
		// generates the try. It was dropped (after a pause's refusal, then
		// after a 503), and the next try started unrecorded: a runner that
		// took the turn over, answered from the first generation, could
		// publish an outcome explaining one engine call of two.
		code := ""
		if answer != nil {
			code = answer.Header.Get(micro.ErrorCodeHeader)
		}
		answered := err == nil && answer != nil && (code == "" || code == schema.ActorCodeDone)
		if pending != nil && run.resend == nil && (resent || !answered) {
			run.resend, run.resendReason = pending, pendingReason
		}
	}()
	carried := map[int]schema.Retry{}
	sends := 0
	send := func(subj string) error {
		msg.Subject = subj
		sends++
		msg.Header.Set(schema.HdrActorSend, strconv.Itoa(sends))
		msg.Header.Del(schema.HdrActorRetry)
		if pending != nil {
			if pending.AtMs == 0 {
				pending.AtMs = nowMs()
			}
			h, err := json.Marshal(pending)
			if err != nil {
				return fail.E(fail.Permanent, err)
			}
			msg.Header.Set(schema.HdrActorRetry, string(h))
			carried[sends] = *pending
		}
		if err := s.Bus.NC.PublishMsg(msg); err != nil {
			return fail.Transientf("actor-gateway: %w", err)
		}
		return nil
	}
	if err := send(schema.ActorSubject); err != nil {
		return nil, false, err
	}
	log := zerolog.Ctx(ctx)
	holder, heard, sent := "", time.Now(), time.Now()
	tick := time.NewTicker(silence / 6)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, acked, ctx.Err()
		case m := <-answers:
			if m.Header.Get("Status") == "503" {
				// No responders: no gateway at all, or the one that has the
				// act is not there (gone, or reconnecting).
				if holder == "" {
					// Sent to any gateway, and there is none: the act waits
					// for one (execute's patience), with no attempt spent,
					// though a gateway was heard before (it took the try and
					// went). Sending again until the attempt's deadline spent
					// an attempt, and the act failed at its last as timed
					// out, however long its patience for a gateway. A retry
					// outstanding stays one: the act's next exchange
					// records it if a gateway starts a generation then.
					run.resend, run.resendReason = pending, pendingReason
					return nil, acked, errNoActorGateway
				}
				continue
			}
			heard = time.Now()
			if g := m.Header.Get(schema.HdrActorGateway); g != "" {
				holder = g
			}
			if p := m.Header.Get(schema.HdrActorProgress); p != "" {
				acked = true
				switch {
				case p == schema.ActorStarted && pending != nil && startedFrom(m) >= pendingFrom:
					// As the send it started from carried it: what the
					// gateway recorded (a gateway that does not say which
					// send: as it stands).
					r, ok := carried[startedFrom(m)]
					if !ok {
						r = *pending
					}
					run.retries = append(run.retries, r)
					if pendingReason != "" {
						telemetry.GenerationRetries.WithLabelValues(schema.RoleActor, pendingReason).Inc()
					}
					log.Warn().Str("gateway", holder).Str("why", pending.Why).Msg("act generated again")
					pending, run.rerun = nil, ""
				case p == schema.ActorAttached:
					// The generation that runs: no second one of this
					// try. A rerun stays outstanding all the same: the
					// generation attached to is the other runner's, and
					// its next try may be one the other runner generates
					// elsewhere too (as after a kept answer).
					pending = nil
				}
				continue
			}
			return m, acked, nil // answered from the generation of this try
		case now := <-tick.C:
			quiet := now.Sub(heard)
			if quiet < silence || now.Sub(sent) < silence {
				continue
			}
			sent = now
			if holder != "" && quiet < silence+holderPatience {
				// To the gateway that has it: attached to the generation
				// running there, or answered from the one that ran.
				log.Info().Str("gateway", holder).Dur("silent", quiet.Round(100*time.Millisecond)).Msg("actor-gateway silent; act sent again to it")
				if err := send(schema.ActorInstanceSubject(holder)); err != nil {
					return nil, acked, err
				}
				continue
			}
			// Gone, or never heard of: any gateway. A new generation there
			// is a retry (recorded when it starts); one that has it running
			// attaches the request.
			why, reason := fmt.Sprintf("no actor-gateway acknowledged the request for %s", quiet.Round(100*time.Millisecond)), "unanswered"
			if holder != "" {
				why, reason = fmt.Sprintf("actor-gateway %s answered nothing for %s", holder, quiet.Round(100*time.Millisecond)), "holder_gone"
			}
			if pending == nil {
				pendingFrom = sends + 1
				pending, pendingReason = &schema.Retry{By: s.replica(), From: holder, Why: why}, reason
			} else {
				// A retry outstanding since an earlier send stays that one
				// retry, and keeps what made it (the gateway that had the
				// act and went: its generation may have reached the
				// engine); this send adds its reason. It was overwritten
				// once (an e2e hunt: the gateway that went lost from the
				// record when the send after it found no gateway either).
				if pending.From == "" {
					pending.From = holder
				}
				pending.Why += "; then " + why
			}
			log.Warn().Str("from", holder).Str("why", why).Msg("act sent again to any actor-gateway")
			holder, heard = "", now
			if err := send(schema.ActorSubject); err != nil {
				return nil, acked, err
			}
		}
	}
}

// startedFrom is the send a gateway's "started" acknowledgement says its
// generation started from; a gateway that does not say (an older one) is
// taken at its word that it started a new one.
func startedFrom(m *nats.Msg) int {
	n, err := strconv.Atoi(m.Header.Get(schema.HdrActorSend))
	if err != nil {
		return math.MaxInt
	}
	return n
}

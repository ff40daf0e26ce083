package sessionstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// handleControl takes a trainer's pause or resume of its role. Every one
// is answered: a pause on control.<role>.paused, a resume on
// control.<role>.resumed, and one planact will not apply on
// control.<role>.refused (refuse).
func (s *Service) handleControl(ctx context.Context, m bus.Msg) error {
	_, verb, _ := subject.ParseControl(m.Subject)
	switch verb {
	case "pause":
		return s.handlePause(ctx, m)
	case "resume":
		return s.handleResume(ctx, m)
	}
	return fail.Invalidf("session-store: unexpected subject %s", m.Subject)
}

// handlePause records a pause of a role, then answers it once every
// gateway of the role runs none of its generations. One that a later
// pause or resume of the role overtook changes nothing and is refused.
func (s *Service) handlePause(ctx context.Context, m bus.Msg) error {
	var p schema.Pause
	if err := schema.UnmarshalTrainer(m.Data, m.Header, &p); err != nil {
		return s.refuse(ctx, m, "pause", err)
	}
	if err := schema.CheckRouting(m.Subject, m.Header, &p); err != nil {
		return s.refuse(ctx, m, "pause", err)
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return s.refuse(ctx, m, "pause", err)
	}
	id := m.ID()
	if err := schema.CheckControlID("pause", p.Role, id); err != nil {
		return s.refuse(ctx, m, "pause", err)
	}
	if len(p.Reason) > schema.MaxReason {
		// It is repeated on CONTROL, in control.<role>.expired, and the
		// held work fails with it: there, one too long kept the expiry
		// from ever being said.
		return s.refuse(ctx, m, "pause", fmt.Errorf("pause of %s: reason of %d bytes: want at most %d (planact repeats it when the pause expires)",
			p.Role, len(p.Reason), schema.MaxReason))
	}
	bucket, err := s.sessionsBucket(ctx)
	if err != nil {
		return s.unrecordedControl(ctx, m, "pause", err)
	}
	if err := s.pauseFits(p, bucket.Config.MaxAge); err != nil {
		return s.refuse(ctx, m, "pause", err)
	}
	superseded, expired := false, false
	st, _, err := s.mutateRole(ctx, p.Role, func(v *schema.RoleState) (bool, error) {
		v.Role = p.Role
		superseded, expired = false, false
		if v.Paused && v.PauseID == id {
			return false, nil // this pause, delivered again
		}
		if v.Expiry != nil && v.Expiry.PauseID == id {
			expired = true // this pause, delivered again after it expired
			return false, nil
		}
		if m.Seq != 0 && m.Seq <= v.StateSeq {
			// A later pause or resume was applied: this one, delivered
			// again or handled after it, must not pause the role anew.
			superseded = true
			return false, nil
		}
		now := s.nowMs()
		v.Epoch++
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.Reason = true, p.Mode, id, now, p.Reason
		v.DeadlineMs = now + schema.Seconds(p.TimeoutS).Milliseconds()
		v.StateSeq = max(v.StateSeq, m.Seq)
		return true, nil
	})
	if err != nil {
		return s.unrecordedControl(ctx, m, "pause", err)
	}
	if expired {
		return s.answerExpired(ctx, m, st)
	}
	if superseded {
		zerolog.Ctx(ctx).Info().Str("role", p.Role).Str("pause_id", id).Uint64("seq", m.Seq).Uint64("state_seq", st.StateSeq).
			Msg("pause older than the role's last pause or resume: not applied")
		// Handled after a later one (the trainer's messages are handled
		// at once, up to Concurrency), or delivered again after one: it
		// is refused, unless it was answered. The role's state records
		// the pauses answered; the last answer on control.<role>.paused
		// covers one published but not yet recorded. What was written
		// says so, not a delivery count.
		if answered, err := s.pauseAnswered(ctx, p.Role, st, id); err != nil || answered {
			return err
		}
		return s.refuse(ctx, m, "pause", fmt.Errorf("pause of %s: a later pause or resume of %s (stream sequence %d, this one's %d) was applied first; this one changes nothing",
			p.Role, p.Role, st.StateSeq, m.Seq))
	}
	zerolog.Ctx(ctx).Info().Str("role", p.Role).Str("mode", st.Mode).Int64("epoch", st.Epoch).Msg("role paused")
	if err := s.answerPause(ctx, st); err != nil {
		return s.unansweredPause(ctx, m, st, err)
	}
	return nil
}

// pauseAnswered says whether the pause id of role was answered: the role's
// state st records it, or the last answer on control.<role>.paused names it
// (published, not yet recorded). An answer that cannot be read says
// nothing of whether this pause was answered: an error, not a no.
func (s *Service) pauseAnswered(ctx context.Context, role string, st schema.RoleState, id string) (bool, error) {
	if slices.Contains(st.AnsweredPauses, id) {
		return true, nil
	}
	pm, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "paused"))
	if err != nil || pm == nil {
		return false, err
	}
	var last schema.Paused
	if err := pm.Decode(&last); err != nil {
		return false, fmt.Errorf("pause of %s: the last answer: %w", role, err)
	}
	return last.PauseID == id, nil
}

// answerExpired answers the pause m, delivered again after it ended at its
// time-out (st.Expiry) without an answer: its handler stopped (a crash near
// its deadline) before it answered. The expiry is said on
// control.<role>.expired, where its trainer does not wait; the role works
// again, so the pause is refused, saying so. One answered before is left
// as it is.
func (s *Service) answerExpired(ctx context.Context, m bus.Msg, st schema.RoleState) error {
	x := st.Expiry
	if st.Answered == x.Epoch {
		return nil
	}
	if answered, err := s.pauseAnswered(ctx, st.Role, st, x.PauseID); err != nil || answered {
		return err
	}
	return s.refuse(ctx, m, "pause", fmt.Errorf("pause of %s (epoch %d) ended at its time-out at %s before it was answered: %s; the role works again: pause again",
		st.Role, x.Epoch, time.UnixMilli(x.AtMs).UTC().Format(time.RFC3339), x.Reason))
}

// errAnswered: the pause's answer went out; only its record failed.
var errAnswered = errors.New("the pause was answered")

// unansweredPause handles the pause m, recorded (st holds it), whose answer
// failed with err (its role's gateways or their drained notices could not
// be read). Given up (err cannot pass, or this was the last delivery), it
// was left without a word: its trainer waited for an answer until its
// time-out, and the role stayed paused to the pause's deadline. Now the
// pause is lifted, as a resume would lift it (a new epoch, the role not
// paused), and refused, saying why. One whose answer went out (errAnswered)
// or was answered meanwhile is not refused. It returns err, for the
// consumer to give the message up (or to deliver it again).
func (s *Service) unansweredPause(ctx context.Context, m bus.Msg, st schema.RoleState, err error) error {
	if errors.Is(err, errAnswered) || fail.IsRetryable(err) && m.Delivered < maxDeliveries {
		return err
	}
	zerolog.Ctx(ctx).Error().Err(err).Uint64("delivered", m.Delivered).Msg("pause could not be answered; lifted, and the trainer is told")
	lifted, answered := false, false
	_, _, lerr := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(st.Role), func(v *schema.RoleState, exists bool) (bool, error) {
		lifted, answered = false, v.Answered == st.Epoch
		if !exists || !v.Paused || v.Epoch != st.Epoch || answered {
			return false, nil
		}
		v.Epoch++
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs, v.Reason = false, "", "", 0, 0, ""
		lifted = true
		return true, nil
	})
	if lerr == nil && answered {
		return err
	}
	now := "it holds the role no more (resumed, paused anew or expired meanwhile)"
	switch {
	case lerr != nil:
		now = fmt.Sprintf("it could not be lifted either (%v): it holds the role until a resume, or its time-out at %s",
			lerr, time.UnixMilli(st.DeadlineMs).UTC().Format(time.RFC3339))
	case lifted:
		now = "it is lifted: the role works again"
	}
	cause := fmt.Errorf("pause of %s was recorded, but could not be answered (%d tries): %w; %s; pause again", st.Role, m.Delivered, err, now)
	if rerr := s.refuse(ctx, m, "pause", cause); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// handleResume lets a role's generations go again, from its new weights.
// The version it names becomes the role's newest, whatever it was: a
// version older than the newest is a rollback (the trainer went back to an
// earlier checkpoint), recorded in the role's state and then published on
// control.<role>.rollback; then the resume is answered on
// control.<role>.resumed. A resume delivered again publishes both again
// (their message ids make that idempotent).
func (s *Service) handleResume(ctx context.Context, m bus.Msg) error {
	var r schema.Resume
	if err := schema.UnmarshalTrainer(m.Data, m.Header, &r); err != nil {
		return s.refuse(ctx, m, "resume", err)
	}
	if err := schema.CheckRouting(m.Subject, m.Header, &r); err != nil {
		return s.refuse(ctx, m, "resume", err)
	}
	if err := r.Validate(); err != nil {
		return s.refuse(ctx, m, "resume", err)
	}
	id := m.ID()
	if err := schema.CheckControlID("resume", r.Role, id); err != nil {
		return s.refuse(ctx, m, "resume", err)
	}
	var rollback *schema.RoleRollback
	st, wrote, err := s.mutateRole(ctx, r.Role, func(v *schema.RoleState) (bool, error) {
		v.Role = r.Role
		changed := false
		rollback = nil
		if v.Rollback != nil && v.Rollback.ResumeID == id {
			rollback = v.Rollback // this resume, delivered again: published again
		}
		// A resume older than the role's last pause or resume (delivered
		// again, or handled after a later one) neither ends a pause nor
		// takes the version back; one with no sequence (read some other
		// way) is taken as the latest.
		if m.Seq == 0 || m.Seq > v.StateSeq {
			if v.Paused {
				v.Epoch++
				v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs, v.Reason = false, "", "", 0, 0, ""
				changed = true
			}
			if m.Seq > v.StateSeq {
				v.StateSeq, changed = m.Seq, true
			}
		}
		if r.WeightVersion != "" && (m.Seq == 0 || m.Seq > v.VersionSeq) {
			if r.WeightVersion != v.WeightVersion {
				if schema.Newer(v.WeightVersion, r.WeightVersion) {
					rollback = &schema.RoleRollback{From: v.WeightVersion, To: r.WeightVersion, ResumeID: id, AtMs: s.nowMs()}
					v.Rollback = rollback
				}
				v.WeightVersion, changed = r.WeightVersion, true
			}
			if m.Seq > v.VersionSeq {
				v.VersionSeq, changed = m.Seq, true
			}
		}
		return changed, nil
	})
	if err != nil {
		return s.unrecordedControl(ctx, m, "resume", err)
	}
	log := zerolog.Ctx(ctx)
	if wrote {
		log.Info().Str("role", r.Role).Str("weight_version", r.WeightVersion).Msg("role resumed")
	}
	if rollback != nil {
		log.Warn().Str("role", r.Role).Str("from", rollback.From).Str("to", rollback.To).Msg("role rolled back to older weights; staleness counts from them")
		if err := s.Bus.Publish(ctx, &schema.Rollback{Role: r.Role, From: rollback.From, To: rollback.To, ResumeID: rollback.ResumeID, AtMs: rollback.AtMs}); err != nil {
			return err
		}
	}
	return s.Bus.Publish(ctx, &schema.Resumed{Role: r.Role, ResumeID: id, WeightVersion: st.WeightVersion, Paused: st.Paused, AtMs: s.nowMs()})
}

// pauseFits refuses a pause whose time-out the role's state would not
// outlive. The sessions bucket keeps the state for its TTL, the history,
// from the key's last write, and a pause writes it once: a pause longer
// than that loses its key before the sweep ends it, and a role whose key is
// gone is not paused, so the role would run again without a resume, with
// no expiry said and the work the pause held going on, on weights nobody
// vouched for. The sweep ends a pause up to SweepEvery after its deadline;
// ttl 0 keeps the state for ever.
func (s *Service) pauseFits(p schema.Pause, ttl time.Duration) error {
	if ttl <= 0 {
		return nil
	}
	if timeout := schema.Seconds(p.TimeoutS); timeout+s.SweepEvery >= ttl {
		return fmt.Errorf("pause of %s: timeout_s %g (%v) outlasts the role's state, which planact keeps for the history (--history %v, the %s bucket's TTL) from its last write: want timeout_s under %g (the history less the %v the sweep may take to end a pause at its time-out), or a longer history",
			p.Role, p.TimeoutS, timeout, ttl, s.Bus.Sessions.Bucket(), (ttl - s.SweepEvery).Seconds(), s.SweepEvery)
	}
	return nil
}

// mutateRole is bus.Mutate of role's state, for every write that may
// create its key. A role's pause epochs only grow: a gateway does not
// answer a pause of the epoch it answered last, and the answers' message
// ids (paused.<role>.<epoch>, drained.<role>.<epoch>.<gateway>) name the
// epoch, so JetStream drops an answer to an epoch used before as a
// duplicate, and that pause waits to its deadline. The key, and the count
// with it, may go (deleted or purged by hand, expired at the bucket's
// TTL), so a key created anew starts at the bucket's last revision, read
// from the stream's leader, not at 0: a write adds at most one to the
// epoch and its revision is above the one before, so no epoch is above
// the revision of the write that holds it, and every pause after the key
// went has an epoch above all before, on a cluster and across restarts.
func (s *Service) mutateRole(ctx context.Context, role string, fn func(v *schema.RoleState) (bool, error)) (schema.RoleState, bool, error) {
	return bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(role), func(v *schema.RoleState, exists bool) (bool, error) {
		if !exists {
			bucket, err := s.sessionsBucket(ctx)
			if err != nil {
				return false, err
			}
			v.Epoch = int64(bucket.State.LastSeq)
		}
		return fn(v)
	})
}

// sessionsBucket reads the sessions bucket's stream from its leader: its
// TTL and its last revision.
func (s *Service) sessionsBucket(ctx context.Context) (*jetstream.StreamInfo, error) {
	name := "KV_" + s.Bus.Sessions.Bucket()
	st, err := s.Bus.JS.Stream(ctx, name)
	if err != nil {
		return nil, fail.Transientf("read the %s stream: %w", name, err)
	}
	return st.CachedInfo(), nil
}

// refuse answers a pause or resume (verb) that planact will not apply,
// because of cause, on control.<role>.refused of the role its subject
// names, whatever its body or headers say: only that role's trainer may
// publish on its subject, so it is the one waiting, and only it may read
// there. The answer's message id is the refused message's, so a delivery
// again answers once. A subject that names no role planact has (no stream
// holds one) leaves nobody to tell: the message is given up and logged.
func (s *Service) refuse(ctx context.Context, m bus.Msg, verb string, cause error) error {
	role, _, _ := subject.ParseControl(m.Subject)
	if schema.CheckRole(role) != nil {
		return fail.E(fail.Invalid, cause)
	}
	zerolog.Ctx(ctx).Warn().Err(cause).Str("role", role).Str("id", clipTo(m.ID(), schema.MaxControlID)).Msg(verb + " refused")
	return s.Bus.Publish(ctx, &schema.Refused{Role: role, Verb: verb, ID: clipTo(m.ID(), schema.MaxControlID), Reason: clip(cause.Error()), AtMs: s.nowMs()})
}

// unrecordedControl answers the pause or resume m (verb), which could not
// be recorded because of err, when its message is given up: err cannot
// pass, or this was the last delivery the consumer makes. Given up in
// silence, its trainer waited for an answer that never came. Delivered
// decides only to answer, never what happened: the error says it was not
// recorded. It returns err, for the consumer to give the message up (or,
// before the last delivery, to deliver it again).
func (s *Service) unrecordedControl(ctx context.Context, m bus.Msg, verb string, err error) error {
	if fail.IsRetryable(err) && m.Delivered < maxDeliveries {
		return err
	}
	zerolog.Ctx(ctx).Error().Err(err).Uint64("delivered", m.Delivered).Msg(verb + " given up; the trainer is told")
	role, _, _ := subject.ParseControl(m.Subject)
	cause := fmt.Errorf("%s of %s could not be recorded (%d tries): %w; send it again", verb, role, m.Delivered, err)
	if rerr := s.refuse(ctx, m, verb, cause); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// clip cuts s to what a refusal's reason carries (a hand-written message
// may hold a megabyte where a word belongs, and CONTROL takes small
// messages only), saying how long it was.
func clip(s string) string { return clipTo(s, 4<<10) }

// clipTo cuts s to at most most bytes and what says how long it was.
func clipTo(s string, most int) string {
	if len(s) <= most {
		return s
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// answerPause publishes the Paused answer of the pause st holds, once every
// gateway of the role said it drained (or the pause's deadline passed; the
// answer then names those that did not), and records that it did.
func (s *Service) answerPause(ctx context.Context, st schema.RoleState) error {
	if !st.Paused || st.Answered == st.Epoch {
		return nil
	}
	drained, missing, aborted, err := s.waitDrained(ctx, st)
	if err != nil {
		return err
	}
	ans := &schema.Paused{Role: st.Role, Epoch: st.Epoch, PauseID: st.PauseID, Mode: st.Mode,
		Drained: drained, Missing: missing, Aborted: aborted, AtMs: s.nowMs()}
	if err := s.Bus.Publish(ctx, ans); err != nil {
		return err
	}
	_, _, err = bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(st.Role), func(v *schema.RoleState, _ bool) (bool, error) {
		if v.Epoch != st.Epoch || v.Answered == st.Epoch {
			return false, nil
		}
		v.Answered = st.Epoch
		v.AnsweredPauses = append(v.AnsweredPauses, st.PauseID)
		if n := len(v.AnsweredPauses) - schema.MaxAnsweredPauses; n > 0 {
			v.AnsweredPauses = slices.Delete(v.AnsweredPauses, 0, n)
		}
		return true, nil
	})
	if len(missing) > 0 {
		zerolog.Ctx(ctx).Warn().Str("role", st.Role).Strs("missing", missing).Msg("paused; some gateways did not say they drained")
	}
	if err != nil {
		return fmt.Errorf("%w; recording it: %w", errAnswered, err)
	}
	return nil
}

// waitDrained waits until each gateway of the role that runs (its presence
// recorded, bus.PresentGateways) has said, on
// control.<role>.drained.<gateway>, that it drained for the pause's epoch.
// A gateway that runs no more drops out of the wait: it said it stopped, or
// its presence lease ended (it crashed), and its generations with it.
func (s *Service) waitDrained(ctx context.Context, st schema.RoleState) (drained, missing []string, aborted int, err error) {
	deadline := time.UnixMilli(st.DeadlineMs)
	for {
		ids, err := s.Bus.PresentGateways(ctx, st.Role)
		if err != nil {
			return nil, nil, 0, err
		}
		drained, missing, aborted = nil, nil, 0
		for _, id := range ids {
			m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(st.Role, "drained")+"."+id)
			if err != nil {
				return nil, nil, 0, err
			}
			var d schema.Drained
			if m != nil {
				// Unreadable, it does not say the gateway drained: the
				// gateway is missing, as one that said nothing (the
				// trainer is told it may still generate), and the log
				// says why.
				if err := m.Decode(&d); err != nil {
					zerolog.Ctx(ctx).Error().Err(err).Str("gateway", id).Msg("pause: a drained notice that cannot be read: the gateway counts as missing")
					m = nil
				}
			}
			if m != nil && d.Epoch == st.Epoch {
				drained = append(drained, id)
				aborted += d.Aborted
			} else {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return drained, missing, aborted, nil
		}
		// Still paused this epoch? (A resume may have come meanwhile.)
		cur, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(st.Role))
		if err != nil {
			return nil, nil, 0, err
		}
		if !cur.Paused || cur.Epoch != st.Epoch {
			return drained, missing, aborted, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// noteVersion records a role's weight version seen in an arrival when it is
// newer than the one the role state holds: the trainer's current weights.
//
// An arrival never moves the version back, and is no rollback: arrivals
// run ahead of training (an asynchronous trainer announces rollout N+1
// with the weights it had when it sent it, while it trains on N), arrive
// in any order and are delivered again, so an older version in an arrival
// says when the arrival was written, not what the engine serves now. Only
// a Resume, sent after the trainer swapped its weights and read in order
// on the control stream, says that (handleResume). The decision reads the
// role state from its leader every time: a version noted before a
// rollback is not taken as noted after it.
func (s *Service) noteVersion(ctx context.Context, role, version string) error {
	if version == "" {
		return nil
	}
	_, _, err := s.mutateRole(ctx, role, func(v *schema.RoleState) (bool, error) {
		if v.WeightVersion == version || !schema.Newer(version, v.WeightVersion) {
			return false, nil
		}
		v.Role, v.WeightVersion = role, version
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("note %s weight version: %w", role, err)
	}
	return nil
}

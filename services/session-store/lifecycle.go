package sessionstore

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// handleEpisodeEnd counts an episode end; the end that completes the count
// finishes the rollout.
func (s *Service) handleEpisodeEnd(ctx context.Context, m bus.Msg) error {
	var end schema.EpisodeEnd
	if err := m.Decode(&end); err != nil {
		return err
	}
	sess, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(end.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		if !exists {
			return false, fail.Permanentf("episode end for rollout %d, which has no session", end.Rollout)
		}
		if v.State != schema.SessionRunning {
			return false, nil
		}
		if end.Episode < 0 || end.Episode >= v.Episodes {
			return false, fail.Invalidf("rollout %d has no episode %d", end.Rollout, end.Episode)
		}
		return v.MarkEnded(end.Episode), nil
	})
	if err != nil {
		return rolloutErr(end.Rollout, err)
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	zerolog.Ctx(ctx).Debug().Str("status", end.Status).Int("ended", sess.EndedCount()).Int("episodes", sess.Episodes).Msg("episode ended")
	_ = s.status(ctx, end.Rollout, "episode-"+end.Status, end.Episode, fmt.Sprintf("%d/%d", sess.EndedCount(), sess.Episodes))
	redelivered := m.Delivered > 1 && sess.State == schema.SessionDone
	if !redelivered && (sess.State != schema.SessionRunning || sess.EndedCount() < sess.Episodes) {
		return nil
	}
	// Every replica that sees the full count may get here (a redelivery, a
	// race): assembling twice is wasted work, not a second result, because
	// results are published with deterministic message ids.
	return s.finish(ctx, sess, schema.SessionDone, schema.ResultOK, "", lastTry(m))
}

// handleTimeout ends a rollout whose deadline passed while it was still in
// the state the time-out guards.
func (s *Service) handleTimeout(ctx context.Context, m bus.Msg) error {
	var t schema.Timeout
	if err := m.Decode(&t); err != nil {
		return err
	}
	sess, _, found, err := bus.Get[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(t.Rollout))
	if err != nil || !found {
		return err
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	log := zerolog.Ctx(ctx)
	redelivered := m.Delivered > 1 && sess.State == schema.SessionTimeout
	switch {
	case t.TimeoutKind == schema.TimeoutBarrier && (sess.State == schema.SessionWaiting || redelivered && sess.Episodes == 0):
		log.Warn().Msg("barrier time-out: the other role never arrived")
		return s.finish(ctx, sess, schema.SessionTimeout, schema.ResultTimeout, "barrier time-out: the other role never arrived", lastTry(m))
	case t.TimeoutKind == schema.TimeoutRollout && (sess.State == schema.SessionRunning || redelivered && sess.Episodes > 0):
		log.Warn().Int("ended", sess.EndedCount()).Int("episodes", sess.Episodes).Msg("rollout time-out")
		status := schema.ResultTimeout
		if sess.EndedCount() > 0 {
			status = schema.ResultPartial
		}
		return s.finish(ctx, sess, schema.SessionTimeout, status, "rollout time-out", lastTry(m))
	}
	return nil // the rollout moved on: nothing to do
}

// handleCancel aborts a waiting or running rollout.
func (s *Service) handleCancel(ctx context.Context, m bus.Msg) error {
	var c schema.Cancel
	if err := m.Decode(&c); err != nil {
		return err
	}
	sess, _, found, err := bus.Get[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(c.Rollout))
	if err != nil {
		return err
	}
	redelivered := m.Delivered > 1 && sess.State == schema.SessionAborted
	if !found || (!redelivered && sess.State != schema.SessionWaiting && sess.State != schema.SessionRunning) {
		return nil
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	reason := "aborted by trainer"
	if c.Reason != "" {
		reason += ": " + c.Reason
	}
	zerolog.Ctx(ctx).Warn().Str("reason", reason).Msg("rollout aborted")
	return s.finish(ctx, sess, schema.SessionAborted, schema.ResultAborted, reason, lastTry(m))
}

// finish moves the session to its final state and publishes both roles'
// results. The state is written first, so that every service stops working
// on the rollout; results are published after, and a redelivery that finds
// the state already final publishes them again (idempotently).
// lastTry is false until bad luck would stop the message being redelivered.
func (s *Service) finish(ctx context.Context, sess schema.Session, state, status, reason string, lastTry bool) error {
	final, wrote, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		if !exists || (v.State != schema.SessionWaiting && v.State != schema.SessionRunning) {
			return false, nil
		}
		v.State, v.Reason, v.FinishedMs = state, reason, s.nowMs()
		return true, nil
	})
	if err != nil {
		return err
	}
	if !wrote && final.State != state {
		return nil // another ending won
	}
	if wrote {
		telemetry.RolloutsFinished.WithLabelValues(status).Inc()
	}
	if err := s.publishResults(ctx, final, final.Roles, status, reason, lastTry); err != nil {
		return err
	}
	s.cancelSchedules(ctx, sess.Rollout, schema.TimeoutBarrier, schema.TimeoutRollout)
	return s.status(ctx, sess.Rollout, "finished", -1, status)
}

// publishResults assembles and publishes a result for each role in roles
// (both roles when roles is nil). When the samples cannot be assembled and
// this is the last try, both roles get a failed result that says why, so
// that no trainer waits for a result that will never come.
func (s *Service) publishResults(ctx context.Context, sess schema.Session, roles map[string]schema.RoleInfo, status, reason string, lastTry bool) error {
	var res [2]*schema.Result
	if status == schema.ResultInvalid || sess.State == schema.SessionTimeout && sess.Episodes == 0 {
		for i, role := range []string{schema.RolePlanner, schema.RoleActor} {
			res[i] = &schema.Result{Rollout: sess.Rollout, Role: role, Status: status, Reason: reason}
		}
	} else {
		var err error
		res[0], res[1], err = s.assemble(ctx, sess, status, reason)
		if err != nil && fail.IsRetryable(err) && !lastTry {
			return err
		}
		if err != nil {
			zerolog.Ctx(ctx).Error().Err(err).Msg("samples could not be assembled; the rollout fails")
			why := "samples could not be assembled: " + err.Error()
			for i, role := range []string{schema.RolePlanner, schema.RoleActor} {
				res[i] = &schema.Result{Rollout: sess.Rollout, Role: role, Status: schema.ResultFailed, Reason: why}
			}
		}
	}
	for _, r := range res {
		if roles != nil {
			if _, arrived := roles[r.Role]; !arrived {
				continue
			}
		}
		if err := s.publishResult(ctx, r); err != nil {
			if !lastTry {
				return err
			}
			// The samples cannot be delivered (the object store refuses
			// them, say): the trainer still learns that, and why.
			zerolog.Ctx(ctx).Error().Err(err).Str("role", r.Role).Msg("result could not be published; sending a failed one")
			if ferr := s.Bus.Publish(ctx, &schema.Result{Rollout: r.Rollout, Role: r.Role, Status: schema.ResultFailed,
				Reason: "samples could not be delivered: " + err.Error(), Stats: r.Stats}); ferr != nil {
				return ferr
			}
		}
	}
	return nil
}

// publishResult sends r, moving its samples to the object store when the
// message would be too large to carry them.
func (s *Service) publishResult(ctx context.Context, r *schema.Result) error {
	r.SampleCount = len(r.Samples)
	body, err := schema.Marshal(r)
	if err != nil {
		return fail.E(fail.Permanent, err)
	}
	if len(body) > s.InlineLimit {
		data, err := schema.Marshal(r.Samples)
		if err != nil {
			return fail.E(fail.Permanent, err)
		}
		name := fmt.Sprintf("rollout-%d-%s.samples", r.Rollout, r.Role)
		if _, err := s.Bus.Objects.PutBytes(ctx, name, data); err != nil {
			return fail.Transientf("store %s: %w", name, err)
		}
		r.Samples, r.SamplesObject = nil, name
	}
	return s.Bus.Publish(ctx, r)
}

// cancelSchedules removes pending time-outs of the rollout; a time-out that
// fires anyway finds the rollout moved on and does nothing.
func (s *Service) cancelSchedules(ctx context.Context, n int64, kinds ...string) {
	st, err := s.Bus.JS.Stream(ctx, bus.StreamRollout)
	if err != nil {
		return
	}
	for _, kind := range kinds {
		_ = st.Purge(ctx, jetstream.WithPurgeSubject(subject.TimeoutSchedule(n, kind)))
	}
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms) }

// maxDeliveries is how often the session-store's consumer delivers a
// message before giving it up.
const maxDeliveries = 10

func lastTry(m bus.Msg) bool { return m.Delivered >= maxDeliveries }

package sessionstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// index follows the sessions bucket: every session that still has
// something to happen to it (not final, effects owed, results kept), with
// when it was last written.
type index struct {
	mu      sync.Mutex
	entries map[int64]indexed
	// roles whose state the sweep may have to finish: paused (the pause may
	// expire), or with an expiry not yet announced.
	roles map[string]schema.RoleState
	// replayed is closed once the watch has read every key the bucket
	// held when it began: the sweep's first pass waits for it.
	replayed     chan struct{}
	replayedOnce sync.Once
}

type indexed struct {
	sess schema.Session
	at   time.Time
}

func newIndex() *index {
	return &index{entries: map[int64]indexed{}, roles: map[string]schema.RoleState{}, replayed: make(chan struct{})}
}

func (x *index) putRole(st *schema.RoleState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !st.Paused && (st.Expiry == nil || st.ExpiryAnnounced) {
		delete(x.roles, st.Role)
		return
	}
	x.roles[st.Role] = *st
}

func (x *index) dropRole(role string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.roles, role)
}

func (x *index) roleStates() []schema.RoleState {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]schema.RoleState, 0, len(x.roles))
	for _, st := range x.roles {
		out = append(out, st)
	}
	return out
}

func (x *index) put(n int64, sess *schema.Session, at time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if sess == nil || sess.Final() && len(sess.Outbox) == 0 && len(sess.Objects) == 0 {
		delete(x.entries, n)
		return
	}
	x.entries[n] = indexed{sess: *sess, at: at}
}

func (x *index) snapshot() []indexed {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]indexed, 0, len(x.entries))
	for _, e := range x.entries {
		out = append(out, e)
	}
	return out
}

// sweep follows the sessions and, every SweepEvery, finishes what no
// message finished: effects left in an outbox (a crash between a decision
// and its publishing, a message given up), deadlines whose time-out did not
// fire, results whose retention is over. It runs first as soon as the
// sessions are read, so a start after a crash completes what was pending
// then, not a SweepEvery later.
func (s *Service) sweep(ctx context.Context) error {
	go s.follow(ctx)
	t := time.NewTicker(s.SweepEvery)
	defer t.Stop()
	replayed := s.index.replayed
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-replayed:
			replayed = nil // once
			s.sweepOnce(ctx)
		case <-t.C:
			s.sweepOnce(ctx)
		}
	}
}

// follow keeps the index up to date from a watch of the sessions bucket,
// starting again whenever the watch ends (a NATS restart, say).
func (s *Service) follow(ctx context.Context) {
	// What the index holds of a key gone while the watch was down goes
	// once the watch has replayed what the bucket holds.
	s.Bus.Sessions.Follow(ctx, s.Log, s.index.update, s.index.keepOnly)
}

// update applies one entry of the sessions watch.
func (x *index) update(e jetstream.KeyValueEntry) {
	if role, ok := strings.CutPrefix(e.Key(), "role."); ok {
		if e.Operation() != jetstream.KeyValuePut {
			x.dropRole(role)
			return
		}
		var st schema.RoleState
		if schema.Unmarshal(e.Value(), &st) == nil {
			x.putRole(&st)
		}
		return
	}
	if strings.Contains(e.Key(), ".") {
		return // a task list
	}
	n, err := strconv.ParseInt(e.Key(), 10, 64)
	if err != nil {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		x.put(n, nil, e.Created())
		return
	}
	var sess schema.Session
	if err := schema.Unmarshal(e.Value(), &sess); err != nil {
		return
	}
	x.put(n, &sess, e.Created())
}

// keepOnly drops the sessions and roles whose keys are not in keys, once
// the watch has replayed the bucket (and says the first replay is done).
func (x *index) keepOnly(keys map[string]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	defer x.replayedOnce.Do(func() { close(x.replayed) })
	for n := range x.entries {
		if !keys[schema.SessionKey(n)] {
			delete(x.entries, n)
		}
	}
	for role := range x.roles {
		if !keys[schema.RoleKey(role)] {
			delete(x.roles, role)
		}
	}
}

// sweepOnce looks at every indexed session once, and at every paused role.
func (s *Service) sweepOnce(ctx context.Context) {
	now := s.Now()
	grace := s.Grace
	for _, st := range s.index.roleStates() {
		log := s.Log.With().Str("role", st.Role).Int64("epoch", st.Epoch).Logger()
		switch {
		case st.Paused && !now.Before(time.UnixMilli(st.DeadlineMs)):
			x, err := s.expirePause(ctx, st)
			if err != nil {
				log.Warn().Err(err).Msg("a pause outlived its time-out and could not be ended; will try again")
				continue
			}
			if x != nil {
				telemetry.Recoveries.WithLabelValues(Name, "pause-expired").Inc()
				log.Warn().Str("reason", x.Reason).Msg("a pause outlived its time-out: the work that waited for the role fails, the role works again")
			}
		case !st.Paused && st.Expiry != nil && !st.ExpiryAnnounced && now.Sub(time.UnixMilli(st.Expiry.AtMs)) > grace:
			// The replica that ended the pause did not say so (it stopped
			// between the write and the publish): say it now.
			if err := s.announceExpiry(ctx, st); err != nil {
				log.Warn().Err(err).Msg("the end of an expired pause could not be announced; will try again")
			}
		}
	}
	retention := s.Bus.Provisioning.ResultRetention
	for _, e := range s.index.snapshot() {
		sess := e.sess
		n := sess.Rollout
		var action string
		var err error
		// A deadline comes first: a rollout whose outbox keeps failing (a
		// start that cannot be published, say) still ends by its time-out,
		// and its results then go out within their patience; settled
		// first, it never timed out.
		from, out := resultsOut(&sess)
		switch {
		case sess.State == schema.SessionWaiting && now.After(time.UnixMilli(sess.BarrierDeadlineMs()).Add(grace)):
			action = "barrier-timeout"
			err = s.timeOut(ctx, n, schema.TimeoutBarrier)
		case sess.State == schema.SessionRunning && now.After(time.UnixMilli(sess.DeadlineMs()).Add(grace)):
			action = "rollout-timeout"
			err = s.timeOut(ctx, n, schema.TimeoutRollout)
		case len(sess.Outbox) > 0 && now.Sub(e.at) > grace:
			action = "settle"
			err = s.settleFresh(ctx, n)
		case sess.Final() && len(sess.Objects) > 0 && out && now.After(time.UnixMilli(from).Add(retention+grace)):
			action = "retire"
			err = s.retire(ctx, n)
		default:
			continue
		}
		log := s.Log.With().Int64("rollout", n).Str("action", action).Logger()
		if err != nil {
			// Nothing recovered yet: the next sweep tries again, and counts
			// it when it does.
			log.Warn().Err(err).Msg("sweep could not finish the rollout's pending work; will try again")
			continue
		}
		telemetry.Recoveries.WithLabelValues(Name, action).Inc()
		log.Info().Msg("sweep finished pending work")
	}
}

// settleFresh reads rollout n's session from the leader and settles it.
func (s *Service) settleFresh(ctx context.Context, n int64) error {
	sess, rev, found, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil || !found {
		return err
	}
	return s.settle(ctx, sess, rev)
}

// expirePause ends the pause st holds, whose time-out has passed: in one
// compare-and-set the role is no longer paused (a new epoch) and the state
// records the expiry, so that the gates fail the work that waited for this
// pause and let later work through. Replicas that sweep at once race on the
// role's key: the write that ends the pause is made once, and the one that
// made it announces it on control.<role>.expired. It returns the expiry it
// recorded, nil when the pause had already ended (resumed, paused anew, or
// expired by another replica).
func (s *Service) expirePause(ctx context.Context, st schema.RoleState) (*schema.PauseExpiry, error) {
	now := s.nowMs()
	var x *schema.PauseExpiry
	next, wrote, err := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(st.Role), func(v *schema.RoleState, _ bool) (bool, error) {
		x = nil
		if !v.Paused || v.Epoch != st.Epoch || now < v.DeadlineMs {
			return false, nil
		}
		x = &schema.PauseExpiry{Epoch: v.Epoch, PauseID: v.PauseID, Mode: v.Mode, SinceMs: v.SinceMs, DeadlineMs: v.DeadlineMs, AtMs: now,
			Reason: fmt.Sprintf("pause time-out (%s): no resume came", time.Duration(v.DeadlineMs-v.SinceMs)*time.Millisecond)}
		if v.Reason != "" {
			x.Reason += " (paused for: " + v.Reason + ")"
		}
		v.Epoch++
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs, v.Reason = false, "", "", 0, 0, ""
		v.Expiry, v.ExpiryAnnounced = x, false
		return true, nil
	})
	if err != nil || !wrote {
		return nil, err
	}
	return x, s.announceExpiry(ctx, next)
}

// announceExpiry publishes the expiry st records on control.<role>.expired
// (its message id makes a second publish a duplicate) and records that it did.
func (s *Service) announceExpiry(ctx context.Context, st schema.RoleState) error {
	x := st.Expiry
	if x == nil || st.ExpiryAnnounced {
		return nil
	}
	if err := s.Bus.Publish(ctx, &schema.PauseExpired{Role: st.Role, PauseExpiry: *x}); err != nil {
		return fmt.Errorf("announce the expiry of the %s pause: %w", st.Role, err)
	}
	_, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(st.Role), func(v *schema.RoleState, _ bool) (bool, error) {
		if v.Expiry == nil || v.Expiry.Epoch != x.Epoch || v.ExpiryAnnounced {
			return false, nil
		}
		v.ExpiryAnnounced = true
		return true, nil
	})
	return err
}

// config returns rollout n's configuration, if the index follows it (a
// rollout config never changes).
func (x *index) config(n int64) (schema.Config, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.entries[n]
	return e.sess.Config, ok
}

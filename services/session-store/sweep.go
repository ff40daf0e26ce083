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
	roles   map[string]schema.RoleState // paused roles, whose pause may expire
}

type indexed struct {
	sess schema.Session
	at   time.Time
}

func newIndex() *index {
	return &index{entries: map[int64]indexed{}, roles: map[string]schema.RoleState{}}
}

func (x *index) putRole(st *schema.RoleState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !st.Paused || st.Expired {
		delete(x.roles, st.Role)
		return
	}
	x.roles[st.Role] = *st
}

func (x *index) pausedRoles() []schema.RoleState {
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
// sessions are read, so a start after a crash completes what was pending.
func (s *Service) sweep(ctx context.Context) error {
	go s.follow(ctx)
	t := time.NewTicker(s.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.sweepOnce(ctx)
		}
	}
}

// follow keeps the index up to date from a watch of the sessions bucket,
// starting again whenever the watch ends (a NATS restart, say).
func (s *Service) follow(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := s.Bus.Sessions.WatchAll(ctx)
		if err != nil {
			s.Log.Warn().Err(err).Msg("sessions watch; trying again")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		for e := range w.Updates() {
			if e != nil && strings.HasPrefix(e.Key(), "role.") {
				var st schema.RoleState
				if e.Operation() == jetstream.KeyValuePut && schema.Unmarshal(e.Value(), &st) == nil {
					s.index.putRole(&st)
				}
				continue
			}
			if e == nil || strings.Contains(e.Key(), ".") {
				continue // end of the initial values, or a task list
			}
			n, err := strconv.ParseInt(e.Key(), 10, 64)
			if err != nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.index.put(n, nil, e.Created())
				continue
			}
			var sess schema.Session
			if err := schema.Unmarshal(e.Value(), &sess); err != nil {
				continue
			}
			s.index.put(n, &sess, e.Created())
		}
		_ = w.Stop()
	}
}

// sweepOnce looks at every indexed session once, and at every paused role.
func (s *Service) sweepOnce(ctx context.Context) {
	now := s.Now()
	for _, st := range s.index.pausedRoles() {
		if now.Before(time.UnixMilli(st.DeadlineMs)) {
			continue
		}
		err := s.expirePause(ctx, st)
		telemetry.Recoveries.WithLabelValues(Name, "pause-expired").Inc()
		s.Log.Warn().Err(err).Str("role", st.Role).Int64("epoch", st.Epoch).Msg("a pause outlived its time-out: the role's waiting work fails")
	}
	grace := s.Grace
	retention := s.Bus.Provisioning.ResultRetention
	for _, e := range s.index.snapshot() {
		sess := e.sess
		n := sess.Rollout
		var action string
		var err error
		switch {
		case len(sess.Outbox) > 0 && now.Sub(e.at) > grace:
			action = "settle"
			err = s.settleFresh(ctx, n)
		case sess.State == schema.SessionWaiting && now.After(time.UnixMilli(sess.BarrierDeadlineMs()).Add(grace)):
			action = "barrier-timeout"
			err = s.timeOut(ctx, n, schema.TimeoutBarrier)
		case sess.State == schema.SessionRunning && now.After(time.UnixMilli(sess.DeadlineMs()).Add(grace)):
			action = "rollout-timeout"
			err = s.timeOut(ctx, n, schema.TimeoutRollout)
		case sess.Final() && len(sess.Objects) > 0 && now.After(time.UnixMilli(sess.FinishedMs).Add(retention+grace)):
			action = "retire"
			err = s.retire(ctx, n)
		default:
			continue
		}
		telemetry.Recoveries.WithLabelValues(Name, action).Inc()
		log := s.Log.With().Int64("rollout", n).Str("action", action).Logger()
		if err != nil {
			log.Warn().Err(err).Msg("sweep could not finish the rollout's pending work; will try again")
			continue
		}
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

// expirePause marks the pause st holds as expired: the gateways fail the
// work that waits for the role, saying why, instead of holding it forever.
func (s *Service) expirePause(ctx context.Context, st schema.RoleState) error {
	_, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(st.Role), func(v *schema.RoleState, _ bool) (bool, error) {
		if !v.Paused || v.Expired || v.Epoch != st.Epoch {
			return false, nil
		}
		v.Expired = true
		v.Reason = fmt.Sprintf("pause time-out (%s): no resume came", time.Duration(v.DeadlineMs-v.SinceMs)*time.Millisecond)
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

package actdispatcher

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/planact/planact/pkg/schema"
)

// errRolloutOver is the cause of an act's context when its rollout ended
// (cancelled, timed out) while the act ran.
var errRolloutOver = errors.New("rollout is over")

// aborts cancels the acts in flight of rollouts that end, so that a
// cancelled or timed-out rollout stops calling engines at once instead of
// after the act time-out and its retries.
type aborts struct {
	mu      sync.Mutex
	running map[int64]map[*int]context.CancelCauseFunc
}

// watch returns a context that is cancelled with errRolloutOver when
// rollout n ends; stop releases it.
func (a *aborts) watch(ctx context.Context, n int64) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	tok := new(int)
	a.mu.Lock()
	if a.running == nil {
		a.running = map[int64]map[*int]context.CancelCauseFunc{}
	}
	if a.running[n] == nil {
		a.running[n] = map[*int]context.CancelCauseFunc{}
	}
	a.running[n][tok] = cancel
	a.mu.Unlock()
	return ctx, func() {
		a.mu.Lock()
		delete(a.running[n], tok)
		if len(a.running[n]) == 0 {
			delete(a.running, n)
		}
		a.mu.Unlock()
		cancel(nil)
	}
}

// over cancels every act of rollout n.
func (a *aborts) over(n int64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, cancel := range a.running[n] {
		cancel(errRolloutOver)
	}
	return len(a.running[n])
}

// running is the set of rollouts in the running state, as the sessions
// bucket says, with their sessions.
type running struct {
	mu       sync.Mutex
	sessions map[int64]schema.Session
}

func (r *running) set(n int64, sess *schema.Session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sessions == nil {
		r.sessions = map[int64]schema.Session{}
	}
	if sess == nil || sess.State != schema.SessionRunning {
		delete(r.sessions, n)
		return
	}
	r.sessions[n] = *sess
}

func (r *running) snapshot() []schema.Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]schema.Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		out = append(out, s)
	}
	return out
}

// watchSessions follows the sessions bucket: it keeps the set of running
// rollouts for the watchdog, and aborts the acts of every rollout whose
// session leaves the running state. A watch that ends (NATS restarted)
// starts again.
func (s *Service) watchSessions(ctx context.Context) error {
	for ctx.Err() == nil {
		w, err := s.Bus.Sessions.WatchAll(ctx)
		if err != nil {
			s.Log.Warn().Err(err).Msg("sessions watch; trying again")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for e := range w.Updates() {
			if e == nil || strings.Contains(e.Key(), ".") {
				continue // end of the initial values, or a task list
			}
			n, err := strconv.ParseInt(e.Key(), 10, 64)
			if err != nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.running.set(n, nil)
				continue
			}
			var sess schema.Session
			if err := schema.Unmarshal(e.Value(), &sess); err != nil {
				continue
			}
			s.running.set(n, &sess)
			if !sess.Final() {
				continue
			}
			if k := s.aborts.over(n); k > 0 {
				s.Log.Info().Int64("rollout", n).Str("state", sess.State).Int("acts", k).Msg("rollout over; acts in flight abandoned")
			}
			s.sessions.Forget(n)
		}
		_ = w.Stop()
	}
	return nil
}

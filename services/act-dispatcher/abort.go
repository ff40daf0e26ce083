package actdispatcher

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

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

// watchSessions follows the sessions bucket and aborts the acts of every
// rollout whose session leaves the running state.
func (s *Service) watchSessions(ctx context.Context) error {
	w, err := s.Bus.Sessions.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut || strings.Contains(e.Key(), ".") {
				continue // not a session (tasks), or a deletion
			}
			n, err := strconv.ParseInt(e.Key(), 10, 64)
			if err != nil {
				continue
			}
			var sess schema.Session
			if err := schema.Unmarshal(e.Value(), &sess); err != nil {
				continue
			}
			if sess.State == schema.SessionWaiting || sess.State == schema.SessionRunning {
				continue
			}
			if k := s.aborts.over(n); k > 0 {
				s.Log.Info().Int64("rollout", n).Str("state", sess.State).Int("acts", k).Msg("rollout over; acts in flight abandoned")
			}
		}
	}
}

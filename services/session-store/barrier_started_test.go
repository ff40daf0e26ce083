package sessionstore

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestARolloutInvalidAtTheBarrierNeverStarted: both roles arrived, and the
// rollout cannot run as they asked (here neither brought tasks): it ends
// invalid at the barrier. Its session and both results said it started
// (started_ms) at that moment, a start that never happened. Now they say
// no start; a rollout that runs has one.
func TestARolloutInvalidAtTheBarrierNeverStarted(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		n       int64
		tasks   []schema.Task
		invalid bool
	}{
		{161, nil, true},
		{162, []schema.Task{{Prompt: "p", Label: "l"}}, false},
	} {
		for _, a := range []*schema.Arrive{
			{Rollout: c.n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}, Tasks: c.tasks},
			{Rollout: c.n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}},
		} {
			a.AtMs = time.Now().UnixMilli()
			if err := s.handle(ctx, delivered(t, b, a)); err != nil {
				t.Fatal(err)
			}
		}
		sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(c.n))
		if err != nil {
			t.Fatal(err)
		}
		if !c.invalid {
			if sess.State != schema.SessionRunning || sess.StartedMs == 0 {
				t.Errorf("rollout %d: %s, started_ms %d; want it running, with its start", c.n, sess.State, sess.StartedMs)
			}
			continue
		}
		if sess.Status != schema.ResultInvalid || sess.StartedMs != 0 {
			t.Errorf("rollout %d: %s (%s), started_ms %d; want invalid, never started", c.n, sess.Status, sess.Reason, sess.StartedMs)
		}
		for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
			r := resultOf(t, s, c.n, role)
			if r == nil || r.Status != schema.ResultInvalid || r.Stats.StartedMs != 0 || r.Stats.WallMs != 0 {
				t.Errorf("rollout %d, the %s's result: %+v; want invalid, with no start", c.n, role, r)
			}
		}
	}
}

package sessionstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestDefaultTimeOutsCheckedAgainstTheHistory: the session must outlive
// its rollout (it is kept for the history from its last write, and a
// time-out that finds none answers no one). Only an arrival that carried a
// config was checked: one without got the defaults (a 1800 s barrier, a
// 3600 s rollout) unchecked, and under a shorter history the session went
// while the rollout waited or ran, and its trainers were never answered.
// Now a first arrival without a config whose default barrier outlasts the
// history waits half the history, and a rollout whose arrivals both came without one
// ends invalid at the barrier when the defaults outlast it, each naming
// the defaults and --history. An arrival without a config whose partner's
// config is short enough still runs.
func TestDefaultTimeOutsCheckedAgainstTheHistory(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tasks := []schema.Task{{Prompt: "q", Label: "a"}}
	arrive := func(n int64, role string, cfg *schema.Config, tasks []schema.Task) bus.Msg {
		t.Helper()
		m := delivered(t, b, &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://" + role + ":30000"}, Config: cfg, Tasks: tasks})
		if err := s.handle(ctx, m); err != nil {
			t.Fatalf("rollout %d, %s arrival: %v", n, role, err)
		}
		return m
	}
	session := func(n int64) (schema.Session, bool) {
		t.Helper()
		sess, _, found, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
		if err != nil {
			t.Fatal(err)
		}
		return sess, found
	}
	rejection := func(n int64, role string) *schema.Result {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, role))
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			return nil
		}
		var r schema.Result
		if err := schema.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}

	// An hour of history: the default barrier (30 min) fits, barrier and
	// rollout (1 h 30 min) do not.
	b.Provisioning.History = time.Hour
	arrive(101, schema.RolePlanner, nil, tasks)
	if sess, _ := session(101); sess.State != schema.SessionWaiting {
		t.Fatalf("planner arrived first without a config, under %v of history: %s; want it waiting", b.Provisioning.History, sess.State)
	}
	arrive(101, schema.RoleActor, nil, nil)
	sess, _ := session(101)
	for _, want := range []string{"barrier_timeout_s 1800", "rollout_timeout_s 3600", "--history 1h0m0s"} {
		if sess.State != schema.SessionDone || sess.Status != schema.ResultInvalid || !strings.Contains(sess.Reason, want) {
			t.Fatalf("neither arrival with a config, under an hour of history: %s %s (%q); want invalid, naming %q", sess.State, sess.Status, sess.Reason, want)
		}
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if r := resultOf(t, s, 101, role); r == nil || r.Status != schema.ResultInvalid || r.Reason != sess.Reason {
			t.Errorf("%s result: %+v; want invalid, saying why", role, r)
		}
	}

	// Twenty minutes: not even the default barrier fits. A first arrival
	// without a config waits half the history (refusing it, as this
	// change first did, refused the actor that arrives first in every
	// deployment with a short history, the planner bringing the config).
	b.Provisioning.History = 20 * time.Minute
	arrive(102, schema.RoleActor, nil, nil)
	sess, found := session(102)
	if !found || sess.State != schema.SessionWaiting || schema.Seconds(sess.Config.WithDefaults().BarrierTimeoutS) != 10*time.Minute {
		t.Fatalf("first arrival without a config, under 20 min of history: found %v, %s, barrier %gs; want it waiting 10 min", found, sess.State, sess.Config.BarrierTimeoutS)
	}
	if d := time.UnixMilli(sess.BarrierDeadlineMs()).Sub(time.UnixMilli(sess.CreatedMs)); d != 10*time.Minute {
		t.Errorf("its barrier deadline is %v after it was created; want 10m0s", d)
	}
	if r := rejection(102, schema.RoleActor); r != nil {
		t.Errorf("the actor was refused: %q", r.Reason)
	}

	// A config short enough, brought by the partner, is the rollout's: the
	// arrival without one runs with it.
	arrive(103, schema.RolePlanner, &schema.Config{BarrierTimeoutS: 60, RolloutTimeoutS: 600}, tasks)
	arrive(103, schema.RoleActor, nil, nil)
	if sess, _ := session(103); sess.State != schema.SessionRunning {
		t.Errorf("the actor without a config after the planner with a short one: %s (%q); want running", sess.State, sess.Reason)
	}
	if r := rejection(103, schema.RoleActor); r != nil {
		t.Errorf("the actor was refused: %q", r.Reason)
	}
}

package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestTheWatchdogWaitsOutAPause: an episode whose work waits for a paused
// role's resume (a weight swap may take longer than a stall) has not
// stalled. Before, the watchdog drove it on at its stall, asking the planner
// again (or handing the turn to another runner, which recorded that its
// runner "is gone") while the pause held both. It counts no stall while a
// role is paused, nor from before the pause ended; after that it drives
// stalled work on as before.
func TestTheWatchdogWaitsOutAPause(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	s.Stall, s.PlannerSlack = 100*time.Millisecond, 0
	info := testInfo()
	info.Session.Config.PlannerTimeoutS = 1 // the turn's stall: 1 s
	info.Session.StartedMs = time.Now().Add(-time.Minute).UnixMilli()
	storeSession(t, s, info)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { _ = s.follow.Run(ctx) }()
	setRole := func(st schema.RoleState) {
		t.Helper()
		data, err := schema.Marshal(&st)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Bus.Sessions.Put(ctx, schema.RoleKey(st.Role), data); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the replica to see the role's state", func() bool { return s.follow.Gate(st.Role).State().Epoch == st.Epoch })
	}
	setRole(schema.RoleState{Role: schema.RolePlanner, Paused: true, Epoch: 1, Mode: schema.PauseWait})
	if err := s.Bus.Publish(ctx, &schema.PlanRequest{Rollout: 1, Episode: 0, Turn: 1}); err != nil {
		t.Fatal(err)
	}
	asked := func() uint64 {
		t.Helper()
		m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0))
		if err != nil || m == nil {
			t.Fatalf("the plan request: %v, %v", m, err)
		}
		return m.Seq
	}
	first := asked()
	time.Sleep(1100 * time.Millisecond) // past the turn's stall
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if asked() != first {
		t.Fatal("the planner was asked again while the planner role was paused")
	}
	setRole(schema.RoleState{Role: schema.RolePlanner, Epoch: 2}) // resumed
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if asked() != first {
		t.Fatal("the planner was asked again at once after the resume: the time paused counted as a stall")
	}
	time.Sleep(1100 * time.Millisecond) // a stall after the resume
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if asked() == first {
		t.Error("a turn stalled after the resume was not driven on")
	}
}

// waitFor polls cond until it holds, failing the test when it has not
// within a minute (a hang detector: it holds within milliseconds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

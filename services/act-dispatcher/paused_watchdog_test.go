package actdispatcher

import (
	"context"
	"sync"
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
// stalled work on as before. The watchdog's clock is the test's: the
// episode's progress is its rollout's start, an hour ago, and the clock is
// moved past the stall rather than slept through.
func TestTheWatchdogWaitsOutAPause(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	const stall = time.Minute
	s.Stall = stall
	clock := &testClock{at: time.Now()}
	s.now = clock.now
	info := testInfo()
	info.Session.StartedMs = clock.now().Add(-time.Hour).UnixMilli()
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
	// The planner was never asked (its first request lost, say): the
	// watchdog's stall counts from the rollout's start.
	asked := func() bool {
		t.Helper()
		m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		return m != nil
	}
	setRole(schema.RoleState{Role: schema.RolePlanner, Paused: true, Epoch: 1, Mode: schema.PauseWait})
	clock.add(2 * stall) // the pause holds past another stall
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if asked() {
		t.Fatal("the planner was asked while the planner role was paused")
	}
	setRole(schema.RoleState{Role: schema.RolePlanner, Epoch: 2}) // resumed
	_, resumed := s.follow.Gate(schema.RolePlanner).Held()
	clock.set(resumed) // the replica's clock at the resume
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if asked() {
		t.Fatal("the planner was asked at once after the resume: the time paused counted as a stall")
	}
	clock.add(stall) // a stall after the resume
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if !asked() {
		t.Error("an episode stalled after the resume was not driven on")
	}
}

// testClock is a clock that a test moves (Service.now).
type testClock struct {
	mu sync.Mutex
	at time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *testClock) set(at time.Time) {
	c.mu.Lock()
	c.at = at
	c.mu.Unlock()
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.at = c.at.Add(d)
	c.mu.Unlock()
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

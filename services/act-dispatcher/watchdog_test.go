package actdispatcher

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestWatchdogReadsOnlyWhatMayHaveStalled: the watchdog reads the streams
// for an episode only when it may have stalled: not ended, its rollout
// started at least the stall ago, and no plan message of it that this
// replica handled is that recent. Each of those alone is a lower bound of
// the episode's progress, so nothing skipped can have stalled.
func TestWatchdogReadsOnlyWhatMayHaveStalled(t *testing.T) {
	s := &Service{Deps: Deps{Stall: time.Minute}}
	now := time.Now()
	// A plan message handled is noted at the stream's time: episode 2
	// moved 10 s ago, episode 3 two minutes ago (an older message handled
	// after it, a redelivery, does not make it older), episode 0 of
	// rollout 8 just now.
	for _, m := range []struct {
		subject string
		at      time.Duration
	}{{"plan.7.dag.2", 10 * time.Second}, {"plan.7.answer.3", 2 * time.Minute}, {"plan.7.dag.3", 5 * time.Minute}, {"plan.8.error.0", 0}} {
		_ = s.handlePlan(context.Background(), bus.Msg{Subject: m.subject, Time: now.Add(-m.at)}) // no body: noted, then refused
	}
	sess := schema.Session{Rollout: 7, State: schema.SessionRunning, Episodes: 5, Ended: []int{1}, StartedMs: now.Add(-10 * time.Minute).UnixMilli()}
	if got, want := s.mayHaveStalled(&sess, now), []int{0, 3, 4}; !slices.Equal(got, want) {
		t.Errorf("started 10 min ago, episode 1 ended, 2 moved 10 s ago, 3 two minutes ago: reads %v, want %v", got, want)
	}
	if got := s.mayHaveStalled(&sess, now.Add(49*time.Second)); !slices.Equal(got, []int{0, 3, 4}) {
		t.Errorf("49 s later: reads %v, want [0 3 4]", got)
	}
	if got := s.mayHaveStalled(&sess, now.Add(50*time.Second)); !slices.Equal(got, []int{0, 2, 3, 4}) {
		t.Errorf("a minute after episode 2 moved: reads %v, want [0 2 3 4]", got)
	}
	recent := sess
	recent.StartedMs = now.Add(-59 * time.Second).UnixMilli()
	if got := s.mayHaveStalled(&recent, now); len(got) != 0 {
		t.Errorf("a rollout started within the stall: reads %v, want none", got)
	}
	unknown := sess
	unknown.StartedMs = 0
	if got := s.mayHaveStalled(&unknown, now); !slices.Equal(got, []int{0, 3, 4}) {
		t.Errorf("no start recorded: reads %v, want [0 3 4]", got)
	}
	// Rollout 8 is not running: what was noted of it goes.
	s.moved.keep([]schema.Session{sess})
	if _, ok := s.moved.at(8, 0); ok {
		t.Error("rollout 8 is not running, and its notes are kept")
	}
	if at, ok := s.moved.at(7, 3); !ok || !at.Equal(now.Add(-2*time.Minute)) {
		t.Errorf("episode 3 of the running rollout 7: noted %v %v, want two minutes ago", at, ok)
	}
}

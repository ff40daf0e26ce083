package actdispatcher

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
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

// The plan-parser may publish a streamed turn's last partial plan after
// its final one (it parses the plan so far and the final output apart), so
// that a partial is the episode's last plan message though the planner
// wrote the whole turn. When that turn stalls (its runner gone, its plan
// message not delivered again), the watchdog must drive its run on. Before,
// a partial last meant "the planner stopped mid-plan": it asked the planner
// again at every stall, and the run was never taken over.
func TestTheWatchdogDrivesOnARunWhosePartialCameAfterItsFinalPlan(t *testing.T) {
	t.Parallel()
	s, info, _, ctx := streamedTurn(t)
	a, b := search("a", "x"), search("b", "y")
	partial, final := planDAG(1, true, 1, a), planDAG(1, false, 0, a, b)
	record(t, s, info, 5, partial, final)
	for _, m := range []schema.Message{
		&schema.PlanRequest{Rollout: 1, Episode: 0, Turn: 1},
		&schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 1, Text: "a, b"},
		final, partial,
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	last, err := s.Bus.LastMsg(ctx, bus.StreamPlan, "plan.1.*.0")
	if err != nil || last == nil || last.Subject != subject.PlanDAG(1, 0) {
		t.Fatalf("last plan message %+v, %v: want the partial plan", last, err)
	}
	action, err := s.driveOn(ctx, info, 0, last, nil, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if action != "run" {
		t.Errorf("the watchdog did %q, want %q: the planner wrote the turn, its run stalled", action, "run")
	}
	copied, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanDAG(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if copied.Seq == last.Seq || copied.Header.Get(HdrTakeover) != "5" {
		t.Fatalf("the plan is not published again to take the turn from its runner 5 (last %d, takeover %q)", copied.Seq, copied.Header.Get(HdrTakeover))
	}
	// The copy's handler takes the turn over: the acts run, the turn ends.
	done(t, s, 1, a)
	done(t, s, 1, b)
	if err := handleLast(ctx, s, subject.PlanDAG(1, 0)); err != nil {
		t.Fatal(err)
	}
	if r, _ := runOf(t, s, 1); !r.Finished || r.Runner != copied.Seq {
		t.Errorf("the run after the copy: finished %v, runner %d; want finished by the copy (%d)", r.Finished, r.Runner, copied.Seq)
	}
}

// So too when the turn's final output was an answer, parsed before the
// last partial: the watchdog handles the answer again (the episode ends),
// rather than asking the planner for a turn it answered.
func TestTheWatchdogEndsAnAnsweredTurnWhosePartialCameLast(t *testing.T) {
	t.Parallel()
	s, info, _, ctx := streamedTurn(t)
	a := search("a", "x")
	partial := planDAG(1, true, 1, a)
	record(t, s, info, 5, partial)
	done(t, s, 1, a)
	for _, m := range []schema.Message{
		&schema.PlanRequest{Rollout: 1, Episode: 0, Turn: 1},
		&schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 1, Text: "<answer>x</answer>"},
		&schema.PlanAnswer{Rollout: 1, Episode: 0, Turn: 1, Answers: []string{"x"}},
		partial,
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	last, err := s.Bus.LastMsg(ctx, bus.StreamPlan, "plan.1.*.0")
	if err != nil || last == nil || last.Subject != subject.PlanDAG(1, 0) {
		t.Fatalf("last plan message %+v, %v: want the partial plan", last, err)
	}
	action, err := s.driveOn(ctx, info, 0, last, nil, "w1")
	if err != nil || action != "answer" {
		t.Fatalf("the watchdog did %q (%v), want %q", action, err, "answer")
	}
	if end := episodeEnd(t, s); end.Status != schema.EpisodeCompleted || !slices.Equal(end.Acts, []string{"t1-a"}) {
		t.Errorf("episode end %s, acts %v; want completed, listing t1-a", end.Status, end.Acts)
	}
}

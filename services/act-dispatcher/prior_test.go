package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// finishedTurn1 records turn 1 of rollout 1's episode 0 as finished, its
// search for x done with output out.
func finishedTurn1(t *testing.T, s *Service, out string) {
	t.Helper()
	a := search("a", "x")
	r := &schema.Run{Rollout: 1, Episode: 0, Turn: 1, Complete: true, Finished: true, Nodes: []*schema.NodeState{
		{Node: a, Key: subject.NodeKey(1, "a"), Input: a.Input(), Status: schema.NodeDone, Output: out},
	}}
	_, _, err := bus.Mutate(context.Background(), s.Bus.Runs, schema.RunKey(1, 0, 1), func(v *schema.Run, _ bool) (bool, error) {
		*v = *r
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rolloutInfo is testInfo's rollout 1 as created at createdMs.
func rolloutInfo(createdMs int64) *session.Info {
	info := testInfo()
	info.Session.CreatedMs = createdMs
	return info
}

// Rollout numbers start again when a training run does, once the earlier
// run's sessions are gone, while the act-dispatcher runs on for days. A
// call that repeats one the earlier rollout of the number made in the same
// episode and turn must not be answered with what that rollout cached: its
// output (and the key it names) are another rollout's, wrong observations
// and wrong training data. Before, the finished turns were cached by run
// key alone, and kept until 4096 of them were.
func TestARolloutNumberUsedAgainIsNotAnsweredFromTheEarlierRollout(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := planDAG(2, false, 0, search("b", "x"))
	turn2 := func(info *session.Info, seq uint64, want string) {
		t.Helper()
		if err := s.handleDAG(ctx, info, msg(seq), d); err != nil {
			t.Fatalf("turn 2 of the rollout created at %d: %v", info.Session.CreatedMs, err)
		}
		r, _ := runOf(t, s, 2)
		if n := r.Nodes[0]; n.Status != schema.NodeCached || n.Output != want || n.CachedFrom != subject.NodeKey(1, "a") {
			t.Errorf("turn 2 of the rollout created at %d: node %s is %s with output %q from %q, want cached with %q from t1-a",
				info.Session.CreatedMs, n.Key, n.Status, n.Output, n.CachedFrom, want)
		}
	}

	finishedTurn1(t, s, "x of the earlier rollout")
	turn2(rolloutInfo(1_000), 5, "x of the earlier rollout")

	// The earlier rollout's history is gone; a new one of the number runs
	// the same episode and turn.
	for _, key := range []string{schema.RunKey(1, 0, 1), schema.RunKey(1, 0, 2)} {
		if err := s.Bus.Runs.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	finishedTurn1(t, s, "x of the later rollout")
	turn2(rolloutInfo(2_000), 9, "x of the later rollout")
}

// heldTurns is how many finished turns of rollout n the replica keeps.
func heldTurns(s *Service, n int64) int {
	s.prior.mu.Lock()
	defer s.prior.mu.Unlock()
	if r := s.prior.m[n]; r != nil {
		return len(r.turns)
	}
	return 0
}

// A rollout that ends leaves nothing of it in the replica's memory for
// later: neither its finished turns (kept for its duplicate guard) nor when
// its episodes last moved (the watchdog's). Before, both stayed until
// the cache held 4096 turns, or the watchdog's next sweep.
func TestAnEndedRolloutLeavesNothingCached(t *testing.T) {
	t.Parallel()
	s, _ := testService(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info := rolloutInfo(1_000)
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(1), &info.Session); err != nil {
		t.Fatal(err)
	}
	following := make(chan error, 1)
	go func() { following <- s.follow.Run(ctx) }()
	defer func() {
		cancel()
		<-following
	}()
	finishedTurn1(t, s, "x")
	if err := s.handleDAG(ctx, info, msg(5), planDAG(2, false, 0, search("b", "x"))); err != nil {
		t.Fatal(err)
	}
	s.moved.note(1, 0, time.Now())
	if heldTurns(s, 1) == 0 {
		t.Fatal("turn 1 was not cached: the test does not set up what it means to")
	}

	_, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(1), func(v *schema.Session, _ bool) (bool, error) {
		v.State = schema.SessionDone
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, moved := s.moved.at(1, 0)
		held := heldTurns(s, 1)
		if held == 0 && !moved {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout 1 ended; 10s later the replica still keeps %d of its turns (its progress kept: %v)", held, moved)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package main

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestLowerBoundTerms(t *testing.T) {
	s := func(x float64) time.Duration { return seconds(x) }
	w := func(cp, p, a, head, tail float64, acts int) Work {
		return Work{CriticalPath: s(cp), Planner: s(p), Actor: s(a), Head: s(head), Tail: s(tail), Acts: acts}
	}
	r := RolloutWork{Rollout: 1, Target: 2, Groups: [][]Work{
		{w(10, 4, 6, 1, 2, 2), w(3, 3, 0, 3, 3, 0)}, // group CP 10, planner 7, actor 6
		{w(5, 2, 3, 1, 1, 1)},                       // CP 5, planner 2, actor 3
		{w(20, 50, 90, 2, 2, 5)},                    // CP 20, planner 50, actor 90
	}}
	b := LowerBound([]RolloutWork{r}, [2]int{2, 3}, [2]time.Duration{})
	// Two groups end the rollout: the 2nd shortest group CP is 10; the two
	// least planner works 2+7 = 9 over 2 slots; actor 3+6 = 9 over 3 slots
	// plus the shortest head (1) and tail (1) of an episode with acts.
	if !near(b.CriticalPathS, 10) || !near(b.Planner.BoundS, 4.5) || !near(b.Actor.BoundS, 3+2) {
		t.Errorf("bound %+v", b)
	}
	if !near(b.S, 10) || b.Binding != "critical path" {
		t.Errorf("bound %.2f (%s), want 10 (critical path)", b.S, b.Binding)
	}
	// Swaps: nothing of a role runs while it swaps.
	b = LowerBound([]RolloutWork{r}, [2]int{1, 1}, [2]time.Duration{s(3), s(3)})
	if !near(b.Planner.BoundS, 9+3) || !near(b.Actor.BoundS, 9+3) || b.Binding != "planner engine" {
		t.Errorf("with swaps: %+v", b)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The bound is a lower bound: no schedule that exists ends sooner. The
// replay is such a schedule (eager, engines in arrival order), so on any
// instance it takes at least the bound; with one episode and engines that
// never queue, it takes exactly the critical path.
func TestBoundIsBelowEveryReplay(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 200 {
		m := defaultModel()
		m.Seed = int64(i)
		m.Copies = 1 + rng.IntN(4)
		m.Planner.Limit, m.Actor.Limit = 1+rng.IntN(8), 1+rng.IntN(16)
		m.DepRate = rng.Float64()
		rollouts, prompts := 1+rng.IntN(2), 1+rng.IntN(6)
		var scripts [][]*Episode
		var works []RolloutWork
		targets := make([]int, rollouts)
		for r := range rollouts {
			targets[r] = 1 + rng.IntN(prompts)
			rw := RolloutWork{Rollout: int64(r + 1), Groups: make([][]Work, prompts), Target: targets[r]}
			var eps []*Episode
			for e := range prompts * m.Copies {
				ep := m.Episode(int64(r+1), e)
				eps = append(eps, &ep)
				rw.Groups[m.Group(e)] = append(rw.Groups[m.Group(e)], ep.Work())
			}
			scripts, works = append(scripts, eps), append(works, rw)
		}
		swap := time.Duration(rng.IntN(3)) * time.Second
		abort := rng.IntN(2) == 0
		limits := [2]int{m.Planner.Limit, m.Actor.Limit}
		b := LowerBound(works, limits, [2]time.Duration{time.Duration(rollouts-1) * swap, time.Duration(rollouts-1) * swap})
		for _, order := range []Order{InArrival, LongestPathFirst, OldestRolloutFirst} {
			rep := ReplayRun(&m, scripts, targets, limits, swap, abort, order)
			if rep.S < b.S-1e-9 {
				t.Fatalf("instance %d (order %d): the replay took %.3f s, below the bound %.3f s (%s): the bound is not sound", i, order, rep.S, b.S, b.Binding)
			}
			// Every episode has a planner turn; an episode of one turn has no acts.
			for role, peak := range rep.PeakInFlight {
				if peak > limits[role] || role == 0 && peak < 1 {
					t.Fatalf("instance %d (order %d): engine %d peaked at %d in flight, limit %d", i, order, role, peak, limits[role])
				}
			}
		}
	}
	m := defaultModel()
	m.Copies = 1
	ep := m.Episode(1, 0)
	limits := [2]int{1000, 1000}
	rep := ReplayRun(&m, [][]*Episode{{&ep}}, []int{1}, limits, 0, false, InArrival)
	if cp := ep.Work().CriticalPath.Seconds(); !near(rep.S, cp) {
		t.Errorf("one episode, no queueing: replay %.6f s, critical path %.6f s", rep.S, cp)
	}
	// One episode: one planner turn at a time; its acts that depend on
	// nothing run at once, and never more than a plan has.
	free, most := 0, 0
	for _, turn := range ep.Turns {
		n := 0
		for _, a := range turn.Acts {
			if len(a.Deps) == 0 {
				n++
			}
		}
		free, most = max(free, n), max(most, len(turn.Acts))
	}
	if rep.PeakInFlight[0] != 1 || rep.PeakInFlight[1] < free || rep.PeakInFlight[1] > most {
		t.Errorf("one episode: peaks in flight %v, want planner 1 and actor %d to %d", rep.PeakInFlight, free, most)
	}
	b := LowerBound([]RolloutWork{{Groups: [][]Work{{ep.Work()}}, Target: 1}}, limits, [2]time.Duration{})
	if !near(b.S, rep.S) {
		t.Errorf("one episode: bound %.6f s, replay %.6f s", b.S, rep.S)
	}
}

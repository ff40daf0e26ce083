package chaos_test

import (
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
)

func TestRecoveryOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	fault := at(10)
	ok := chaos.RoleOutcome{Status: schema.ResultOK}
	recs := []chaos.RolloutRecord{
		{Rollout: 1, Episodes: 2, Started: at(1), Planner: ok, Actor: ok},   // episode 0 ended before the fault; 1 moves 4s after
		{Rollout: 2, Episodes: 1, Started: at(2), Planner: ok, Actor: ok},   // its result came before the fault: not in flight
		{Rollout: 3, Episodes: 2, Started: at(9), Planner: ok, Actor: ok},   // episode 0 moves at +1s, episode 1 never
		{Rollout: 4, Episodes: 1, Started: at(12), Planner: ok, Actor: ok},  // started after the fault
		{Rollout: 5, Episodes: 1, Started: at(-60), Planner: ok, Actor: ok}, // stuck since long before the fault
	}
	events := map[int64][]chaos.Event{
		1: {{At: at(5), Episode: 0, What: "end"}, {At: at(14), Episode: 1, What: "act"}},
		2: {{At: at(3), Episode: -1, What: "result"}, {At: at(3), Episode: -1, What: "result"}},
		3: {{At: at(9.5), Episode: 1, What: "plan"}, {At: at(11), Episode: 0, What: "plan"}},
		4: {{At: at(10.5), Episode: 0, What: "plan"}},
		5: {{At: at(-50), Episode: 0, What: "plan"}, {At: at(100), Episode: -1, What: "result"}},
	}
	// Rollout 2 completed before the fault; rollout 4's planner result is
	// stored twice before the actor's: the rollout completes when the
	// actor's is stored, 8s after the fault.
	events[2][0].Role, events[2][1].Role = schema.RolePlanner, schema.RoleActor
	events[4] = append(events[4],
		chaos.Event{At: at(16), Episode: -1, What: "result", Role: schema.RolePlanner},
		chaos.Event{At: at(17), Episode: -1, What: "result", Role: schema.RolePlanner},
		chaos.Event{At: at(18), Episode: -1, What: "result", Role: schema.RoleActor})
	r := chaos.RecoveryOf(fault, recs, func(n int64) []chaos.Event { return events[n] })
	want := chaos.Recovery{InFlight: 3, FirstProgress: 500 * time.Millisecond, NextCompletion: 8 * time.Second, Full: 4 * time.Second, Unrecovered: 1, Stuck: 1, Measured: true}
	if r != want {
		t.Errorf("recovery %+v, want %+v", r, want)
	}

	// A result moves every episode of its rollout.
	events[3] = append(events[3], chaos.Event{At: at(16), Episode: -1, What: "result"})
	r = chaos.RecoveryOf(fault, recs, func(n int64) []chaos.Event { return events[n] })
	if r.Unrecovered != 0 || r.Full != 6*time.Second {
		t.Errorf("after the result: recovery %+v, want every episode moved within 6s", r)
	}

	// A partial result (the rollout's time-out) moves nothing.
	recs[2].Planner.Status, recs[2].Actor.Status = schema.ResultPartial, schema.ResultPartial
	r = chaos.RecoveryOf(fault, recs, func(n int64) []chaos.Event { return events[n] })
	if r.Unrecovered != 1 || r.Full != 4*time.Second {
		t.Errorf("after a partial result: recovery %+v, want one episode never moved", r)
	}
}

func TestPickupOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []chaos.RolloutRecord
	stored := map[int64]time.Time{}
	for i := range 100 {
		n := int64(i)
		recs = append(recs, chaos.RolloutRecord{Rollout: n, Ended: t0.Add(time.Duration(i+1) * time.Millisecond)})
		stored[n] = t0
	}
	recs = append(recs, chaos.RolloutRecord{Rollout: 500, Ended: t0.Add(time.Hour)}) // its result never stored: not counted
	p := chaos.PickupOf(recs, func(n int64) (time.Time, bool) { at, ok := stored[n]; return at, ok })
	if p.Median != 51*time.Millisecond || p.P99 != 100*time.Millisecond || p.Max != 100*time.Millisecond {
		t.Errorf("pickup %+v", p)
	}
}

package main

import (
	"strings"
	"testing"
)

// TestKeptFullSaysWhatTheWorkloadGives: an engine short of its limit is
// not met, and where the zero-cost replay never reached the limit either,
// the goal says how many the workload gives it at once.
func TestKeptFullSaysWhatTheWorkloadGives(t *testing.T) {
	g := keptFull(roleActor, EngFigs{Limit: 256, PeakInFlight: 131}, 135)
	if g.Met || g.Value != 131.0/256 || !strings.Contains(g.Note, "at most 135 at once") || !strings.Contains(g.Note, "planact ran 131") {
		t.Errorf("actor below its limit, replay below it too: %+v", g)
	}
	g = keptFull(rolePlanner, EngFigs{Limit: 128, PeakInFlight: 128}, 128)
	if !g.Met || g.Note != "" {
		t.Errorf("planner at its limit: %+v", g)
	}
	g = keptFull(rolePlanner, EngFigs{Limit: 128, PeakInFlight: 64}, 128)
	if g.Met || g.Note != "" {
		t.Errorf("planner at half its limit where the workload fills it: %+v, want not met and no note", g)
	}
}

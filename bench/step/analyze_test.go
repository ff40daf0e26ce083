package main

import (
	"io"
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

// TestReportNamesTheTopologyRun: the report says which processes served
// planact: with -one-process, one `planact up`, not nats-server and
// `planact serve` per service, and a raw baseline taken beside its idle
// services.
func TestReportNamesTheTopologyRun(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want, not string
	}{
		{nil, "processes: nats-server (compose's nats-1.conf, one node); session-store ×1", "planact up"},
		{[]string{"-one-process"}, "processes: planact up: its embedded server (sync 1s) and the five services in one process", "planact serve"},
	} {
		o, err := parseOptions(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		r := &Report{Options: o, Groups: map[string]GroupFigs{}}
		var b strings.Builder
		r.text(&b, o)
		out := b.String()
		if !strings.Contains(out, tc.want) || strings.Contains(out, tc.not) {
			t.Errorf("%v: the report says\n%s\nwant %q and no %q", tc.args, out, tc.want, tc.not)
		}
		if idle := strings.Contains(out, "while planact's services waited idle"); idle != o.OneProcess {
			t.Errorf("%v: the raw baseline's line says the services waited idle: %v", tc.args, idle)
		}
	}
}

package chaos_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/chaos"
)

func TestSchedule(t *testing.T) {
	for _, top := range []string{chaos.Cluster, chaos.Single} {
		t.Run(top, func(t *testing.T) {
			kinds := chaos.FaultKinds(top)
			o := chaos.ScheduleOptions{Topology: top, Faults: len(kinds), Span: 5 * time.Minute, Seed: 42}
			s := chaos.NewSchedule(o)
			if again := chaos.NewSchedule(o); !slices.Equal(s, again) {
				t.Errorf("the same seed gives another schedule:\n%v\n%v", s, again)
			}
			o.Seed = 43
			if other := chaos.NewSchedule(o); slices.Equal(s, other) {
				t.Errorf("seeds 42 and 43 give the same schedule")
			}
			var got []string
			for i, f := range s {
				got = append(got, f.Kind)
				if f.At <= 0 || f.At >= o.Span {
					t.Errorf("%s at %s, outside the span", f.Kind, f.At)
				}
				if i > 0 && f.At < s[i-1].At {
					t.Errorf("%s at %s comes before %s at %s", f.Kind, f.At, s[i-1].Kind, s[i-1].At)
				}
				if service, ok := strings.CutPrefix(f.Kind, "stop:"); ok && f.Down <= chaos.DefaultAckWaits()[service] {
					t.Errorf("%s stops for %s, not past the ack wait %s", f.Kind, f.Down, chaos.DefaultAckWaits()[service])
				}
				if f.Down <= 0 {
					t.Errorf("%s down %s", f.Kind, f.Down)
				}
			}
			slices.Sort(got)
			want := slices.Clone(kinds)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("kinds %v, want each of %v once", got, want)
			}
			for _, svc := range chaos.ServiceNames {
				if !slices.Contains(kinds, chaos.FaultKill(svc)) {
					t.Errorf("no fault kills %s", svc)
				}
			}
		})
	}
}

func TestScheduleRepeatsKinds(t *testing.T) {
	kinds := []string{chaos.FaultKill(chaos.ActDispatcher), chaos.FaultKillNATS}
	s := chaos.NewSchedule(chaos.ScheduleOptions{Topology: chaos.Single, Faults: 5, Span: time.Minute, Kinds: kinds, Seed: 1})
	if len(s) != 5 {
		t.Fatalf("%d faults, want 5", len(s))
	}
	count := map[string]int{}
	for _, f := range s {
		count[f.Kind]++
	}
	for _, k := range kinds {
		if count[k] < 2 {
			t.Errorf("%s %d times in 5 faults of 2 kinds", k, count[k])
		}
	}
}

package client

import (
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestResultNeedsWhatMayHoldSamples: a result's samples object is skipped
// only when no task outside the groups taken may have samples in it. A
// failed or aborted episode that ended leaves samples there when its group
// was not delivered (a rollout cut short); a result that leaves the
// delivered groups out holds only what the caller lacks.
func TestResultNeedsWhatMayHoldSamples(t *testing.T) {
	task := func(g int, state string) schema.TaskOutcome { return schema.TaskOutcome{GroupIndex: g, State: state} }
	cases := []struct {
		name  string
		taken []int
		r     schema.Result
		want  bool
	}{
		{"nothing taken", nil, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained)}}, true},
		{"every trained task taken", []int{0, 1}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained), task(1, schema.TaskTrained)}}, false},
		{"filtered and empty outside", []int{0}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained), task(1, schema.TaskFiltered), task(2, schema.TaskEmpty)}}, false},
		{"trained outside", []int{0}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained), task(1, schema.TaskTrained)}}, true},
		{"failed outside", []int{0}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained), task(1, schema.TaskFailed)}}, true},
		{"aborted outside", []int{0}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained), task(1, schema.TaskAborted)}}, true},
		{"groups left out", []int{0}, schema.Result{Tasks: []schema.TaskOutcome{task(0, schema.TaskTrained)}, DeliveredGroups: []int{0}}, true},
	}
	for _, c := range cases {
		var o resultOptions
		WithoutGroups(c.taken...)(&o)
		if got := o.needs(&c.r); got != c.want {
			t.Errorf("%s: needs %v, want %v", c.name, got, c.want)
		}
	}
}

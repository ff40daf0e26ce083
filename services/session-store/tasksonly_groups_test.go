package sessionstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestResultsWithoutTasksNameOnlyGroupsSent: a group recorded delivered
// whose message could not go out is given up, and the results go out
// failed. When the tasks could not be read either, those results named
// every group recorded delivered as streamed, the one given up too, and a
// trainer reading the groups waited for its message until its deadline.
// Now they name only the groups whose messages went out.
func TestResultsWithoutTasksNameOnlyGroupsSent(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 173
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}}
	endedRollout(t, s, n, cfg, tasks, nil, "group:1", schema.EffectResults, schema.EffectCleanup)
	// Group 0 went out before; group 1 was decided, and its message is
	// still owed.
	sess, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.Groups = []schema.GroupState{{Index: 0, State: schema.GroupDelivered}, {Index: 1, State: schema.GroupDelivered}}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.taskCache.drop(n) // no task list: gone
	s.failing.note(identify(&sess), s.Now().Add(-2*s.ResultPatience))
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := resultOf(t, s, n, role)
		if r == nil || r.Status != schema.ResultFailed || !strings.Contains(r.Reason, "group 1: ") || !strings.Contains(r.Reason, "could not be read either") {
			t.Fatalf("%s result: %+v; want failed, naming group 1 and the tasks that could not be read", role, r)
		}
		if !slices.Equal(r.StreamedGroups, []int{0}) {
			t.Errorf("%s result names groups %v streamed; want [0]: group 1's message never went out", role, r.StreamedGroups)
		}
	}
}

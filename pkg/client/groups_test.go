package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
)

// TestGroupsCatchUpAndEnd: groups published before the stream started are
// found (the last group message lists them all), one published while it
// runs comes by subscription, and the result ends the stream; a group the
// last message does not list (published out of order) is found from the
// result's tasks.
func TestGroupsCatchUpAndEnd(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 77
	group := func(g int, delivered ...int) *schema.Group {
		return &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Delivered: delivered, Groups: 5,
			Samples: []schema.Sample{{GroupIndex: g, Index: g, RolloutID: "77-0"}},
			Tasks:   []schema.TaskOutcome{{Episode: g, GroupIndex: g, Index: g, State: schema.TaskTrained}}}
	}
	// Group 1 was decided after group 2 but published before it: the last
	// message (group 2's) does not list it.
	for _, g := range []*schema.Group{group(4, 4), group(1, 4, 2, 1), group(2, 4, 2)} {
		if err := b.Publish(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	var got []int
	for g, err := range c.Groups(ctx, n, schema.RoleActor) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, g.GroupIndex)
		if len(g.Samples) != 1 || g.Samples[0].GroupIndex != g.GroupIndex {
			t.Errorf("group %d samples %+v", g.GroupIndex, g.Samples)
		}
		switch len(got) {
		case 2:
			if err := b.Publish(ctx, group(3, 4, 2, 1, 3)); err != nil {
				t.Fatal(err)
			}
		case 3:
			var tasks []schema.TaskOutcome
			for i := range 5 {
				tasks = append(tasks, schema.TaskOutcome{Episode: i, GroupIndex: i, Index: i, State: schema.TaskTrained})
			}
			if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if fmt.Sprint(got) != "[4 2 3 1]" {
		t.Fatalf("groups %v: want 4 and 2 (listed by the last), 3 (as it came), 1 (named by the result)", got)
	}
	seen := map[int]bool{}
	for _, g := range got {
		if seen[g] {
			t.Errorf("group %d yielded twice", g)
		}
		seen[g] = true
	}
	if seen[0] {
		t.Error("group 0 was never published")
	}
}

// TestGroupsEndsWithTheContext: no result, the stream ends with ErrTimeout.
func TestGroupsEndsWithTheContext(t *testing.T) {
	_, url := bustest.Server(t)
	bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var last error
	for g, err := range c.Groups(ctx, 78, schema.RolePlanner) {
		if g != nil {
			t.Fatalf("a group of a rollout that has none: %+v", g)
		}
		last = err
	}
	if !errors.Is(last, client.ErrTimeout) {
		t.Fatalf("the stream ended with %v, want ErrTimeout", last)
	}
}

// TestResultChecksTheGroupsCount: a result that leaves the delivered
// groups out (result_samples undelivered) is made whole from their
// messages, and their samples must be what it counts in them
// (group_samples), as its own must be its sample_count; otherwise Result
// says so, naming both counts.
func TestResultChecksTheGroupsCount(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, counted := range []int{3, 4, 5} {
		n := int64(80 + i)
		var tasks []schema.TaskOutcome
		for g := range 3 {
			grp := &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Delivered: []int{0, 1, 2}[:g+1], Groups: 3,
				Samples: []schema.Sample{{GroupIndex: g, Index: g, RolloutID: fmt.Sprintf("%d-%d", n, g)}}, SampleCount: 1,
				Tasks: []schema.TaskOutcome{{Episode: g, GroupIndex: g, Index: g, State: schema.TaskTrained}}}
			if g < 2 {
				if err := b.Publish(ctx, grp); err != nil {
					t.Fatal(err)
				}
			}
			tasks = append(tasks, grp.Tasks...)
		}
		// Group 2 is not delivered: its sample is the result's own (5:
		// the result counts two of its own).
		own, groups := 1, counted-1
		if counted == 5 {
			own, groups = 2, 2
		}
		if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks,
			Samples: []schema.Sample{{GroupIndex: 2, Index: 2, RolloutID: fmt.Sprintf("%d-2", n)}}, SampleCount: own,
			DeliveredGroups: []int{0, 1}, GroupSamples: groups}); err != nil {
			t.Fatal(err)
		}
		r, err := c.Result(ctx, n, schema.RoleActor)
		switch counted {
		case 3:
			if err != nil || len(r.Samples) != 3 || r.Samples[0].GroupIndex != 0 || r.Samples[2].GroupIndex != 2 {
				t.Errorf("groups that hold what the result counts: %v, %d samples", err, len(r.Samples))
			}
		case 4:
			want := "the 2 groups its actor result names delivered hold 2 samples, the result counts 3 (group_samples)"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("groups short of group_samples: %v, want an error saying %q", err, want)
			}
		default:
			want := "its actor result holds 1 samples and counts 2 (sample_count)"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("a result short of its sample_count: %v, want an error saying %q", err, want)
			}
		}
	}
}

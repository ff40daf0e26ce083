package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
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
			Samples: []schema.Sample{{GroupIndex: g, Index: g, RolloutID: "77-0"}}, SampleCount: 1,
			Tasks: []schema.TaskOutcome{{Episode: g, GroupIndex: g, Index: g, State: schema.TaskTrained}}}
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
	_, b, c, ctx := planactClient(t)
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

// twoGroups publishes groups 0 and 1 of rollout n (one sample each, group
// 1 counting counted) and returns the tasks of three groups: group 2 was
// filtered.
func twoGroups(ctx context.Context, t *testing.T, b *bus.Bus, n int64, counted int) []schema.TaskOutcome {
	t.Helper()
	var tasks []schema.TaskOutcome
	for g := range 3 {
		state := schema.TaskTrained
		if g == 2 {
			state = schema.TaskFiltered
		}
		grp := &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Delivered: []int{0, 1}[:g%2+1], Groups: 3,
			Samples: []schema.Sample{{GroupIndex: g, Index: g, RolloutID: fmt.Sprintf("%d-%d", n, g)}}, SampleCount: 1,
			Tasks: []schema.TaskOutcome{{Episode: g, GroupIndex: g, Index: g, State: state}}}
		if g == 1 {
			grp.SampleCount = counted
		}
		if g < 2 {
			if err := b.Publish(ctx, grp); err != nil {
				t.Fatal(err)
			}
		}
		tasks = append(tasks, grp.Tasks...)
	}
	return tasks
}

// groupsOf runs the stream of role's groups of rollout n to its end: the
// groups yielded, and the errors.
func groupsOf(ctx context.Context, c *client.Client, n int64) (got []int, errs []error) {
	for g, err := range c.Groups(ctx, n, schema.RoleActor) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got = append(got, g.GroupIndex)
	}
	return got, errs
}

// TestResultChecksItsCountWhateverWasTaken: a result's own samples must be
// what it counts (sample_count) also when the caller took groups
// (WithoutGroups): they are counted before the groups taken are left out,
// so a result that lost samples is not taken for one whose samples the
// caller has.
func TestResultChecksItsCountWhateverWasTaken(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	sample := func(n int64, g int) schema.Sample {
		return schema.Sample{GroupIndex: g, Index: g, RolloutID: fmt.Sprintf("%d-%d", n, g)}
	}
	cases := []struct {
		name          string
		undelivered   bool // the result leaves the delivered groups out
		held, counted int
		want          string // "": no error
	}{
		{"every sample, as counted", false, 3, 3, ""},
		{"every sample, one short", false, 3, 4, "its actor result holds 3 samples and counts 4 (sample_count)"},
		{"groups left out, as counted", true, 1, 1, ""},
		{"groups left out, two short", true, 1, 3, "its actor result holds 1 samples and counts 3 (sample_count)"},
	}
	for i, tc := range cases {
		n := int64(90 + i)
		tasks := twoGroups(ctx, t, b, n, 1)
		r := &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks, SampleCount: tc.counted}
		if tc.undelivered {
			r.Samples, r.DeliveredGroups, r.GroupSamples = []schema.Sample{sample(n, 2)}, []int{0, 1}, 2
		} else {
			r.Samples = []schema.Sample{sample(n, 0), sample(n, 1), sample(n, 2)}
		}
		if err := b.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
		got, err := c.Result(ctx, n, schema.RoleActor, client.WithoutGroups(0, 1))
		switch {
		case tc.want == "" && (err != nil || len(got.Samples) != 1 || got.Samples[0].GroupIndex != 2):
			t.Errorf("%s: %v, %+v: want group 2's sample alone", tc.name, err, got)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestGroupsHoldWhatTheyCount: a group's samples must be what it counts
// (sample_count) wherever it is read: by Result, for a result that leaves
// it out (whether or not the groups' total is right, whatever was taken),
// and by Groups; otherwise they say so, naming both counts.
func TestGroupsHoldWhatTheyCount(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 95
	// Group 1 holds one sample and counts two; the result counts the two
	// the groups hold.
	tasks := twoGroups(ctx, t, b, n, 2)
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks,
		DeliveredGroups: []int{0, 1}, GroupSamples: 2}); err != nil {
		t.Fatal(err)
	}
	const want = "rollout 95: its actor group 1 holds 1 samples and counts 2 (sample_count)"
	for _, taken := range [][]int{nil, {0}} {
		if _, err := c.Result(ctx, n, schema.RoleActor, client.WithoutGroups(taken...)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("result without groups %v: %v, want an error saying %q", taken, err, want)
		}
	}
	got, errs := groupsOf(ctx, c, n)
	if fmt.Sprint(got) != "[0]" || len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
		t.Errorf("groups %v, errors %v: want group 0, and an error saying %q", got, errs, want)
	}
}

// TestGroupsReadFromAFollowerBehind: once the result is out, every group
// that it (with result_samples undelivered) or the last group message
// names delivered is read until it is, though the reads that any replica
// may answer first get no answer, then nothing (a follower that has not
// seen the group): the stream used to end there, the group skipped.
func TestGroupsReadFromAFollowerBehind(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, undelivered := range []bool{true, false} {
		c, err := client.New(bustest.Conn(t, url))
		if err != nil {
			t.Fatal(err)
		}
		c.Recheck = 100 * time.Millisecond
		// The result names the groups: every group read lags, the last
		// group message's too. Otherwise the last group message names them.
		client.LagGroupReads(c, 2, undelivered)
		n := int64(96 + i)
		tasks := twoGroups(ctx, t, b, n, 1)
		r := &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks}
		if undelivered {
			r.DeliveredGroups, r.GroupSamples = []int{0, 1}, 2
		} else {
			r.Samples, r.SampleCount = []schema.Sample{{GroupIndex: 0, RolloutID: "0"}, {GroupIndex: 1, Index: 1, RolloutID: "1"}}, 2
		}
		if err := b.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got, errs := groupsOf(ctx, c, n); fmt.Sprint(got) != "[0 1]" || len(errs) > 0 {
			t.Errorf("undelivered %v: groups %v, errors %v: want groups 0 and 1", undelivered, got, errs)
		}
	}
}

// TestGroupsFailNamingADeliveredGroupNotRead: a group the result names
// delivered that cannot be read by the end of the wait ends the stream
// with ErrTimeout naming the group, not as if the stream were whole.
func TestGroupsFailNamingADeliveredGroupNotRead(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const n = 98
	grp := &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: 0, Delivered: []int{0}, Groups: 2,
		Samples: []schema.Sample{{RolloutID: "98-0"}}, SampleCount: 1, Tasks: []schema.TaskOutcome{{State: schema.TaskTrained}}}
	if err := b.Publish(ctx, grp); err != nil {
		t.Fatal(err)
	}
	// Group 1 never comes.
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK,
		Tasks:           []schema.TaskOutcome{{State: schema.TaskTrained}, {Episode: 1, GroupIndex: 1, State: schema.TaskTrained}},
		DeliveredGroups: []int{0, 1}, GroupSamples: 2}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	got, errs := groupsOf(wctx, c, n)
	const want = "group 1 of rollout 98, named delivered"
	if fmt.Sprint(got) != "[0]" || len(errs) != 1 || !errors.Is(errs[0], client.ErrTimeout) || !strings.Contains(errs[0].Error(), want) {
		t.Errorf("groups %v, errors %v: want group 0, then ErrTimeout saying %q", got, errs, want)
	}
}

// TestGroupsGoByTheArrival: as Result does, Groups goes by the client's
// arrival. A rejection of another arrival is passed over; one of the
// client's ends the stream with ErrRejected (it used to wait for a result
// until ctx ended, and end with ErrTimeout); and the groups of a rollout
// that ended before the arrival (an earlier run's, of the same number) are
// not yielded as the trainer's (they were, and the stream ended as if
// whole).
func TestGroupsGoByTheArrival(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Each stream has a wait of its own: one that waited out its context
	// leaves the others theirs.
	groups := func(n int64) ([]int, []error) {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		return groupsOf(wctx, c, n)
	}
	publish := func(ms ...schema.Message) {
		t.Helper()
		for _, m := range ms {
			if err := b.Publish(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	arrive := func(n int64) *schema.Arrive {
		t.Helper()
		a := &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://e"}, AtMs: time.Now().UnixMilli(),
			Nonce: "0f0f0f0f0f0f0f0f"} // set, so that a.MsgID() is the id sent
		if err := c.Arrive(ctx, a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	group := func(n int64) *schema.Group {
		return &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: 0, Delivered: []int{0}, Groups: 1,
			Samples: []schema.Sample{{RolloutID: fmt.Sprintf("%d-0", n)}}, SampleCount: 1,
			Tasks: []schema.TaskOutcome{{State: schema.TaskTrained}}}
	}
	tasks := []schema.TaskOutcome{{State: schema.TaskTrained}}

	// A rejection of an earlier arrival, then the rollout runs.
	a := arrive(120)
	publish(&schema.Result{Rollout: 120, Role: schema.RoleActor, Status: schema.ResultInvalid, Reason: "config max_turns 2, was 3",
		ArrivalID: "arrive.120.actor..1", Rejected: true},
		group(120), &schema.Result{Rollout: 120, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks,
			ArrivalID: a.MsgID(), Stats: schema.Stats{FinishedMs: time.Now().UnixMilli()}})
	if got, errs := groups(120); fmt.Sprint(got) != "[0]" || len(errs) > 0 {
		t.Errorf("another arrival refused: groups %v, errors %v; want group 0", got, errs)
	}

	// The client's arrival refused.
	a = arrive(121)
	publish(&schema.Result{Rollout: 121, Role: schema.RoleActor, Status: schema.ResultInvalid, Reason: "unknown field \"config.max_turn\"",
		ArrivalID: a.MsgID(), Rejected: true})
	if got, errs := groups(121); len(got) > 0 || len(errs) != 1 || !errors.Is(errs[0], client.ErrRejected) || !strings.Contains(errs[0].Error(), "config.max_turn") {
		t.Errorf("the arrival refused: groups %v, errors %v; want ErrRejected with its reason", got, errs)
	}

	// An earlier run's rollout 122, ended before the arrival.
	ended := time.Now().Add(-time.Hour).UnixMilli()
	publish(group(122), &schema.Result{Rollout: 122, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks,
		ArrivalID: "arrive.122.actor..1", Stats: schema.Stats{FinishedMs: ended}})
	arrive(122)
	if got, errs := groups(122); len(got) > 0 || len(errs) != 1 || !errors.Is(errs[0], client.ErrRejected) || !strings.Contains(errs[0].Error(), "already ended") {
		t.Errorf("a rollout that ended before the arrival: groups %v, errors %v; want none, and ErrRejected", got, errs)
	}
}

// TestGroupsReadStreamedGroupsFromAFollowerBehind: with result_samples all
// the result held every sample but named no group delivered, so a group
// that no group message named (published out of order) was looked for
// once, and a follower that had not seen it yet answered "nothing there":
// the stream ended without it, as if whole. The result now names every
// group streamed (streamed_groups), and each is read until it is there.
func TestGroupsReadStreamedGroupsFromAFollowerBehind(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c.Recheck = 100 * time.Millisecond
	client.LagGroupReads(c, 2, false) // each group's own read lags; the last group message reads
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 99
	var tasks []schema.TaskOutcome
	for g := range 2 {
		// Each message names only itself delivered: group 0's is named
		// by no later one.
		grp := &schema.Group{Rollout: n, Role: schema.RoleActor, GroupIndex: g, Delivered: []int{g}, Groups: 2,
			Samples: []schema.Sample{{GroupIndex: g, Index: g, RolloutID: fmt.Sprintf("%d-%d", n, g)}}, SampleCount: 1,
			Tasks: []schema.TaskOutcome{{Episode: g, GroupIndex: g, Index: g, State: schema.TaskTrained}}}
		if err := b.Publish(ctx, grp); err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, grp.Tasks...)
	}
	if err := b.Publish(ctx, &schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK, Tasks: tasks,
		Samples:     []schema.Sample{{GroupIndex: 0, RolloutID: "99-0"}, {GroupIndex: 1, Index: 1, RolloutID: "99-1"}},
		SampleCount: 2, StreamedGroups: []int{0, 1}}); err != nil {
		t.Fatal(err)
	}
	if got, errs := groupsOf(ctx, c, n); fmt.Sprint(got) != "[0 1]" && fmt.Sprint(got) != "[1 0]" || len(errs) > 0 {
		t.Errorf("groups %v, errors %v: want groups 0 and 1", got, errs)
	}
}

// planactClient is a server, planact's bus on it, a trainer's client and a
// context that ends with the test or after 30 s.
func planactClient(t *testing.T) (url string, b *bus.Bus, c *client.Client, ctx context.Context) {
	t.Helper()
	_, url = bustest.Server(t)
	b = bustest.Bus(t, url, "planact")
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return url, b, c, ctx
}

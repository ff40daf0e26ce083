package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
)

func TestCacheSeesStateChangesAndKeepsTasks(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	c := &session.Cache{KV: b.Sessions, Fresh: 20 * time.Millisecond}

	if _, err := c.Get(ctx, 1); fail.KindOf(err) != fail.Permanent {
		t.Errorf("unknown rollout: %v, want a permanent error", err)
	}
	sess := &schema.Session{Rollout: 1, State: schema.SessionRunning, Episodes: 1,
		Roles: map[string]schema.RoleInfo{schema.RoleActor: {Engine: schema.Engine{URL: "http://actor"}}}}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(1), sess); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, 1); fail.KindOf(err) != fail.Permanent {
		t.Errorf("rollout without tasks: %v, want a permanent error", err)
	}
	c.Forget(1)
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(1), &schema.TaskList{Tasks: []schema.Task{{Prompt: "q"}}}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Active() || len(info.Tasks) != 1 {
		t.Fatalf("info %v, tasks %d", info, len(info.Tasks))
	}
	if _, err := info.Task(3); err == nil {
		t.Error("Task(3) of a one-task rollout: want an error")
	}
	if e, _, err := info.Engine(schema.RoleActor); err != nil || e.URL != "http://actor" {
		t.Errorf("actor engine %v %v", e, err)
	}
	if _, _, err := info.Engine(schema.RolePlanner); err == nil {
		t.Error("planner engine of a rollout without one: want an error")
	}

	_, _, err = bus.Mutate(ctx, b.Sessions, schema.SessionKey(1), func(s *schema.Session, _ bool) (bool, error) {
		s.State = schema.SessionAborted
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := c.Get(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Active() {
			if len(info.Tasks) != 1 {
				t.Errorf("tasks lost on refresh: %d", len(info.Tasks))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache never saw the rollout abort")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A follower that has not yet seen a rollout start answers a direct get
// with the session still waiting; the cache must not make a service drop
// the rollout's work on that: a state that is not running is read again
// from the leader (issue: a plan request dropped on a cluster as "rollout
// over" and its episode stranded).
func TestCacheDoesNotDropWorkOnAStaleRead(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	sess := &schema.Session{Rollout: 3, State: schema.SessionRunning, Episodes: 1}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(3), sess); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(3), &schema.TaskList{Tasks: []schema.Task{{Prompt: "q"}}}); err != nil {
		t.Fatal(err)
	}
	defer session.LagDirectReads()()
	c := &session.Cache{KV: b.Sessions}
	info, err := c.Get(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Active() {
		t.Fatalf("a running rollout read as %s: its work would be dropped", info.Session.State)
	}
}

// A rollout that ended may have had its task list removed already: its
// session still reads, as not running, so that its late work is dropped
// quietly instead of failing with "no tasks".
func TestCacheReadsAnEndedRolloutWithoutTasks(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	sess := &schema.Session{Rollout: 4, State: schema.SessionDone, Episodes: 2}
	if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(4), sess); err != nil {
		t.Fatal(err)
	}
	info, err := (&session.Cache{KV: b.Sessions}).Get(ctx, 4)
	if err != nil {
		t.Fatalf("an ended rollout without tasks: %v", err)
	}
	if info.Active() {
		t.Errorf("rollout 4 reads as running: %v", info)
	}
}

// TestTaskObjectChangedIsRefused: a task list in the object store is read
// as the arrival that named it saw it; an object put again under its name
// with other tasks is refused, not run.
func TestTaskObjectChangedIsRefused(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	put := func(prompt string) string {
		data, err := schema.Marshal(&schema.TaskList{Tasks: []schema.Task{{Prompt: prompt}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Tasks[schema.RolePlanner].PutBytes(ctx, "rollout-5-planner.tasks", data); err != nil {
			t.Fatal(err)
		}
		return schema.DigestSHA256 + bus.SHA256(data) // what the arrival names (tasks_sha256)
	}
	digest := put("first")
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(5), &schema.TaskList{Object: "rollout-5-planner.tasks", From: schema.RolePlanner, Digest: digest}); err != nil {
		t.Fatal(err)
	}
	tl, found, err := session.LoadTaskList(ctx, b.Sessions, b.NC, 5)
	if err != nil || !found || len(tl.Tasks) != 1 || tl.Tasks[0].Prompt != "first" || tl.From != schema.RolePlanner {
		t.Fatalf("task list: %+v %v %v", tl, found, err)
	}
	put("second")
	_, _, err = session.LoadTaskList(ctx, b.Sessions, b.NC, 5)
	if fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "changed after the planner arrival") {
		t.Fatalf("an object replaced after its arrival: %v, want a permanent error saying it changed", err)
	}
}

// TestCacheNeverGivesAnEarlierRolloutsTasks: rollout numbers start again
// when a training run does, while a service runs for days. The cache
// kept the tasks it read under the number and gave them to the new
// rollout of that number (the old session's entry refreshed, not
// replaced): prompts and labels of another batch.
func TestCacheNeverGivesAnEarlierRolloutsTasks(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	c := &session.Cache{KV: b.Sessions, Fresh: time.Nanosecond}
	put := func(created int64, prompt string) {
		t.Helper()
		if err := b.Sessions.Delete(ctx, schema.SessionKey(2)); err != nil {
			t.Fatal(err)
		}
		if err := b.Sessions.Delete(ctx, schema.TasksKey(2)); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Create(ctx, b.Sessions, schema.SessionKey(2), &schema.Session{Rollout: 2, State: schema.SessionRunning, Episodes: 1, CreatedMs: created}); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(2), &schema.TaskList{Tasks: []schema.Task{{Prompt: prompt}}}); err != nil {
			t.Fatal(err)
		}
	}
	put(1000, "the earlier run's question")
	if info, err := c.Get(ctx, 2); err != nil || info.Tasks[0].Prompt != "the earlier run's question" {
		t.Fatalf("%v %v", info, err)
	}
	put(2000, "this run's question")
	info, err := c.Get(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Tasks[0].Prompt; got != "this run's question" {
		t.Errorf("the new rollout 2's task: %q; want its own", got)
	}
}

// TestTaskObjectHeldToWhatAnInlineListIs: a task list in the object store
// was not checked as an inline one is (an empty prompt, a negative
// group_index ran); it is refused for good, naming the field.
func TestTaskObjectHeldToWhatAnInlineListIs(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	data, err := schema.Marshal(&schema.TaskList{Tasks: []schema.Task{{Prompt: "q"}, {Index: 1, Prompt: ""}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Tasks[schema.RolePlanner].PutBytes(ctx, "rollout-6-planner.tasks", data); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(6), &schema.TaskList{Object: "rollout-6-planner.tasks", From: schema.RolePlanner,
		Digest: schema.DigestSHA256 + bus.SHA256(data)}); err != nil {
		t.Fatal(err)
	}
	_, _, err = session.LoadTaskList(ctx, b.Sessions, b.NC, 6)
	if err == nil || fail.IsRetryable(err) || !strings.Contains(err.Error(), "tasks[1].prompt") {
		t.Errorf("a task object with an empty prompt: %v; want an error that does not pass, naming tasks[1].prompt", err)
	}
}

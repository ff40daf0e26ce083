package view

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestTaskListIsReadWithoutTheLock: while an arrival's task list is read
// from a slow object store, the view answers (the web view's requests, the
// other streams' reads), and once the list comes the rollout shows it.
// The object store here answers only after the view did, or when its read
// times out. Before, the list was read with the view's lock held: every
// request waited for it, up to the read's 10 s time-out.
func TestTaskListIsReadWithoutTheLock(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	list := []schema.Task{{Prompt: "from the object store", Label: "y"}}
	fetching, answered := make(chan struct{}, 1), make(chan struct{})
	how := make(chan string, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := OpenWith(ctx, bustest.Conn(t, url), Options{fetchTasks: func(ctx context.Context, role, object, sha string) ([]schema.Task, error) {
		fetching <- struct{}{}
		select {
		case <-answered:
			how <- "answered"
			return list, nil
		case <-ctx.Done():
			how <- "timed out"
			return nil, ctx.Err()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	b := bustest.Bus(t, url, "trainer")
	arrival := &schema.Arrive{Rollout: 5, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"},
		TasksObject: "rollout-5", TasksSHA256: strings.Repeat("ab", 32)}
	if err := b.Publish(ctx, arrival); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fetching:
	case <-ctx.Done():
		t.Fatal("the view never read the arrival's task list")
	}
	// A request while the list is read: answered, with the rollout waiting.
	rollouts := r.Rollouts()
	close(answered)
	if got := <-how; got != "answered" {
		t.Fatalf("the task list's read %s before the view answered a request: it held the view's lock", got)
	}
	if len(rollouts) != 1 || rollouts[0].Rollout != 5 || rollouts[0].Status != StatusWaiting {
		t.Errorf("rollouts while the task list is read: %+v, want rollout 5 waiting", rollouts)
	}
	for {
		if _, _, tasks, _ := Held(r, 5); tasks == len(list) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the task list read never shows")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestFoldTakesAFetchedListOnlyIfItStillCounts: a task list read from the
// object store after its arrival was refused (the refusal read while the
// list was read) is not the rollout's; the corrected arrival's, read next,
// is.
func TestFoldTakesAFetchedListOnlyIfItStillCounts(t *testing.T) {
	f := newFolder(t, &state{loadTasks: func(context.Context, string, string, string) []schema.Task { return nil }})
	refused := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, TasksObject: "a", TasksSHA256: "aa", AtMs: 1}
	corrected := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, TasksObject: "b", TasksSHA256: "bb", AtMs: 2}
	f.fold(refused)
	first := f.st.takeFetches()
	if len(first) != 1 || first[0].a.object != "a" {
		t.Fatalf("fetches after the first arrival: %+v, want its list", first)
	}
	f.fold(&schema.Result{Rollout: 7, Role: schema.RolePlanner, Status: schema.ResultInvalid, ArrivalID: refused.MsgID(), Rejected: true})
	f.st.fetched(first[0], []schema.Task{{Prompt: "poisoned"}})
	if r := f.st.rollouts[7]; len(r.tasks) != 0 {
		t.Errorf("tasks %+v: the refused arrival's list, read after its refusal", r.tasks)
	}
	f.fold(corrected)
	next := f.st.takeFetches()
	if len(next) != 1 || next[0].a.object != "b" {
		t.Fatalf("fetches after the corrected arrival: %+v, want its list", next)
	}
	if more := f.st.takeFetches(); len(more) != 0 {
		t.Errorf("fetches asked for twice: %+v", more)
	}
	f.st.fetched(next[0], []schema.Task{{Prompt: "good"}})
	if r := f.st.rollouts[7]; len(r.tasks) != 1 || r.tasks[0].Prompt != "good" {
		t.Errorf("tasks %+v, want the corrected arrival's", r.tasks)
	}
}

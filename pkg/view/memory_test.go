package view_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/view"
)

// publishRollout publishes rollout n as planact runs it, without running
// it: both arrivals (the planner's with the tasks), the start, per episode
// a turn asked, two acts done and its end (every other one answered
// right), then both results.
func publishRollout(t *testing.T, b *bus.Bus, n int64, episodes int) []schema.Task {
	t.Helper()
	tasks := make([]schema.Task, episodes)
	for e := range tasks {
		tasks[e] = schema.Task{GroupIndex: e, Prompt: fmt.Sprintf("rollout %d question %d", n, e), Label: fmt.Sprintf("answer %d", e)}
	}
	msgs := []schema.Message{
		&schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, Tasks: tasks, Config: &schema.Config{MaxTurns: 3}, AtMs: 1},
		&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor"}, AtMs: 1},
		&schema.Start{Rollout: n, Episodes: episodes},
	}
	for e := range episodes {
		msgs = append(msgs, &schema.PlanRequest{Rollout: n, Episode: e, Turn: 1})
		for _, id := range []string{"s1", "s2"} {
			msgs = append(msgs, &schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: "t1-" + id, NodeID: id, Tool: "search",
				Input: "q", Status: schema.ActDoneOK, Output: fmt.Sprintf("%0400d", e), Attempts: 1})
		}
		answer := "wrong"
		if e%2 == 0 {
			answer = tasks[e].Label
		}
		msgs = append(msgs, &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{answer}})
	}
	msgs = append(msgs, &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK},
		&schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.PublishAll(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return tasks
}

func openWith(t *testing.T, url string, o view.Options) *view.Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := view.OpenWith(ctx, bustest.Conn(t, url), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestOldRolloutsHoldOnlyTheirLine: a finished rollout beyond KeepFull
// keeps in memory only its line in the list (no episode, act or task
// list); its episode list and episodes, questions and rewards included,
// are read again and are what a view keeping it whole shows; and no more
// than MaxRollouts are kept. Before, each kept every episode, act and its
// tasks for as long as the view ran.
func TestOldRolloutsHoldOnlyTheirLine(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	const rollouts, episodes = 12, 3
	tasks := map[int64][]schema.Task{}
	for n := int64(1); n <= rollouts; n++ {
		tasks[n] = publishRollout(t, b, n, episodes)
	}
	full := openWith(t, url, view.Options{KeepFull: 100})
	small := openWith(t, url, view.Options{KeepFull: 2})
	if got, want := asJSON(t, small.Rollouts()), asJSON(t, full.Rollouts()); got != want {
		t.Errorf("lines differ once rollouts are compacted:\n%s\nwant\n%s", got, want)
	}
	for n := int64(1); n <= rollouts; n++ {
		eps, acts, ts, ok := view.Held(small, n)
		if kept := n > rollouts-2; !ok || !kept && (eps != 0 || acts != 0 || ts != 0) || kept && (eps != episodes || ts != episodes) {
			t.Errorf("rollout %d: %d episodes, %d acts, %d tasks held (found %v)", n, eps, acts, ts, ok)
		}
		got, err := small.Rollout(n, view.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := full.Rollout(n, view.Filter{})
		if asJSON(t, got) != asJSON(t, want) {
			t.Errorf("rollout %d read again:\n%s\nwant\n%s", n, asJSON(t, got), asJSON(t, want))
		}
		if len(got.EpisodeList) != episodes || got.EpisodeList[1].Question != tasks[n][1].Prompt || got.EpisodeList[0].Reward == nil || *got.EpisodeList[0].Reward != 1 {
			t.Errorf("rollout %d episodes read again: %+v", n, got.EpisodeList)
		}
		for e := range episodes {
			got, err := small.Episode(n, e)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := full.Episode(n, e)
			if asJSON(t, got) != asJSON(t, want) {
				t.Errorf("rollout %d episode %d read again:\n%s\nwant\n%s", n, e, asJSON(t, got), asJSON(t, want))
			}
		}
	}
	few := openWith(t, url, view.Options{MaxRollouts: 4})
	if got := few.Rollouts(); len(got) > 4 || len(got) == 0 || got[0].Rollout != rollouts {
		t.Errorf("MaxRollouts 4: %d rollouts listed, newest %+v", len(got), got)
	}
	if held := view.HeldRollouts(few); held > 4 {
		t.Errorf("MaxRollouts 4: %d held", held)
	}
}

// TestExpiredRolloutsAreLetGo: a rollout whose messages the streams no
// longer hold (older than ROLLOUT's max age, the history planact keeps)
// leaves the view, and its memory. Before, the view kept every rollout it
// had read for as long as it ran.
func TestExpiredRolloutsAreLetGo(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := bus.Provisioning{History: 4 * time.Second}
	if err := bus.Provision(ctx, bustest.Conn(t, url), bustest.Logger(), p); err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(ctx, bus.ConnOptions{URL: url}, "test", bustest.Logger(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.NC.Close() })
	for n := int64(1); n <= 3; n++ {
		publishRollout(t, b, n, 2)
	}
	r := openWith(t, url, view.Options{KeepFull: 1})
	if got := len(r.Rollouts()); got != 3 {
		// Read within the 4 s the streams keep them: on a machine so slow
		// that they expired first, there is nothing to check.
		t.Skipf("%d of 3 rollouts read before they expired", got)
	}
	for deadline := time.Now().Add(30 * time.Second); len(r.Rollouts()) > 0 || view.HeldRollouts(r) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("rollouts the streams kept 4 s are still there after 30 s: %d listed, %d held", len(r.Rollouts()), view.HeldRollouts(r))
		}
	}
	// A rollout that comes now is there.
	publishRollout(t, b, 4, 1)
	for deadline := time.Now().Add(10 * time.Second); len(r.Rollouts()) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a new rollout is not listed: %+v", r.Rollouts())
		}
	}
}

// TestReadAgainEndsWithItsContext: reading a compacted rollout's episodes
// again ends when the caller's context does (a command's --timeout, an
// interrupt), not 30 s later.
func TestReadAgainEndsWithItsContext(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	for n := int64(1); n <= 3; n++ {
		publishRollout(t, b, n, 2)
	}
	proxy := bustest.StartProxy(t, url)
	r := openWith(t, proxy.URL, view.Options{KeepFull: 1})
	for deadline := time.Now().Add(10 * time.Second); !view.Compacted(r, 1); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rollout 1 not compacted")
		}
	}
	proxy.Freeze()
	defer proxy.Thaw()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := r.EpisodeContext(ctx, 1, 0)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 10*time.Second {
		t.Errorf("episode read again from a silent server with 1 s to do it: %v after %v", err, took)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start = time.Now()
	_, err = r.RolloutContext(cancelled, 1, view.Filter{})
	if took := time.Since(start); !errors.Is(err, context.Canceled) || took > 10*time.Second {
		t.Errorf("episode list read again, interrupted: %v after %v", err, took)
	}
}

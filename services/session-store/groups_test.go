package sessionstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A rollout's task list is read once however many handlers ask for it at
// the same time (after a restart, those of its episode ends, groups and
// results): each read its own copy, and a 50 MB list cost 50 MB and its
// decoding per handler.
func TestTasksReadOnceForConcurrentHandlers(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx := context.Background()
	const n = 7
	var tasks []schema.Task
	for i := range 2000 {
		tasks = append(tasks, schema.Task{GroupIndex: i, Index: i, Prompt: fmt.Sprintf("question %d, long enough to make the list large", i)})
	}
	data, err := schema.Marshal(&schema.TaskList{Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Tasks[schema.RolePlanner].PutBytes(ctx, "rollout-7-planner.tasks", data); err != nil {
		t.Fatal(err)
	}
	tl := &schema.TaskList{Object: "rollout-7-planner.tasks", From: schema.RolePlanner, Digest: schema.DigestSHA256 + bus.SHA256(data)}
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(n), tl); err != nil {
		t.Fatal(err)
	}

	const handlers = 16
	var entered, reads atomic.Int32
	read := loadTaskList
	loadTaskList = func(ctx context.Context, kv *bus.Bucket, nc *nats.Conn, n int64) (schema.TaskList, bool, error) {
		reads.Add(1)
		// Every handler asks before the first read ends.
		for deadline := time.Now().Add(10 * time.Second); entered.Load() < handlers && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return read(ctx, kv, nc, n)
	}
	defer func() { loadTaskList = read }()

	s := &Service{Deps: Deps{Bus: b}, taskCache: &taskCache{lists: map[int64]schema.TaskList{}}}
	got := make([][]schema.Task, handlers)
	var wg sync.WaitGroup
	for i := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			entered.Add(1)
			var err error
			if got[i], err = s.tasksNow(ctx, n); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if r := reads.Load(); r != 1 {
		t.Errorf("%d handlers asking at once read the task list %d times, want once", handlers, r)
	}
	for i, g := range got {
		if len(g) != len(tasks) || &g[0] != &got[0][0] {
			t.Fatalf("handler %d got %d tasks, not the one list read (%d tasks)", i, len(g), len(tasks))
		}
	}
	if again, err := s.tasksNow(ctx, n); err != nil || &again[0] != &got[0][0] || reads.Load() != 1 {
		t.Errorf("asked again: %d tasks, %v, %d reads; want the cached list", len(again), err, reads.Load())
	}
}

// tasksNow is rollout n's tasks as the cache has them (nil when gone).
func (s *Service) tasksNow(ctx context.Context, n int64) ([]schema.Task, error) {
	tl, err := s.taskList(ctx, n)
	return tl.Tasks, err
}

// TestSpreadCountsNoQuarantinedReward: a quarantined episode's reward is
// never computed (it scores 0) and none of its samples is delivered: the
// spread filter does not keep a group for the spread between it and the
// group's one real reward (the trainer would get one sample, nothing to
// compare).
func TestSpreadCountsNoQuarantinedReward(t *testing.T) {
	cfg := schema.DefaultConfig()
	cfg.GroupFilter = schema.FilterSpread
	sess := &schema.Session{Rollout: 9, Config: cfg, Episodes: 2, State: schema.SessionRunning}
	task := schema.Task{GroupIndex: 0, Prompt: "q", Label: "a"}
	eps := map[int]*episode{
		0: {task: task, end: &schema.EpisodeEnd{Rollout: 9, Episode: 0, Status: schema.EpisodeCompleted}, reward: 1, correct: true},
		1: {task: task, end: &schema.EpisodeEnd{Rollout: 9, Episode: 1, Status: schema.EpisodeQuarantined, Reason: "token_drift"}},
	}
	gs := (&Service{}).filter(context.Background(), sess, 0, []int{0, 1}, eps)
	if gs.State != schema.GroupFiltered {
		t.Fatalf("group %s (%s): its one reward that counts has no spread", gs.State, gs.Reason)
	}
}

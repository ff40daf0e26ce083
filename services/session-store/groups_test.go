package sessionstore

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
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
		0: {task: task, end: &schema.EpisodeEnd{Rollout: 9, Episode: 0, Status: schema.EpisodeCompleted}, reward: 1, correct: true, planner: &schema.Sample{Reward: 1}},
		1: {task: task, end: &schema.EpisodeEnd{Rollout: 9, Episode: 1, Status: schema.EpisodeQuarantined, Reason: "token_drift"}},
	}
	gs := (&Service{}).filter(context.Background(), sess, 0, []int{0, 1}, eps)
	if gs.State != schema.GroupFiltered {
		t.Fatalf("group %s (%s): its one reward that counts has no spread", gs.State, gs.Reason)
	}
}

// ended is an episode of task that ended with status and reward, with a
// planner sample when sampled (as gather builds them: a failed or aborted
// episode that left a trajectory has one too).
func ended(task schema.Task, e int, status string, reward float64, sampled bool, answer string) *episode {
	ep := &episode{task: task, end: &schema.EpisodeEnd{Rollout: 9, Episode: e, Status: status, Answers: []string{answer}}, reward: reward}
	if sampled {
		ep.planner = &schema.Sample{RolloutID: episodeID(9, e), Reward: reward, Status: status}
	}
	return ep
}

// TestSpreadWeighsOnlyTrainedRewards: the spread filter weighed the
// reward of every episode that ended and was not quarantined, so the 0 of
// a failed or aborted episode (its reward is never computed; its task is
// failed or aborted, not trained) made a group whose trained rewards all
// equal look like it had spread, and it was delivered with nothing for
// group-relative advantages. It weighs the rewards of the episodes whose
// samples are trained on: completed or truncated, with a sample.
func TestSpreadWeighsOnlyTrainedRewards(t *testing.T) {
	task := schema.Task{GroupIndex: 0, Prompt: "q", Label: "a"}
	const (
		ok, trunc, failed, aborted = schema.EpisodeCompleted, schema.EpisodeTruncated, schema.EpisodeFailed, schema.EpisodeAborted
	)
	type end struct {
		status  string
		reward  float64
		sampled bool
	}
	for _, c := range []struct {
		name string
		ends []end
		want string // the group's state
		why  string // in its reason
	}{
		{"a failed episode's 0 beside equal rewards", []end{{ok, 1, true}, {ok, 1, true}, {failed, 0, true}}, schema.GroupFiltered, "all 2 rewards are 1"},
		{"an aborted episode's 0 beside equal rewards", []end{{ok, 1, true}, {aborted, 0, true}, {ok, 1, true}}, schema.GroupFiltered, "all 2 rewards are 1"},
		{"a completed episode without a sample", []end{{ok, 1, true}, {ok, 0, false}}, schema.GroupFiltered, "1 reward(s)"},
		{"a truncated episode's 0 is trained", []end{{ok, 1, true}, {trunc, 0, true}}, schema.GroupDelivered, ""},
		{"spread among the trained, a failed one beside", []end{{ok, 1, true}, {failed, 0, true}, {ok, 0.5, true}}, schema.GroupDelivered, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := schema.DefaultConfig()
			cfg.GroupFilter = schema.FilterSpread
			sess := &schema.Session{Rollout: 9, Config: cfg, Episodes: len(c.ends), State: schema.SessionRunning}
			eps, members := map[int]*episode{}, []int{}
			for e, x := range c.ends {
				eps[e], members = ended(task, e, x.status, x.reward, x.sampled, "a"), append(members, e)
			}
			gs := (&Service{}).filter(context.Background(), sess, 0, members, eps)
			if gs.State != c.want || !strings.Contains(gs.Reason, c.why) {
				t.Errorf("group %s (%q); want %s, saying %q", gs.State, gs.Reason, c.want, c.why)
			}
		})
	}
}

// TestRemoteFilterIsSentTrainedRewards: a filter server is sent the
// rewards (and responses, in the same order) the spread filter weighs:
// not a failed episode's 0, nor a quarantined one's.
func TestRemoteFilterIsSentTrainedRewards(t *testing.T) {
	var got struct {
		Rewards   []float64 `json:"rewards"`
		Responses []string  `json:"responses"`
	}
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		w.Write([]byte(`{"keep": true, "reason": "spread"}`))
	}))
	defer srv.Close()
	cfg := schema.DefaultConfig()
	cfg.GroupFilter = srv.URL
	sess := &schema.Session{Rollout: 9, Config: cfg, Episodes: 4, State: schema.SessionRunning}
	task := schema.Task{GroupIndex: 0, Prompt: "q", Label: "a"}
	eps := map[int]*episode{
		0: ended(task, 0, schema.EpisodeCompleted, 1, true, "x"),
		1: ended(task, 1, schema.EpisodeFailed, 0, true, "y"),
		2: ended(task, 2, schema.EpisodeQuarantined, 0, false, "q"),
		3: ended(task, 3, schema.EpisodeCompleted, 0.5, true, "z"),
	}
	gs := (&Service{}).filter(context.Background(), sess, 0, []int{0, 1, 2, 3}, eps)
	if gs.State != schema.GroupDelivered || asked.Load() != 1 {
		t.Fatalf("group %s (%q), filter asked %d times; want it asked once and its keep taken", gs.State, gs.Reason, asked.Load())
	}
	if want := []float64{1, 0.5}; !reflect.DeepEqual(got.Rewards, want) {
		t.Errorf("the filter was sent rewards %v; want %v (the trained episodes')", got.Rewards, want)
	}
	if want := []string{"x", "z"}; !reflect.DeepEqual(got.Responses, want) {
		t.Errorf("the filter was sent responses %q; want %q", got.Responses, want)
	}
}

// TestNothingToTrainOnIsNotSelected: a rollout that selects groups does
// not deliver one none of whose tasks left a sample that is trained on,
// whatever its filter, and does not ask a filter server about it; one that
// only streams its groups still streams every one.
func TestNothingToTrainOnIsNotSelected(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Write([]byte(`{"keep": true}`))
	}))
	defer srv.Close()
	task := schema.Task{GroupIndex: 0, Prompt: "q", Label: "a"}
	eps := map[int]*episode{
		0: ended(task, 0, schema.EpisodeFailed, 0, true, "a"),
		1: ended(task, 1, schema.EpisodeQuarantined, 0, false, "a"),
		2: ended(task, 2, schema.EpisodeCompleted, 1, false, "a"),
	}
	for _, c := range []struct {
		name   string
		config func(*schema.Config)
		want   string
	}{
		{"target_groups", func(c *schema.Config) { c.TargetGroups = 1 }, schema.GroupFiltered},
		{"spread", func(c *schema.Config) { c.GroupFilter = schema.FilterSpread }, schema.GroupFiltered},
		{"a filter server", func(c *schema.Config) { c.GroupFilter, c.TargetGroups = srv.URL, 1 }, schema.GroupFiltered},
		{"stream_groups only", func(c *schema.Config) { c.StreamGroups = true }, schema.GroupDelivered},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := schema.DefaultConfig()
			c.config(&cfg)
			sess := &schema.Session{Rollout: 9, Config: cfg, Episodes: 3, State: schema.SessionRunning}
			gs := (&Service{}).filter(context.Background(), sess, 0, []int{0, 1, 2}, eps)
			if gs.State != c.want {
				t.Errorf("group %s (%q); want %s", gs.State, gs.Reason, c.want)
			}
			why := "nothing to train on: no task of the group left a sample trained on (1 completed without a sample, 1 failed, 1 quarantined)"
			if c.want == schema.GroupFiltered && gs.Reason != why {
				t.Errorf("reason %q; want %q", gs.Reason, why)
			}
		})
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the filter server was asked %d times about a group with nothing to train on", n)
	}
}

// TestAnEmptyGroupDoesNotCountTowardTarget: with target_groups 1, a
// complete group whose episodes left nothing to train on (one failed, one
// quarantined) was delivered and counted: the rollout ended ok at once,
// its one group holding no trained task, and the group that would have
// been trained on was stopped. It is filtered, saying why; the rollout
// runs on until a group a trainer can learn from is delivered; and the
// results count every task once, trained only where a sample of it is
// delivered.
func TestAnEmptyGroupDoesNotCountTowardTarget(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 131
	var tasks []schema.Task
	for e := range 6 {
		tasks = append(tasks, schema.Task{GroupIndex: e / 2, Index: e, Prompt: fmt.Sprintf("q%d", e/2), Label: "a"})
	}
	s.keepTasks(n, schema.TaskList{Tasks: tasks})
	trajectory := func(e int) []schema.Message {
		return []schema.Message{
			&schema.PlanOutput{Rollout: n, Episode: e, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
				{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
			}},
			&schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
				Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
		}
	}
	var msgs []schema.Message
	// Group 0: one episode failed (its trajectory there), one quarantined.
	msgs = append(msgs, trajectory(0)...)
	msgs = append(msgs, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeFailed, Reason: "planner_rejected", Acts: []string{"t1-s1"}},
		&schema.EpisodeEnd{Rollout: n, Episode: 1, Turns: 1, Status: schema.EpisodeQuarantined, Reason: "token_drift: turn 1"})
	// Group 1: both completed. Group 2 (episodes 4 and 5) is still running.
	for _, e := range []int{2, 3} {
		msgs = append(append(msgs, trajectory(e)...),
			&schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}})
	}
	for _, m := range msgs {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cfg := schema.DefaultConfig()
	cfg.TargetGroups = 1
	now := time.Now().UnixMilli()
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(n), schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg,
		Episodes: len(tasks), Ended: []int{0, 1, 2, 3}, CreatedMs: now, StartedMs: now,
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}}}); err != nil {
		t.Fatal(err)
	}
	sess, rev, _, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}

	gs, sess, rev, _, err := s.decideGroup(ctx, sess, rev, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gs.State != schema.GroupFiltered || !strings.Contains(gs.Reason, "nothing to train on") || !strings.Contains(gs.Reason, "1 failed, 1 quarantined") {
		t.Errorf("group 0 %s (%q); want filtered: nothing to train on, saying how its episodes ended", gs.State, gs.Reason)
	}
	if sess.State != schema.SessionRunning || len(sess.Delivered()) != 0 {
		t.Fatalf("after group 0: rollout %s (%q), groups delivered %v; want it running, none delivered", sess.State, sess.Reason, sess.Delivered())
	}

	gs, sess, _, eps, err := s.decideGroup(ctx, sess, rev, 1)
	if err != nil {
		t.Fatal(err)
	}
	if gs.State != schema.GroupDelivered || sess.State != schema.SessionDone || sess.Status != schema.ResultOK || !slices.Equal(sess.Delivered(), []int{1}) {
		t.Fatalf("after group 1 (%s): rollout %s %s (%q), delivered %v; want group 1 delivered and the rollout ok", gs.State, sess.State, sess.Status, sess.Reason, sess.Delivered())
	}
	if _, err := s.deliverGroup(ctx, &sess, 1, eps); err != nil {
		t.Fatal(err)
	}

	res, err := s.results(ctx, &sess, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{schema.TaskFailed, schema.TaskQuarantined, schema.TaskTrained, schema.TaskTrained, schema.TaskAborted, schema.TaskAborted}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := res[role].Result
		var states []string
		counted := map[string]int{}
		for _, out := range r.Tasks {
			states = append(states, out.State)
			counted[out.State]++
		}
		if !slices.Equal(states, want) || !maps.Equal(counted, r.Stats.TaskStates) {
			t.Errorf("%s: tasks %v, task_states %v; want %v, counted", role, states, r.Stats.TaskStates, want)
		}
		sampled := map[string]bool{}
		for _, h := range res[role].samples {
			sampled[h.sample.RolloutID] = true
		}
		if r.SampleCount != len(res[role].samples) || len(sampled) != r.Stats.TaskStates[schema.TaskTrained] || !sampled[episodeID(n, 2)] || !sampled[episodeID(n, 3)] {
			t.Errorf("%s: sample_count %d, %d samples of episodes %v, %d tasks trained; want the samples of episodes 2 and 3, each trained",
				role, r.SampleCount, len(res[role].samples), sampled, r.Stats.TaskStates[schema.TaskTrained])
		}
		if r.Status != schema.ResultOK {
			t.Errorf("%s: result %s (%q); want ok", role, r.Status, r.Reason)
		}
	}
}

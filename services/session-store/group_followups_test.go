package sessionstore

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	"github.com/planact/planact/pkg/subject"
)

// TestAGroupOfDifferentTasksIsRefused: a group is the copies of one task
// (the tasks sharing a group_index): the spread filter compares their
// rewards and a filter server is sent the group's one prompt and label. A
// list whose group holds different tasks (a batch that left group_index
// out: all 0) was run, each group's rewards compared across tasks. It is
// refused, naming the group and two of its tasks: inline, at arrival;
// from the object store, when the rollout would start. Copies whose
// prompts differ but ask one thing (the same label: a paraphrase, the
// simulated engines' fault markers) are a group.
func TestAGroupOfDifferentTasksIsRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		tasks []schema.Task
		says  string // "": accepted
	}{
		{"copies of one task", []schema.Task{{Prompt: "q", Label: "a"}, {Index: 1, Prompt: "q", Label: "a"}, {GroupIndex: 1, Index: 2, Prompt: "r", Label: "b"}}, ""},
		{"a task per group", []schema.Task{{Prompt: "q", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "r", Label: "a"}}, ""},
		{"copies with markers", []schema.Task{{Prompt: "q", Label: "a"}, {Index: 1, Prompt: "q #fault:actor-hang", Label: "a"}}, ""},
		{"no group_index given", []schema.Task{{Prompt: "q", Label: "a"}, {Index: 1, Prompt: "r", Label: "b"}},
			`group_index 0: tasks 0 and 1 have different labels ("a", "b"; prompts "q", "r")`},
		{"interleaved", []schema.Task{{GroupIndex: 3, Prompt: "q", Label: "a"}, {GroupIndex: 4, Index: 1, Prompt: "r", Label: "b"}, {GroupIndex: 4, Index: 2, Prompt: "r", Label: "b"}, {GroupIndex: 3, Index: 3, Prompt: "q", Label: "a "}},
			`group_index 3: tasks 0 and 3 have different labels ("a", "a ";`},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &schema.Arrive{Rollout: 1, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}, Tasks: c.tasks}
			err := (&Service{}).validateArrival(a)
			switch {
			case c.says == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)):
				t.Errorf("arrival: %v; want it refused, saying %q", err, c.says)
			}
		})
	}

	// A list the arrivals name in the object store is read at the barrier.
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 63
	s.keepTasks(n, schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "a"}, {Index: 1, Prompt: "q", Label: "a"}, {Index: 2, Prompt: "r", Label: "b"}}})
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		a := &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://" + role + ":30000"}}
		if err := b.Publish(ctx, a); err != nil {
			t.Fatal(err)
		}
		m, err := b.LastMsg(ctx, bus.StreamTrainer(role), subject.Arrive(n, role))
		if err != nil || m == nil {
			t.Fatalf("the %s arrival is not stored: %v", role, err)
		}
		if err := s.handle(ctx, bus.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data, Seq: m.Seq, Delivered: 1}); err != nil {
			t.Fatalf("%s arrival: %v", role, err)
		}
	}
	sess, _ := readSession(t, s, n)
	if sess.State != schema.SessionDone || sess.Status != schema.ResultInvalid || !strings.Contains(sess.Reason, "group_index 0: tasks 0 and 2 have different labels") {
		t.Errorf("rollout %s %s (%q); want it refused, naming group 0 and tasks 0 and 2", sess.State, sess.Status, sess.Reason)
	}
}

// TestSurplusGroupsAskNoFilter: once target_groups were delivered, a group
// that completes is surplus whatever the filter says; it asked the filter
// server all the same (up to 10 s a group) before it was marked so.
func TestSurplusGroupsAskNoFilter(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Write([]byte(`{"keep": true, "reason": "fine"}`))
	}))
	defer srv.Close()
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 64
	var tasks []schema.Task
	for e := range 4 {
		tasks = append(tasks, schema.Task{GroupIndex: e / 2, Index: e, Prompt: []string{"q0", "q1"}[e/2], Label: "a"})
	}
	s.keepTasks(n, schema.TaskList{Tasks: tasks})
	publishEpisodes(t, s, n, 2, 3)
	cfg := schema.DefaultConfig()
	cfg.TargetGroups, cfg.GroupFilter = 1, srv.URL
	if err := putSession(ctx, s, schema.Session{Rollout: n, State: schema.SessionDone, Status: schema.ResultOK, Config: cfg, Episodes: len(tasks), Ended: []int{2, 3},
		Groups: []schema.GroupState{{Index: 0, State: schema.GroupDelivered}},
		Roles:  map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}}}); err != nil {
		t.Fatal(err)
	}
	sess, rev := readSession(t, s, n)
	gs, _, _, _, err := s.decideGroup(ctx, sess, rev, 1)
	if err != nil {
		t.Fatal(err)
	}
	if gs.State != schema.GroupSurplus {
		t.Errorf("group 1 %s (%q); want surplus", gs.State, gs.Reason)
	}
	if c := calls.Load(); c != 0 {
		t.Errorf("the filter server was asked %d time(s) about a surplus group; want never", c)
	}
}

// TestAFailedGroupDoesNotBlockTheOthers: a group that can never be
// delivered while the rollout runs (an error no try mends) stayed at the
// head of the outbox, and every group behind it waited: target_groups
// could not be reached before the time-out. It is recorded failed, the
// groups behind it are delivered, and each group's status is said once,
// however many times the settle runs.
func TestAFailedGroupDoesNotBlockTheOthers(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 65
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}, {GroupIndex: 2, Index: 2, Prompt: "q2", Label: "a"}}
	s.keepTasks(n, schema.TaskList{Tasks: tasks})
	// Episode 0 lists an act whose outcome is not in the ACT stream: its
	// group can never be read.
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s9"}}); err != nil {
		t.Fatal(err)
	}
	publishEpisodes(t, s, n, 1)

	var mu sync.Mutex
	said := map[string]int{}
	sub, err := s.Bus.NC.Subscribe(subject.Status(n), func(m *nats.Msg) {
		var st schema.Status
		if schema.Unmarshal(m.Data, &st) == nil && strings.HasPrefix(st.Event, "group-") {
			mu.Lock()
			said[st.Detail]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	cfg := schema.DefaultConfig()
	cfg.TargetGroups = 2
	now := time.Now().UnixMilli()
	if err := putSession(ctx, s, schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: len(tasks), Ended: []int{0, 1},
		CreatedMs: now, StartedMs: now, Outbox: []string{schema.EffectGroup(0), schema.EffectGroup(1)},
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}}}); err != nil {
		t.Fatal(err)
	}
	stale, staleRev := readSession(t, s, n)
	if err := s.settle(ctx, stale, staleRev); err != nil {
		t.Fatalf("settle: %v", err)
	}
	sess, _ := readSession(t, s, n)
	g0, _ := sess.Group(0)
	if g0.State != schema.GroupFailed || !strings.Contains(g0.Reason, "t1-s9") {
		t.Errorf("group 0 %s (%q); want failed, saying why", g0.State, g0.Reason)
	}
	if !slices.Equal(sess.Delivered(), []int{1}) || sess.State != schema.SessionRunning || len(sess.Outbox) != 0 {
		t.Fatalf("delivered %v, rollout %s (%q), outbox %v; want group 1 delivered, the rollout running, the outbox settled", sess.Delivered(), sess.State, sess.Reason, sess.Outbox)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.Group(n, role, 1)); err != nil || m == nil {
			t.Errorf("group 1 not published to the %s (%v)", role, err)
		}
	}

	// Another replica settles what it read before: it finds the effects
	// settled, and says nothing again.
	if _, _, err := s.settleOnce(ctx, stale, staleRev); err != nil {
		t.Fatalf("settle again: %v", err)
	}

	// Group 2 completes: the second group delivered ends the rollout.
	publishEpisodes(t, s, n, 2)
	if _, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.Ended, v.Outbox = []int{0, 1, 2}, []string{schema.EffectGroup(2)}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	sess, rev := readSession(t, s, n)
	if err := s.settle(ctx, sess, rev); err != nil {
		t.Logf("settle: %v", err) // the results cannot be assembled (episode 0): not what this test is about
	}
	if sess, _ = readSession(t, s, n); !slices.Equal(sess.Delivered(), []int{1, 2}) || sess.State != schema.SessionDone {
		t.Errorf("delivered %v, rollout %s (%q); want groups 1 and 2 delivered, target_groups reached", sess.Delivered(), sess.State, sess.Reason)
	}

	// The status events are published before settle returns; a flush
	// has them delivered to the subscription.
	if err := s.Bus.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := len(said)
		mu.Unlock()
		if got >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(said) != 3 {
		t.Errorf("group statuses %v; want one for each of groups 0, 1 and 2", said)
	}
	for detail, k := range said {
		if k != 1 {
			t.Errorf("status %q said %d times; want once", detail, k)
		}
	}
}

// publishEpisodes publishes, for each of episodes, a completed end with
// its trajectory and one act the actor model ran.
func publishEpisodes(t *testing.T, s *Service, n int64, episodes ...int) {
	t.Helper()
	for _, e := range episodes {
		for _, m := range []schema.Message{
			&schema.PlanOutput{Rollout: n, Episode: e, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
				{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
			}},
			&schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
				Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
			&schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
		} {
			if err := s.Bus.Publish(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
}

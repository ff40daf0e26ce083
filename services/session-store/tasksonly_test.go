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

// endedRollout stores rollout n, finished with the episodes of tasks
// ended (ends), its effects given still to settle, and returns its
// session.
func endedRollout(t *testing.T, s *Service, n int64, cfg schema.Config, tasks []schema.Task, msgs []schema.Message, outbox ...string) schema.Session {
	t.Helper()
	ctx := context.Background()
	for _, m := range msgs {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	finishedRollout(t, s, n, cfg, outbox...)
	sess, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, _ bool) (bool, error) {
		v.Episodes, v.Ended = len(tasks), nil
		for e := range tasks {
			v.Ended = append(v.Ended, e)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if tasks != nil {
		s.keepTasks(n, schema.TaskList{Tasks: tasks, From: schema.RolePlanner})
	}
	return sess
}

// completedEpisode is what the streams hold of episode e of rollout n,
// completed after one turn and one act that ran the actor model.
func completedEpisode(n int64, e int) []schema.Message {
	return []schema.Message{
		&schema.PlanOutput{Rollout: n, Episode: e, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
		}},
		&schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
			Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
		&schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
	}
}

// brokenEpisode is episode e of rollout n, completed, its end listing an
// act whose outcome is not in the ACT stream: its samples can never be
// built.
func brokenEpisode(n int64, e int) schema.Message {
	return &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}}
}

// TestResultsThatCannotHoldTheirSamplesListTheirTasks: when a group could
// not be delivered, or the samples could not be assembled, both roles'
// results went out failed listing no task: a trainer could not tell which
// tasks ended how. Now they list every task, from what is at hand without
// the samples (the task list, the episodes' ends, the group messages that
// went out): none trained, for none of their samples is in the result;
// a task of a group whose message went out says that message has them,
// as the group said how it ended. They name only the groups whose
// messages went out, and count what they hold.
func TestResultsThatCannotHoldTheirSamplesListTheirTasks(t *testing.T) {
	for _, c := range []struct {
		name     string
		grouped  bool
		why      string // in the results' reason
		lost     string // a task's reason, of the task whose samples could not be
		streamed []int
	}{
		{"a group not delivered", true, "samples could not be delivered: group 1: ", "its samples could not be delivered", []int{0}},
		{"samples not assembled", false, "samples could not be assembled: ", "its samples could not be assembled", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, url := bustest.Server(t)
			s := newTestService(bustest.Bus(t, url, "ss"))
			const n = 171
			cfg := schema.DefaultConfig()
			outbox := []string{schema.EffectResults, schema.EffectCleanup}
			if c.grouped {
				cfg.StreamGroups = true
				outbox = append([]string{"group:0", "group:1"}, outbox...)
			}
			tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}}
			sess := endedRollout(t, s, n, cfg, tasks, append(completedEpisode(n, 0), brokenEpisode(n, 1)), outbox...)
			if err := s.settle(context.Background(), sess, 0); err != nil {
				t.Fatal(err)
			}
			for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
				r := resultOf(t, s, n, role)
				if r == nil {
					t.Fatalf("no %s result", role)
				}
				if r.Status != schema.ResultFailed || !strings.HasPrefix(r.Reason, c.why) || !strings.Contains(r.Reason, "t1-s1") {
					t.Errorf("%s result: %s (%q); want failed, %q, naming the act without an outcome", role, r.Status, r.Reason, c.why)
				}
				if len(r.Tasks) != len(tasks) {
					t.Fatalf("%s result lists %d tasks, want %d: %+v", role, len(r.Tasks), len(tasks), r.Tasks)
				}
				first := c.lost
				if c.grouped {
					first += " in the result (its group's message has them)"
				}
				for e, want := range []string{first, c.lost} {
					if out := r.Tasks[e]; out.Episode != e || out.GroupIndex != tasks[e].GroupIndex || out.State != schema.TaskFailed || out.Reason != want {
						t.Errorf("%s result, task %d: %+v; want failed, %q", role, e, out, want)
					}
				}
				if !slices.Equal(r.StreamedGroups, c.streamed) {
					t.Errorf("%s result names groups %v streamed; want %v (those whose messages went out)", role, r.StreamedGroups, c.streamed)
				}
				if err := countsOwnContents(r, 0, schema.Stats{}); err != nil {
					t.Errorf("%s result: %v", role, err)
				}
			}
		})
	}
}

// TestResultsWithoutTheirTaskListSayWhy: when the tasks cannot be read
// either (the task list is gone, past the results' patience), the failed
// results list none, and their reason says so and why; it said only that
// the samples could not be assembled.
func TestResultsWithoutTheirTaskListSayWhy(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 172
	sess := endedRollout(t, s, n, schema.DefaultConfig(), make([]schema.Task, 1), nil, schema.EffectResults, schema.EffectCleanup)
	s.taskCache.drop(n) // no task list: gone
	s.failing.note(identify(&sess), s.Now().Add(-2*s.ResultPatience))
	if err := s.settle(context.Background(), sess, 0); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := resultOf(t, s, n, role)
		if r == nil || r.Status != schema.ResultFailed || len(r.Tasks) != 0 ||
			!strings.Contains(r.Reason, "this result lists no task: the rollout's tasks could not be read either: ") || !strings.Contains(r.Reason, "task list is gone") {
			t.Fatalf("%s result: %+v; want failed, listing no task, saying so and why", role, r)
		}
		if err := countsOwnContents(r, 0, schema.Stats{}); err != nil {
			t.Errorf("%s result: %v", role, err)
		}
	}
}

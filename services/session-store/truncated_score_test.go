package sessionstore

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestTruncatedEpisodesAreScored: an episode that ended truncated (its
// answer cut at the token limit, or max_turns reached) is trained on with
// what it answered, so its answers are scored as a completed episode's
// are: it was always 0 and never correct, and the result's accuracy and
// mean reward said so. One with no answer scores as the reward function
// scores an empty one. A failed episode's reward is not computed.
func TestTruncatedEpisodesAreScored(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 61
	var tasks []schema.Task
	for e := range 4 {
		tasks = append(tasks, schema.Task{GroupIndex: e, Index: e, Prompt: "q", Label: "Paris"})
	}
	for _, m := range []*schema.EpisodeEnd{
		{Rollout: n, Episode: 0, Turns: 3, Status: schema.EpisodeTruncated, Reason: "max_turns", Answers: []string{"Paris"}},
		{Rollout: n, Episode: 1, Turns: 3, Status: schema.EpisodeTruncated, Reason: "max_turns"},
		{Rollout: n, Episode: 2, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"Paris"}},
		{Rollout: n, Episode: 3, Turns: 1, Status: schema.EpisodeFailed, Reason: "planner_rejected", Answers: []string{"Paris"}},
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, reward := range []string{"em", "f1"} {
		t.Run(reward, func(t *testing.T) {
			cfg := schema.DefaultConfig()
			cfg.Reward = reward
			sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK, Ended: allEnded(len(tasks))}
			eps, err := s.gather(ctx, sess, tasks, nil, ownSamples(sess))
			if err != nil {
				t.Fatal(err)
			}
			want := []struct {
				reward  float64
				correct bool
			}{{1, true}, {0, false}, {1, true}, {0, false}}
			for e, w := range want {
				if ep := eps[e]; ep.reward != w.reward || ep.correct != w.correct || ep.rewardErr != "" {
					t.Errorf("episode %d (%s, answers %q): reward %v, correct %v (%q); want %v, %v",
						e, ep.end.Status, ep.end.Answers, ep.reward, ep.correct, ep.rewardErr, w.reward, w.correct)
				}
			}
			planner, _ := buildResults(sess, tasks, eps, nil)
			st := planner.Stats
			if st.Correct != 2 || math.Abs(st.Accuracy-0.5) > 1e-9 || math.Abs(st.MeanReward-0.5) > 1e-9 {
				t.Errorf("stats: correct %d, accuracy %v, mean reward %v; want 2, 0.5, 0.5 (both answered Paris, of 4 ended)", st.Correct, st.Accuracy, st.MeanReward)
			}
		})
	}
}

// TestAnEndTheSessionRecordsMustBeRead: an episode the session records
// as ended whose end is not in the stream was taken as not ended, and a
// group decided on that (nothing to train on, filtered) was recorded for
// good. It is an error that names the episode, and nothing is decided.
func TestAnEndTheSessionRecordsMustBeRead(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 62
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}, {GroupIndex: 0, Index: 1, Prompt: "q", Label: "a"}}
	s.keepTasks(n, schema.TaskList{Tasks: tasks})
	// Episode 1's end is there; episode 0's, which the session records, is not.
	if err := s.Bus.Publish(ctx, &schema.EpisodeEnd{Rollout: n, Episode: 1, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	cfg := schema.DefaultConfig()
	cfg.TargetGroups = 1
	sess := schema.Session{Rollout: n, State: schema.SessionRunning, Config: cfg, Episodes: len(tasks), Ended: []int{0, 1},
		Roles: map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}}}
	if _, err := s.gather(ctx, &sess, tasks, nil, nil); err == nil || !strings.Contains(err.Error(), "episode 0") {
		t.Errorf("gather: %v; want an error naming episode 0, whose end cannot be read", err)
	}
	if err := putSession(ctx, s, sess); err != nil {
		t.Fatal(err)
	}
	fresh, rev := readSession(t, s, n)
	if gs, _, _, _, err := s.decideGroup(ctx, fresh, rev, 0); err == nil {
		t.Errorf("group 0 decided (%s: %q) on an episode whose end could not be read", gs.State, gs.Reason)
	}
	if after, _ := readSession(t, s, n); len(after.Groups) != 0 {
		t.Errorf("groups recorded %+v; want none", after.Groups)
	}
}

// putSession stores sess as its rollout's session.
func putSession(ctx context.Context, s *Service, sess schema.Session) error {
	_, err := bus.Create(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), sess)
	return err
}

// readSession reads rollout n's session, and its revision, from the leader.
func readSession(t *testing.T, s *Service, n int64) (schema.Session, uint64) {
	t.Helper()
	sess, rev, found, err := bus.GetFresh[schema.Session](context.Background(), s.Bus.Sessions, schema.SessionKey(n))
	if err != nil || !found {
		t.Fatalf("session of rollout %d: found %v, %v", n, found, err)
	}
	return sess, rev
}

package view

import (
	"net/url"
	"testing"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// TestFoldEpisodeOfAnEndedRolloutIsNotRunning: a rollout that times out
// ends with episodes that never ended (their tasks "unfinished" in its
// result). Those episodes are unfinished, not running, and nothing of the
// rollout runs, even while the runs bucket's removal of their run states
// is not read yet. Before, they stayed "running" for as long as the view
// kept the rollout: ?status=running listed them, and the rollout's line
// counted their released acts as running.
func TestFoldEpisodeOfAnEndedRolloutIsNotRunning(t *testing.T) {
	f := newFolder(t, &state{})
	f.running(5, 2)
	f.fold(&schema.EpisodeEnd{Rollout: 5, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"answer 0"}})
	f.st.applyRun(5, 1, 2, &schema.Run{Rollout: 5, Episode: 1, Turn: 2, Nodes: []*schema.NodeState{
		{Node: plan.Node{ID: "s3", Tool: "search"}, Key: "t2-s3", Status: schema.NodeReleased, ReleasedMs: f.now.UnixMilli()},
	}}, f.now)
	r := f.st.rollouts[5]
	if got := r.episodeSummaries(f.now)[1]; got.Status != EpisodeRunning || got.Acts.Running != 1 {
		t.Fatalf("episode 1 while the rollout runs: %s with %d acts running, want running with 1", got.Status, got.Acts.Running)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		f.fold(&schema.Result{Rollout: 5, Role: role, Status: schema.ResultTimeout, Reason: "rollout_timeout_s 60 passed"})
	}
	eps := r.episodeSummaries(f.now)
	if eps[0].Status != schema.EpisodeCompleted {
		t.Errorf("episode 0: %s, want completed", eps[0].Status)
	}
	if eps[1].Status != EpisodeUnfinished || eps[1].Acts.Running != 0 || eps[1].Reward != nil {
		t.Errorf("episode 1 after the rollout timed out: %s, %d acts running, reward %v; want unfinished, none running, no reward",
			eps[1].Status, eps[1].Acts.Running, eps[1].Reward)
	}
	if s := r.summary(f.now); s.Acts.Running != 0 || s.Status != schema.ResultTimeout {
		t.Errorf("rollout line: %s with %d acts running, want timeout with none", s.Status, s.Acts.Running)
	}
	for status, want := range map[string]int{EpisodeRunning: 0, EpisodeUnfinished: 1} {
		flt, err := ParseFilter(url.Values{"status": {status}})
		if err != nil {
			t.Fatalf("status=%s: %v", status, err)
		}
		if got := flt.apply(eps); len(got) != want {
			t.Errorf("status=%s picks %d episodes, want %d", status, len(got), want)
		}
	}
	if got := (Filter{Lowest: 5}).apply(eps); len(got) != 1 || got[0].Episode != 0 {
		t.Errorf("lowest=5 picks %+v: want only the ended episode 0", got)
	}
}

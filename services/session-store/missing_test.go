package sessionstore

import (
	"context"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAMissingGroupMessageIsAnError: the session records group 0
// delivered, and its planner message is in the stream, but its actor
// message is not. Assembly read the missing message as a group that left
// the actor no sample, and the actor's result blamed the episode ("no
// actor sample") for what the stream lost. Now it is an error naming the
// subject, and the results go out failed, saying so.
func TestAMissingGroupMessageIsAnError(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 291
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 0, Index: 1, Prompt: "q0", Label: "a"}}
	cfg := schema.DefaultConfig()
	cfg.StreamGroups = true
	sess := endedRollout(t, s, n, cfg, tasks, append(completedEpisode(n, 0), completedEpisode(n, 1)...))
	sess.Groups = []schema.GroupState{{Index: 0, State: schema.GroupDelivered}}
	eps, err := s.gather(ctx, &sess, tasks, []int{0, 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	samples, outcomes := groupShare(&sess, eps, []int{0, 1}, schema.RolePlanner)
	m := &schema.Group{Rollout: n, Role: schema.RolePlanner, GroupIndex: 0, Samples: samples, Tasks: outcomes, Delivered: []int{0}, Groups: 1}
	if _, err := s.publishSamples(ctx, m, "rollout-291-planner.group-0.samples"); err != nil {
		t.Fatal(err)
	}
	missing := subject.Group(n, schema.RoleActor, 0)

	_, _, err = s.assemble(ctx, &sess)
	if err == nil || !strings.Contains(err.Error(), missing) || fail.IsRetryable(err) {
		t.Fatalf("assembly with the actor's group message missing: %v; want a permanent error naming %s", err, missing)
	}
	out, err := s.results(ctx, &sess, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := out[role].Result
		if r.Status != schema.ResultFailed || !strings.Contains(r.Reason, missing) {
			t.Errorf("%s result: %s (%s); want failed, naming %s", role, r.Status, r.Reason, missing)
		}
		for _, o := range r.Tasks {
			if strings.Contains(o.Reason, "no actor sample") || strings.Contains(o.Reason, "no planner sample") {
				t.Errorf("%s result: task %d %s (%s): blamed on the episode", role, o.Episode, o.State, o.Reason)
			}
		}
	}
}

// TestAMissingEndIsAnErrorToTasksOnly: the session records both episodes
// ended, but episode 1's end is not in the stream. The results that list
// only how the tasks ended (the samples could not be assembled) read it as
// not ended, and said its task was aborted ("stopped: …") or unfinished,
// where assembly calls the same an error. Now it is an error there too:
// the results list no task, and say which end is missing.
func TestAMissingEndIsAnErrorToTasksOnly(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx := context.Background()
	const n = 292
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a"}}
	sess := endedRollout(t, s, n, schema.DefaultConfig(), tasks, completedEpisode(n, 0))
	missing := subject.EpisodeEnd(n, 1)

	_, err := s.episodeEnds(ctx, &sess, tasks)
	if err == nil || !strings.Contains(err.Error(), missing) || fail.IsRetryable(err) {
		t.Fatalf("episode ends with episode 1's missing: %v; want a permanent error naming %s", err, missing)
	}
	out, err := s.tasksOnly(ctx, &sess, "samples could not be assembled", "its samples could not be assembled", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := out[role].Result
		if r.Status != schema.ResultFailed || !strings.Contains(r.Reason, missing) {
			t.Errorf("%s result: %s (%s); want failed, naming %s", role, r.Status, r.Reason, missing)
		}
		for _, o := range r.Tasks {
			if o.Episode == 1 && (o.State == schema.TaskAborted || o.State == schema.TaskUnfinished) {
				t.Errorf("%s result: episode 1, recorded ended, is %s (%s)", role, o.State, o.Reason)
			}
		}
	}
}

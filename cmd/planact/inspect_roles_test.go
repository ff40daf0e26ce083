package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/schema"
)

// TestInspectShowsEachRolesResult: inspect said a rollout ended as its
// planner's result did, "ok" where the actor's result was failed. Each
// role's result has its own status: inspect names each when they differ,
// with each one's reason, as watch does, and once when they agree.
func TestInspectShowsEachRolesResult(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	figures := schema.Stats{Episodes: 1, Ended: 1, Accuracy: 1, MeanReward: 1, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 1}}
	held := schema.Stats{Episodes: 1, TaskStates: map[string]int{schema.TaskFailed: 1}}
	var msgs []schema.Message
	for n, actor := range map[int64]*schema.Result{
		1: {Rollout: 1, Role: schema.RoleActor, Status: schema.ResultFailed, Reason: "samples could not be delivered: no store", Stats: held},
		2: {Rollout: 2, Role: schema.RoleActor, Status: schema.ResultOK, Stats: figures},
	} {
		msgs = append(msgs, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, Tasks: []schema.Task{{Prompt: "?", Label: "!"}}},
			&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor"}},
			&schema.Start{Rollout: n, Episodes: 1},
			&schema.PlanRequest{Rollout: n, Episode: 0, Turn: 1},
			&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"!"}},
			&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: figures},
			actor)
	}
	if err := b.PublishAll(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rollout, want string
	}{
		{"1", "rollout 1: planner ok, actor failed (actor: samples could not be delivered: no store), 1/1 episodes ended"},
		{"2", "rollout 2: ok, 1/1 episodes ended"},
	} {
		var out, errOut syncBuffer
		if err := run(ctx, []string{"inspect", "--nats", url, c.rollout}, noenv, nil, &out, &errOut); err != nil {
			t.Fatalf("inspect %s: %v\n%s", c.rollout, err, errOut.String())
		}
		if first, _, _ := strings.Cut(out.String(), "\n"); !strings.HasPrefix(first, c.want) {
			t.Errorf("inspect %s:\n got %q\nwant it to begin %q", c.rollout, first, c.want)
		}
	}
}

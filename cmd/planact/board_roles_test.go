package main

import (
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
)

// TestBoardShowsEachRolesResult: a finished rollout's line showed the
// first result's status only (the planner's), "ok" where the actor's
// result was failed. Each role's result has its own status: the line
// names each when they differ, with each one's reason, and once when they
// agree. A result that holds none of its samples counts no episode
// figure: the line takes the counts and the accuracy of the one that does.
func TestBoardShowsEachRolesResult(t *testing.T) {
	enc := func(m schema.Message) []byte {
		data, err := schema.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	figures := schema.Stats{Episodes: 2, Ended: 2, Accuracy: 0.5, Acts: 3, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}}
	held := schema.Stats{Episodes: 2, TaskStates: map[string]int{schema.TaskFailed: 2}}
	at := time.Now()
	for _, c := range []struct {
		name             string
		planner, actor   *schema.Result
		want, wantBefore string // the line's end, with both results and with the planner's only
	}{
		{"the actor's failed",
			&schema.Result{Rollout: 3, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: figures},
			&schema.Result{Rollout: 3, Role: schema.RoleActor, Status: schema.ResultFailed, Reason: "samples could not be delivered: no store", Stats: held},
			"2/2 episodes, 3 acts  planner ok, actor failed, accuracy 0.50, 0s (actor: samples could not be delivered: no store)",
			"2/2 episodes, 3 acts  ok, accuracy 0.50, 0s"},
		{"both ok",
			&schema.Result{Rollout: 3, Role: schema.RolePlanner, Status: schema.ResultOK, Stats: figures},
			&schema.Result{Rollout: 3, Role: schema.RoleActor, Status: schema.ResultOK, Stats: figures},
			"2/2 episodes, 3 acts  ok, accuracy 0.50, 0s",
			"2/2 episodes, 3 acts  ok, accuracy 0.50, 0s"},
		{"the planner's holds no figure",
			&schema.Result{Rollout: 3, Role: schema.RolePlanner, Status: schema.ResultFailed, Reason: "samples could not be delivered: no store", Stats: held},
			&schema.Result{Rollout: 3, Role: schema.RoleActor, Status: schema.ResultOK, Stats: figures},
			"2/2 episodes, 3 acts  planner failed, actor ok, accuracy 0.50, 0s (planner: samples could not be delivered: no store)",
			"0/2 episodes, 0 acts  failed, 0s (samples could not be delivered: no store)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBoard()
			b.apply("rollout.3.start", enc(&schema.Start{Rollout: 3, Episodes: 2}), at)
			b.apply("rollout.3.result.planner", enc(c.planner), at)
			if got := b.rows[3].line(4); !strings.HasSuffix(got, c.wantBefore) {
				t.Errorf("with the planner's result:\n got %q\nwant it to end %q", got, c.wantBefore)
			}
			if !b.apply("rollout.3.result.actor", enc(c.actor), at) && c.want != c.wantBefore {
				t.Errorf("the actor's result changed nothing")
			}
			if got := b.rows[3].line(4); !strings.HasSuffix(got, c.want) {
				t.Errorf("with both results:\n got %q\nwant it to end %q", got, c.want)
			}
			// A role's result published again (for a later arrival of the
			// number) is not the rollout's.
			if b.apply("rollout.3.result.actor", enc(&schema.Result{Rollout: 3, Role: schema.RoleActor, Status: schema.ResultTimeout}), at) {
				t.Errorf("a second actor result changed the line: %q", b.rows[3].line(4))
			}
		})
	}
}

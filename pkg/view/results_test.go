package view

import (
	"encoding/json"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestSummaryShowsEachRolesResult: a finished rollout's line had only the
// planner's result (its status and reason), "ok" where the actor's result
// was failed. Each role's result has its own status: the line lists each
// (Results), and Ending says them as `planact watch` does: once when they
// agree, else role by role with each one's reason. A result that holds
// none of its samples counts no episode figure: the accuracy is the one's
// that does. A role's later result (the answer to an arrival that came
// after the rollout ended) changes nothing; nor does compacting the rollout.
func TestSummaryShowsEachRolesResult(t *testing.T) {
	const delivery = "samples could not be delivered: no store"
	figures := schema.Stats{Episodes: 2, Ended: 2, Accuracy: 0.5, MeanReward: 0.75, EpisodeStatus: map[string]int{schema.EpisodeCompleted: 2}}
	held := schema.Stats{Episodes: 2, TaskStates: map[string]int{schema.TaskFailed: 2}}
	ok := func(role string) *schema.Result {
		return &schema.Result{Rollout: 3, Role: role, Status: schema.ResultOK, Stats: figures}
	}
	failed := func(role string) *schema.Result {
		return &schema.Result{Rollout: 3, Role: role, Status: schema.ResultFailed, Reason: delivery, Stats: held}
	}
	for _, c := range []struct {
		name                 string
		results              []*schema.Result // in the order stored
		status, reason       string           // the rollout's (the planner's result's)
		results2             []RoleResult
		ending, endingReason string
	}{
		{"the actor's failed", []*schema.Result{ok(schema.RolePlanner), failed(schema.RoleActor)},
			schema.ResultOK, "",
			[]RoleResult{{schema.RolePlanner, schema.ResultOK, ""}, {schema.RoleActor, schema.ResultFailed, delivery}},
			"planner ok, actor failed", "actor: " + delivery},
		{"the actor's failed, stored first", []*schema.Result{failed(schema.RoleActor), ok(schema.RolePlanner)},
			schema.ResultOK, "",
			[]RoleResult{{schema.RolePlanner, schema.ResultOK, ""}, {schema.RoleActor, schema.ResultFailed, delivery}},
			"planner ok, actor failed", "actor: " + delivery},
		{"the planner's holds no figure", []*schema.Result{failed(schema.RolePlanner), ok(schema.RoleActor)},
			schema.ResultFailed, delivery,
			[]RoleResult{{schema.RolePlanner, schema.ResultFailed, delivery}, {schema.RoleActor, schema.ResultOK, ""}},
			"planner failed, actor ok", "planner: " + delivery},
		{"both ok", []*schema.Result{ok(schema.RolePlanner), ok(schema.RoleActor)},
			schema.ResultOK, "",
			[]RoleResult{{schema.RolePlanner, schema.ResultOK, ""}, {schema.RoleActor, schema.ResultOK, ""}},
			"ok", ""},
		{"the planner's only so far", []*schema.Result{ok(schema.RolePlanner)},
			schema.ResultOK, "",
			[]RoleResult{{schema.RolePlanner, schema.ResultOK, ""}},
			"ok", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &state{}
			f := newFolder(t, st)
			// A reward server scores the rollout: the view cannot, and
			// the accuracy can only be a result's.
			f.fold(&schema.Arrive{Rollout: 3, Role: schema.RolePlanner, Tasks: testTasks(3, 2), Config: &schema.Config{Reward: "http://reward:9000/score"}})
			f.fold(&schema.Arrive{Rollout: 3, Role: schema.RoleActor})
			f.fold(&schema.Start{Rollout: 3, Episodes: 2})
			for e := range 2 {
				f.fold(&schema.EpisodeEnd{Rollout: 3, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"x"}})
			}
			for _, res := range c.results {
				f.fold(res)
			}
			check := func(when string) string {
				t.Helper()
				s := st.rollouts[3].summary(f.now)
				if s.Status != c.status || s.Reason != c.reason {
					t.Errorf("%s: status %q (%q), want the planner's: %q (%q)", when, s.Status, s.Reason, c.status, c.reason)
				}
				if got, want := asJSON(t, s.Results), asJSON(t, c.results2); got != want {
					t.Errorf("%s: results %s, want %s", when, got, want)
				}
				if status, reason := s.Ending(); status != c.ending || reason != c.endingReason {
					t.Errorf("%s: ending %q (%q), want %q (%q)", when, status, reason, c.ending, c.endingReason)
				}
				if s.Accuracy == nil || *s.Accuracy != figures.Accuracy || s.MeanReward == nil || *s.MeanReward != figures.MeanReward {
					t.Errorf("%s: accuracy %v, mean reward %v: want the figures of the result that holds them, %+v", when, s.Accuracy, s.MeanReward, figures)
				}
				return asJSON(t, s)
			}
			line := check("the results read")
			if len(c.results) < 2 {
				return
			}
			// Each role answers an arrival that came after the rollout
			// ended with a result of its own: not the rollout's.
			for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
				f.fold(&schema.Result{Rollout: 3, Role: role, Status: schema.ResultTimeout, Reason: "arrived after the rollout ended: done", ArrivalID: "late-" + role})
			}
			if got := check("late arrivals answered"); got != line {
				t.Errorf("late arrivals' answers changed the line:\n%s\nwant\n%s", got, line)
			}
			st.rollouts[3].compact()
			if got := check("compacted"); got != line {
				t.Errorf("compacting changed the line:\n%s\nwant\n%s", got, line)
			}
		})
	}
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

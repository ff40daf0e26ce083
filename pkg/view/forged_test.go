package view

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestFoldTakesNoArrivalWhoseSubjectDisagrees: the actor's trainer writes
// only rollout.*.arrive.actor, but what it writes there is its own: a body
// that says it is the planner's arrival at another rollout, with a task
// list and a config. The session-store refuses it (its subject and body
// disagree), on the subject's rollout and role; the view takes nothing of
// it either. Before, the view showed rollout 7 waiting on a planner
// arrival that never was, with the actor's poisoned questions and labels
// and the planner's config it made up.
func TestFoldTakesNoArrivalWhoseSubjectDisagrees(t *testing.T) {
	f := newFolder(t, &state{})
	forged := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://evil"},
		Tasks: []schema.Task{{Prompt: "poisoned", Label: "x"}}, Config: &schema.Config{MaxTurns: 9}, WeightVersion: "forged", AtMs: 1}
	data, err := schema.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, forged.MsgID())
	f.st.apply(bus.StoredMsg{Subject: "rollout.5.arrive.actor", Header: h, Data: data, Time: f.now, Seq: 1})
	if r := f.st.rollouts[7]; r != nil {
		t.Fatalf("rollout 7 shown from an arrival stored on rollout.5.arrive.actor: arrivals %v, tasks %+v, config %+v", r.arrivals, r.tasks, r.config)
	}
	// The real planner arrives later: its list and config are the rollout's.
	f.fold(&schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"},
		Tasks: []schema.Task{{Prompt: "good", Label: "y"}}, Config: &schema.Config{MaxTurns: 2}, AtMs: 2})
	r := f.st.rollouts[7]
	if len(r.tasks) != 1 || r.tasks[0].Prompt != "good" || r.config == nil || r.config.MaxTurns != 2 {
		t.Errorf("tasks %+v, config %+v: want the planner's own", r.tasks, r.config)
	}
	if a := r.arrivals[schema.RolePlanner]; a == nil || a.WeightVersion == "forged" {
		t.Errorf("planner arrival %+v: want the planner's own", a)
	}
}

// TestFoldRefusalNamesItsOwnRole: an arrival id is its trainer's to
// choose (a Nats-Msg-Id, or seq:<n> without one, which the other trainer
// can guess). The actor sends an arrival planact refuses under the id of
// the planner's: the refusal is the actor's, and the planner's task list
// and config stay the rollout's. Before, the view dropped them.
func TestFoldRefusalNamesItsOwnRole(t *testing.T) {
	f := newFolder(t, &state{})
	planner := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"},
		Tasks: []schema.Task{{Prompt: "good", Label: "y"}}, Config: &schema.Config{MaxTurns: 2}, AtMs: 1}
	f.fold(planner)
	f.fold(&schema.Result{Rollout: 7, Role: schema.RoleActor, Status: schema.ResultInvalid, Reason: "engine.url missing",
		ArrivalID: planner.MsgID(), Rejected: true})
	r := f.st.rollouts[7]
	if len(r.tasks) != 1 || r.tasks[0].Prompt != "good" || r.config == nil || r.config.MaxTurns != 2 {
		t.Errorf("after the actor's refusal under the planner's arrival id: tasks %+v, config %+v, want the planner's", r.tasks, r.config)
	}
}

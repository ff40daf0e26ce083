package view

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// foldWithID applies arrival m as stored at seq with Nats-Msg-Id id.
func (f *folder) foldWithID(m *schema.Arrive, id string, seq uint64) {
	f.t.Helper()
	data, err := schema.Marshal(m)
	if err != nil {
		f.t.Fatal(err)
	}
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, id)
	f.st.apply(bus.StoredMsg{Subject: m.Subject(), Header: h, Data: data, Time: f.now, Seq: seq})
	f.now = f.now.Add(time.Millisecond)
}

// TestFoldNamesALongArrivalIDAsPlanactDoes: an arrival whose Nats-Msg-Id
// is longer than planact takes (schema.MaxControlID) is refused, and the
// refusal names it seq:<n>, as the session-store names it. The view names
// it alike, so the refusal takes its task list and config away. Before,
// the view named it by its long id, matched no refusal with it, and
// showed the refused arrival's questions, labels and config as the
// rollout's.
func TestFoldNamesALongArrivalIDAsPlanactDoes(t *testing.T) {
	f := newFolder(t, &state{})
	poisoned := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"},
		Tasks: []schema.Task{{Prompt: "poisoned", Label: "x"}}, Config: &schema.Config{MaxTurns: 9, Reward: "em"}, WeightVersion: "w-refused", AtMs: 1}
	f.foldWithID(poisoned, strings.Repeat("x", schema.MaxControlID+1), 41)
	f.fold(&schema.Result{Rollout: 7, Role: schema.RolePlanner, Status: schema.ResultInvalid, Reason: "Nats-Msg-Id too long",
		ArrivalID: "seq:41", Rejected: true})
	r := f.st.rollouts[7]
	if r.tasks != nil || r.config != nil || r.tasksFrom != nil {
		t.Errorf("after the refusal of seq:41: tasks %+v, config %+v: want none (the arrival was refused)", r.tasks, r.config)
	}
	s := r.summary(f.now)
	if s.Status != StatusRejected || len(s.WeightVersions[schema.RolePlanner]) != 0 {
		t.Errorf("status %q, weight versions %v: want rejected, none", s.Status, s.WeightVersions)
	}
}

// TestFoldShowsTheWeightVersionsOfArrivalsTaken: a trainer that arrives
// again with other weights is refused (the rollout goes on with its first
// arrival); the rollout's weight versions are those of the arrivals
// planact took, whichever is read first. Before, the refused arrival's
// version was listed as one the rollout ran with.
func TestFoldShowsTheWeightVersionsOfArrivalsTaken(t *testing.T) {
	for _, refusalFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("refusal read first %v", refusalFirst), func(t *testing.T) {
			f := newFolder(t, &state{})
			first := &schema.Arrive{Rollout: 3, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, WeightVersion: "v1", AtMs: 1}
			again := &schema.Arrive{Rollout: 3, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, WeightVersion: "v2", AtMs: 2}
			refusal := &schema.Result{Rollout: 3, Role: schema.RolePlanner, Status: schema.ResultInvalid,
				Reason: `weight_version "v2", was "v1"`, ArrivalID: again.MsgID(), Rejected: true}
			f.fold(first)
			if refusalFirst {
				f.fold(refusal)
				f.fold(again)
			} else {
				f.fold(again)
				f.fold(refusal)
			}
			f.fold(&schema.Arrive{Rollout: 3, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://a"}, WeightVersion: "a1", AtMs: 3})
			f.fold(&schema.Start{Rollout: 3, Episodes: 1})
			got := f.st.rollouts[3].summary(f.now).WeightVersions
			if !slices.Equal(got[schema.RolePlanner], []string{"v1"}) || !slices.Equal(got[schema.RoleActor], []string{"a1"}) {
				t.Errorf("weight versions %v: want planner v1 (its refused arrival's v2 was never the rollout's), actor a1", got)
			}
		})
	}
}

package view

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// folder feeds a state messages as the streams would hand them over,
// stamped on a clock of the test's.
type folder struct {
	t   *testing.T
	st  *state
	now time.Time
	seq uint64
}

func newFolder(t *testing.T, st *state) *folder {
	f := &folder{t: t, st: st, now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	st.now = func() time.Time { return f.now }
	if st.rollouts == nil {
		st.rollouts = map[int64]*rolloutState{}
	}
	return f
}

// fold applies m, stored at the folder's clock, which then moves on a
// millisecond.
func (f *folder) fold(m schema.Message) {
	f.t.Helper()
	f.foldAt(m, f.now)
	f.now = f.now.Add(time.Millisecond)
}

func (f *folder) foldAt(m schema.Message, at time.Time) {
	f.t.Helper()
	data, err := schema.Marshal(m)
	if err != nil {
		f.t.Fatal(err)
	}
	f.seq++
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, m.MsgID())
	f.st.apply(bus.StoredMsg{Subject: m.Subject(), Header: h, Data: data, Time: at, Seq: f.seq})
}

func testTasks(n int64, episodes int) []schema.Task {
	tasks := make([]schema.Task, episodes)
	for e := range tasks {
		tasks[e] = schema.Task{GroupIndex: e, Prompt: fmt.Sprintf("rollout %d question %d: %0200d", n, e, 0), Label: fmt.Sprintf("answer %d", e)}
	}
	return tasks
}

// finished folds rollout n as planact runs it: both arrivals (the
// planner's with the tasks), the start, a turn and two acts per episode,
// the ends (half of them answered right), the result.
func (f *folder) finished(n int64, episodes int) {
	f.t.Helper()
	f.running(n, episodes)
	for e := range episodes {
		answer := "wrong"
		if e%2 == 0 {
			answer = fmt.Sprintf("answer %d", e)
		}
		f.fold(&schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{answer}})
	}
	f.fold(&schema.Result{Rollout: n, Role: schema.RoleActor, Status: schema.ResultOK})
	f.fold(&schema.Result{Rollout: n, Role: schema.RolePlanner, Status: schema.ResultOK})
}

func (f *folder) running(n int64, episodes int) {
	f.t.Helper()
	f.fold(&schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner"}, Tasks: testTasks(n, episodes),
		Config: &schema.Config{MaxTurns: 3}, AtMs: f.now.UnixMilli()})
	f.fold(&schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor"}, AtMs: f.now.UnixMilli()})
	f.fold(&schema.Start{Rollout: n, Episodes: episodes})
	for e := range episodes {
		f.fold(&schema.PlanRequest{Rollout: n, Episode: e, Turn: 1})
		for _, k := range []string{"t1-s1", "t1-s2"} {
			f.fold(&schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: k, NodeID: k[3:], Tool: "search", Status: schema.ActDoneOK,
				Output: fmt.Sprintf("%0500d", 0), Attempts: 1})
		}
	}
}

func lines(st *state, now time.Time) map[int64]string {
	out := map[int64]string{}
	for n, r := range st.rollouts {
		data, _ := json.Marshal(r.summary(now))
		out[n] = string(data)
	}
	return out
}

// TestFoldForgetsWhatItNeedNotKeep: of many finished rollouts the view
// keeps at most MaxRollouts, the oldest finished ones let go of first and
// never brought back by a late message; those beyond KeepFull keep no
// episode, act or task, and their lines are what they were in full; and a
// rollout older than the streams' history is let go of. Before, every
// rollout stayed, each with every act and its task list.
func TestFoldForgetsWhatItNeedNotKeep(t *testing.T) {
	st := &state{keepFull: 2, maxRollouts: 8, maxAge: time.Hour}
	f := newFolder(t, st)
	full := newFolder(t, &state{})
	f.running(3, 4) // never finishes: kept over the finished ones
	full.running(3, 4)
	for n := int64(10); n < 60; n++ {
		f.finished(n, 4)
		full.finished(n, 4)
	}
	if len(st.rollouts) > 8 {
		t.Fatalf("%d rollouts kept, want at most 8", len(st.rollouts))
	}
	if st.rollouts[3] == nil || st.rollouts[59] == nil || st.rollouts[10] != nil {
		t.Errorf("kept %v: want the running rollout 3 and the newest finished ones", keys(st))
	}
	want := lines(full.st, f.now)
	for n, got := range lines(st, f.now) {
		if got != want[n] {
			t.Errorf("rollout %d:\n%s\nwant (kept in full)\n%s", n, got, want[n])
		}
	}
	for n, r := range st.rollouts {
		full := n == 3 || n >= 58
		if r.compacted == full {
			t.Errorf("rollout %d compacted %v", n, r.compacted)
		}
		if r.compacted && (r.episodes != nil || r.tasks != nil || r.tasksFrom == nil || r.tasksFrom.tasks != nil) {
			t.Errorf("compacted rollout %d still holds %d episodes, %d tasks", n, len(r.episodes), len(r.tasks))
		}
	}
	// A late message of a rollout let go of does not bring it back.
	f.fold(&schema.ActDone{Rollout: 10, Episode: 0, Turn: 1, Key: "t1-s3", Status: schema.ActDoneOK})
	if st.rollouts[10] != nil {
		t.Error("a late act brought rollout 10 back")
	}
	// Past the history the streams keep, everything of those is gone.
	f.now = f.now.Add(2 * time.Hour)
	f.finished(100, 2)
	if len(st.rollouts) != 1 || st.rollouts[100] == nil {
		t.Errorf("after the history's age: %v kept, want rollout 100 only", keys(st))
	}
	f.foldAt(&schema.ActDone{Rollout: 58, Episode: 0, Turn: 1, Key: "t1-s3", Status: schema.ActDoneOK}, f.now.Add(-3*time.Hour))
	if st.rollouts[58] != nil {
		t.Error("a message older than the history brought rollout 58 back")
	}
}

func keys(st *state) []int64 {
	var out []int64
	for n := range st.rollouts {
		out = append(out, n)
	}
	return out
}

// TestFoldCompactsOnceEveryStreamIsRead: a rollout is compacted only once
// every stream was read past its result; what comes later still counts in
// its line.
func TestFoldCompactsOnceEveryStreamIsRead(t *testing.T) {
	st := &state{keepFull: 1, marks: map[string]time.Time{"ROLLOUT": {}, "ACT": {}}}
	f := newFolder(t, st)
	f.finished(1, 2)
	f.finished(2, 2)
	if st.rollouts[1].compacted {
		t.Fatal("compacted before every stream was read past its result")
	}
	st.mark("ROLLOUT", f.now)
	st.mark("ACT", f.now)
	f.fold(&schema.Start{Rollout: 3, Episodes: 1})
	r := st.rollouts[1]
	if !r.compacted {
		t.Fatal("rollout 1 not compacted once every stream was read past its result")
	}
	before := r.summary(f.now).Acts.Done
	f.fold(&schema.ActDone{Rollout: 1, Episode: 1, Turn: 2, Key: "t2-s1", Status: schema.ActDoneOK})
	if got := r.summary(f.now).Acts.Done; got != before+1 {
		t.Errorf("a late act of a compacted rollout: %d done, want %d", got, before+1)
	}
}

// TestFoldTakesTasksFromTheArrivalThatCounted: the task list and config a
// rollout shows are those of the arrivals planact took, whatever order the
// view reads them in: not a refused arrival's, and not a later arrival's
// read first. Before, the first arrival read gave them.
func TestFoldTakesTasksFromTheArrivalThatCounted(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	poison := []schema.Task{{Prompt: "poisoned", Label: "x"}}
	good := []schema.Task{{Prompt: "good", Label: "y"}}
	refused := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, Tasks: poison,
		Config: &schema.Config{MaxTurns: -2}, AtMs: 1}
	rejection := &schema.Result{Rollout: 7, Role: schema.RolePlanner, Status: schema.ResultInvalid, Reason: "config.max_turns -2",
		ArrivalID: refused.MsgID(), Rejected: true}
	corrected := &schema.Arrive{Rollout: 7, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://p"}, Tasks: good,
		Config: &schema.Config{MaxTurns: 2}, AtMs: 2}
	// An actor arriving later with another list: refused, as the list
	// stored first is the rollout's.
	late := &schema.Arrive{Rollout: 7, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://a"}, Tasks: poison, AtMs: 3}
	lateRefused := &schema.Result{Rollout: 7, Role: schema.RoleActor, Status: schema.ResultInvalid, Reason: "another list",
		ArrivalID: late.MsgID(), Rejected: true}
	type stored struct {
		m  schema.Message
		at time.Duration
	}
	msgs := map[string]stored{
		"refused": {refused, 0}, "rejection": {rejection, time.Second}, "corrected": {corrected, 2 * time.Second},
		"late": {late, 3 * time.Second}, "lateRefused": {lateRefused, 4 * time.Second},
	}
	for _, order := range [][]string{
		{"refused", "rejection", "corrected", "late", "lateRefused"},
		{"rejection", "lateRefused", "late", "corrected", "refused"}, // ROLLOUT read first, the actor's stream before the planner's
		{"late", "refused", "corrected", "rejection", "lateRefused"},
		{"corrected", "late", "refused", "rejection"}, // the actor's refusal not read yet: the list stored first
	} {
		f := newFolder(t, &state{})
		for _, name := range order {
			f.foldAt(msgs[name].m, t0.Add(msgs[name].at))
		}
		r := f.st.rollouts[7]
		if len(r.tasks) != 1 || r.tasks[0].Prompt != "good" {
			t.Errorf("read in the order %v: tasks %+v, want the corrected arrival's", order, r.tasks)
		}
		if r.config == nil || r.config.MaxTurns != 2 {
			t.Errorf("read in the order %v: config %+v, want the corrected arrival's", order, r.config)
		}
	}
}

// TestFoldReadsJSONArrivals: an arrival a trainer sent as JSON (with
// Content-Type: application/json, as `nats pub` does) is read as the
// session-store reads it: the rollout waits, with the tasks, config and
// weight version it brought. Before, the view read arrivals as msgpack
// only and showed nothing of the rollout until it started, then no
// questions, labels, config or trainer's weight version.
func TestFoldReadsJSONArrivals(t *testing.T) {
	f := newFolder(t, &state{})
	body := `{"schema": "rollout.arrive/1", "rollout": 7, "role": "planner", "at_ms": 1767225600000, "weight_version": "step-7",
		"engine": {"url": "http://127.0.0.1:30000", "protocol": "sglang"},
		"tasks": [{"prompt": "What is the capital of France?", "label": "Paris"}], "config": {"max_turns": 3}}`
	h := nats.Header{}
	h.Set(schema.HdrContentType, schema.ContentTypeJSON)
	f.st.apply(bus.StoredMsg{Subject: "rollout.7.arrive.planner", Header: h, Data: []byte(body), Time: f.now, Seq: 1})
	r := f.st.rollouts[7]
	if r == nil {
		t.Fatal("rollout 7 not shown after its planner arrived in JSON")
	}
	if s := r.summary(f.now); s.Status != StatusWaiting || !slices.Contains(s.WeightVersions[schema.RolePlanner], "step-7") {
		t.Errorf("status %q, weight versions %v: want waiting, with the planner's step-7", s.Status, s.WeightVersions)
	}
	if len(r.tasks) != 1 || r.tasks[0].Label != "Paris" || r.config == nil || r.config.MaxTurns != 3 {
		t.Errorf("tasks %+v, config %+v: want the JSON arrival's", r.tasks, r.config)
	}
}

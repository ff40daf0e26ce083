package sessionstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPausesInOneMillisecondAreEachApplied: a pause, a resume and a pause
// again of one role in one millisecond, each with its own nonce, are three
// messages on the trainer's stream (a retry of one is stored once); the
// session-store applies each and answers both pauses by their ids, and
// the role ends paused. A pause with an id of the old form (no nonce, from
// a client before nonces) is taken as ever.
func TestPausesInOneMillisecondAreEachApplied(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	sent := []schema.Message{
		&schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at, Nonce: "a"},
		&schema.Resume{Role: role, WeightVersion: "step-2", AtMs: at, Nonce: "b"},
		&schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at, Nonce: "c"},
	}
	publish := func(m schema.Message) (dup bool) {
		t.Helper()
		msg, err := bus.NewMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := s.Bus.JS.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Duplicate
	}
	for _, m := range sent {
		if publish(m) {
			t.Fatalf("%s taken for a copy of an earlier message", m.MsgID())
		}
	}
	if !publish(sent[2]) {
		t.Errorf("the last pause, sent again, was stored twice")
	}
	// handleStored hands the messages the stream holds from seq from on to
	// the session-store, in order, and returns the role's state.
	handleStored := func(from uint64) schema.RoleState {
		t.Helper()
		got, err := bus.ReadBatch(ctx, s.Bus.NC, bus.StreamTrainer(role), subject.Control(role, "*"), from, 16)
		if err != nil {
			t.Fatal(err)
		}
		for _, sm := range got.Msgs {
			m := bus.Msg{Subject: sm.Subject, Header: sm.Header, Data: sm.Data, Seq: sm.Seq, Delivered: 1}
			if err := s.handleControl(ctx, m); err != nil {
				t.Fatalf("%s (%s): %v", sm.Subject, m.ID(), err)
			}
		}
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := handleStored(1)
	if !st.Paused || st.Epoch != 3 || st.PauseID != sent[2].MsgID() || st.WeightVersion != "step-2" {
		t.Errorf("after pause, resume and pause in one millisecond: paused %v, epoch %d, pause %s, version %q; want paused by %s at epoch 3, step-2",
			st.Paused, st.Epoch, st.PauseID, st.WeightVersion, sent[2].MsgID())
	}
	answered := map[string]int64{}
	got, err := bus.ReadBatch(ctx, s.Bus.NC, bus.StreamControl, subject.Control(role, "paused"), 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, sm := range got.Msgs {
		var p schema.Paused
		if err := schema.Unmarshal(sm.Data, &p); err != nil {
			t.Fatal(err)
		}
		answered[p.PauseID] = p.Epoch
	}
	if len(answered) != 2 || answered[sent[0].MsgID()] != 1 || answered[sent[2].MsgID()] != 3 {
		t.Errorf("pauses answered (id: epoch): %v; want %s at 1 and %s at 3", answered, sent[0].MsgID(), sent[2].MsgID())
	}

	// A client before nonces: its resume and pause, ids of the old form.
	old := []schema.Message{
		&schema.Resume{Role: role, WeightVersion: "step-3", AtMs: at + 1},
		&schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at + 1},
	}
	for _, m := range old {
		publish(m)
	}
	st = handleStored(4)
	if want := "pause.actor." + strconv.FormatInt(at+1, 10); !st.Paused || st.PauseID != want || st.WeightVersion != "step-3" {
		t.Errorf("a resume and a pause of the old id form: paused %v, pause %s, version %q; want paused by %s, step-3", st.Paused, st.PauseID, st.WeightVersion, want)
	}
}

package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAControlMessageThatCannotBeReadIsAnError: what the session-store
// reads back on the control stream to answer a pause, when it is there but
// cannot be decoded, is never taken to say what it might have said. A
// gateway's drained notice like that does not say it drained: the pause is
// answered at its deadline naming the gateway missing. The last answer on
// control.<role>.paused like that is an error naming its subject and
// sequence: it was taken as no answer to the pause (a pause handled after a
// later one was refused, answered or not).
func TestAControlMessageThatCannotBeReadIsAnError(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	gw := bustest.Bus(t, url, "gw")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	garbage := func(subj string) string {
		t.Helper()
		ack, err := gw.JS.Publish(ctx, subj, []byte("garbage"))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%s sequence %d: ", subj, ack.Sequence)
	}

	// A gateway present whose drained notice cannot be read.
	gone, err := gw.Present(ctx, role, "gw-1")
	if err != nil {
		t.Fatal(err)
	}
	defer gone()
	want := garbage(subject.Control(role, "drained") + ".gw-1")
	st, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(role), func(v *schema.RoleState, _ bool) (bool, error) {
		now := time.Now().UnixMilli()
		v.Role, v.Epoch, v.StateSeq = role, v.Epoch+1, 10
		v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs = true, schema.PauseWait, "pause.actor.1", now, now+1500
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.answerPause(ctx, st); err != nil {
		t.Fatalf("answering a pause, a drained notice that cannot be read: %v; want it answered, the gateway missing", err)
	}
	var ans schema.Paused
	if m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "paused")); err != nil || m == nil {
		t.Fatalf("the pause was not answered (%v)", err)
	} else if err := m.Decode(&ans); err != nil || len(ans.Drained) != 0 || len(ans.Missing) != 1 || ans.Missing[0] != "gw-1" {
		t.Errorf("the pause's answer %+v (%v): want gw-1 missing, not drained: its notice %sdoes not say it drained", ans, err, want)
	}

	// A pause older than the role's last pause or resume, and the last
	// answer on control.actor.paused unreadable: answered or not is not
	// known, so it is neither refused nor taken as answered.
	want = garbage(subject.Control(role, "paused"))
	p := &schema.Pause{Role: role, Mode: schema.PauseWait, AtMs: time.Now().UnixMilli(), Nonce: "older"}
	data, err := schema.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	m := bus.Msg{Subject: p.Subject(), Data: data, Seq: 5, Delivered: 1, Header: nats.Header{jetstream.MsgIDHeader: []string{p.MsgID()}}}
	if err := s.handleControl(ctx, m); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not a msgpack body") {
		t.Errorf("a pause handled after a later one, the last answer unreadable: %v; want an error naming %q and the failure", err, want)
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "refused")); err != nil || m != nil {
		t.Errorf("the pause was refused (%v)", err)
	}
}

package sessionstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAPauseWaitsForEveryGatewayPresent: which gateways a pause waits for
// is what their presence records say, not who answers a ping in time. A
// gateway that answers no ping at all (as a loaded one may not) is waited
// for until it says it drained; one that never does is named missing at
// the pause's deadline; one that said it stopped is not waited for.
func TestAPauseWaitsForEveryGatewayPresent(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	gw := bustest.Bus(t, url, "gw") // registers no service: it answers no $SRV.PING
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	gone, err := gw.Present(ctx, role, "slow-gw")
	if err != nil {
		t.Fatal(err)
	}
	left, err := gw.Present(ctx, role, "left-gw")
	if err != nil {
		t.Fatal(err)
	}
	left()

	// pause records a pause of the role and answers it on its own goroutine.
	pause := func(deadline time.Duration) (schema.RoleState, chan error) {
		t.Helper()
		st, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.RoleKey(role), func(v *schema.RoleState, _ bool) (bool, error) {
			now := time.Now().UnixMilli()
			v.Role = role
			v.Epoch++
			v.Paused, v.Mode, v.PauseID, v.SinceMs, v.DeadlineMs = true, schema.PauseWait, "pause."+time.Now().String(), now, now+deadline.Milliseconds()
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		answered := make(chan error, 1)
		go func() { answered <- s.answerPause(ctx, st) }()
		return st, answered
	}
	answer := func(st schema.RoleState, answered chan error) schema.Paused {
		t.Helper()
		if err := <-answered; err != nil {
			t.Fatal(err)
		}
		m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "paused"))
		if err != nil || m == nil {
			t.Fatalf("no answer to the pause: %v", err)
		}
		var p schema.Paused
		if err := schema.Unmarshal(m.Data, &p); err != nil {
			t.Fatal(err)
		}
		if p.Epoch != st.Epoch {
			t.Fatalf("answered epoch %d, want %d", p.Epoch, st.Epoch)
		}
		return p
	}

	// Waited for past the 2 s a ping-based search gave up after.
	st, answered := pause(time.Minute)
	select {
	case err := <-answered:
		t.Fatalf("the pause was answered (%v) while slow-gw, present, had not drained", err)
	case <-time.After(3 * time.Second):
	}
	if err := gw.Publish(ctx, &schema.Drained{Role: role, Epoch: st.Epoch, Gateway: "slow-gw", Aborted: 2, AtMs: time.Now().UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	if p := answer(st, answered); !slices.Equal(p.Drained, []string{"slow-gw"}) || len(p.Missing) > 0 || p.Aborted != 2 {
		t.Errorf("paused: drained %v, missing %v, aborted %d; want slow-gw drained, 2 aborted", p.Drained, p.Missing, p.Aborted)
	}

	// Never drained: named missing at the deadline.
	st, answered = pause(1500 * time.Millisecond)
	if p := answer(st, answered); len(p.Drained) > 0 || !slices.Equal(p.Missing, []string{"slow-gw"}) {
		t.Errorf("paused: drained %v, missing %v; want slow-gw missing", p.Drained, p.Missing)
	}

	// Stopped: nothing runs, nothing to wait for.
	gone()
	st, answered = pause(time.Minute)
	if p := answer(st, answered); len(p.Drained) > 0 || len(p.Missing) > 0 {
		t.Errorf("paused with no gateway running: drained %v, missing %v; want neither", p.Drained, p.Missing)
	}
	ids, err := s.Bus.PresentGateways(ctx, role)
	if err != nil || len(ids) > 0 {
		t.Errorf("gateways present after both stopped: %v %v", ids, err)
	}
}

// TestAnOlderPauseOrResumeChangesNothing: pauses and resumes are applied
// in the order the trainer's stream holds them, whatever order they are
// handled in. A pause delivered again after the resume that ended it used
// to pause the role anew (for its whole time-out: no generation of the
// role ran); a resume delivered again after a later pause ended that
// pause, and one that named older weights recorded a rollback to them.
func TestAnOlderPauseOrResumeChangesNothing(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	msg := func(seq uint64, v schema.Message, id string) bus.Msg {
		t.Helper()
		data, err := schema.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return bus.Msg{Subject: v.Subject(), Data: data, Seq: seq, Delivered: 1, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
	}
	pause := func(seq uint64, n int64) bus.Msg {
		p := &schema.Pause{Role: role, Mode: schema.PauseWait, AtMs: at + n}
		return msg(seq, p, p.MsgID())
	}
	resume := func(seq uint64, n int64, version string) bus.Msg {
		r := &schema.Resume{Role: role, WeightVersion: version, AtMs: at + n}
		return msg(seq, r, r.MsgID())
	}
	handle := func(m bus.Msg) schema.RoleState {
		t.Helper()
		if err := s.handleControl(ctx, m); err != nil {
			t.Fatalf("%s seq %d: %v", m.Subject, m.Seq, err)
		}
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	p1, r1 := pause(10, 1), resume(11, 2, "step-2")
	handle(p1)
	if st := handle(r1); st.Paused || st.WeightVersion != "step-2" {
		t.Fatalf("after pause and resume: paused %v, version %q", st.Paused, st.WeightVersion)
	}
	epoch := handle(r1).Epoch
	if st := handle(p1); st.Paused || st.Epoch != epoch {
		t.Errorf("the pause delivered again after its resume: paused %v, epoch %d (was %d); want the role running", st.Paused, st.Epoch, epoch)
	}

	// A later pause handled before an earlier resume: the pause holds, and
	// the resume's weights (newer than the role's) are taken.
	p2, r2 := pause(13, 4), resume(12, 3, "step-3")
	if st := handle(p2); !st.Paused {
		t.Fatal("the second pause did not pause the role")
	}
	if st := handle(r2); !st.Paused || st.WeightVersion != "step-3" {
		t.Errorf("a resume older than the pause, handled after it: paused %v, version %q; want paused, step-3", st.Paused, st.WeightVersion)
	}
	r3 := resume(14, 5, "step-4")
	if st := handle(r3); st.Paused || st.WeightVersion != "step-4" {
		t.Fatalf("the second resume: paused %v, version %q", st.Paused, st.WeightVersion)
	}
	// The first resume again: no rollback to step-2, nothing announced.
	if st := handle(r1); st.WeightVersion != "step-4" || st.Rollback != nil {
		t.Errorf("a resume delivered again after later ones: version %q, rollback %+v; want step-4 and none", st.WeightVersion, st.Rollback)
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamControl, subject.Control(role, "rollback")); err != nil || m != nil {
		t.Errorf("a rollback was announced (%v)", err)
	}
}

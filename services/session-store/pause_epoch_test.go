package sessionstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// controlOf is v as its trainer's stream delivers it once, at seq.
func controlOf(t *testing.T, v schema.Message, id string, seq uint64) bus.Msg {
	t.Helper()
	data, err := schema.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bus.Msg{Subject: v.Subject(), Data: data, Seq: seq, Delivered: 1, Header: nats.Header{jetstream.MsgIDHeader: {id}}}
}

// TestPauseEpochsGrowAcrossARemovedRoleKey: a role whose key is removed
// (deleted or purged by hand, or expired at the bucket's TTL) is not
// paused, and the session-store started its epochs again at 1 on the
// next write. The answers' message ids name the epoch (paused.<role>.1,
// drained.<role>.1.<gateway>): the next pause's answer was a JetStream
// duplicate, dropped, and its trainer never got it; a gateway that does
// not answer the epoch it answered last said nothing, and the pause either
// waited to its deadline naming it missing or, as here, took its notice
// for the old epoch 1 as drained while it may still have run generations.
// A key created anew now starts at the bucket's last revision: every pause
// after a removal, by this replica or another (a restart), has an epoch
// above all before, and is answered once the gateway drained for it.
func TestPauseEpochsGrowAcrossARemovedRoleKey(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const role, gateway = schema.RoleActor, "gw-1"

	// A gateway as the actor-gateway runs one: present, its gate synced
	// from the leader, answering every pause.
	gw := bustest.Bus(t, url, "gw")
	f := session.NewFollower(gw, bustest.Logger())
	go func() { _ = f.Run(ctx) }()
	if _, err := gw.Present(ctx, role, gateway); err != nil {
		t.Fatal(err)
	}
	if err := f.SyncRole(ctx, role); err != nil {
		t.Fatal(err)
	}
	go f.AnswerPauses(ctx, role, gateway)

	at := time.Now().UnixMilli()
	seq := uint64(0)
	var epochs []int64
	pause := func(s *Service, what string) {
		t.Helper()
		seq++
		p := &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at + int64(seq)}
		if err := s.handleControl(ctx, controlOf(t, p, p.MsgID(), seq)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var ans schema.Paused
		if !lastAnswer(t, s.Bus, role, "paused", &ans) || ans.PauseID != p.MsgID() {
			t.Fatalf("%s: the last answer on %s is %+v; want the answer to %s (a duplicate of an earlier epoch's is dropped)",
				what, subject.Control(role, "paused"), ans, p.MsgID())
		}
		if !slices.Equal(ans.Drained, []string{gateway}) || len(ans.Missing) > 0 {
			t.Errorf("%s: answered epoch %d, drained %v, missing %v; want %s drained", what, ans.Epoch, ans.Drained, ans.Missing, gateway)
		}
		var d schema.Drained
		if !lastAnswer(t, s.Bus, role, "drained."+gateway, &d) || d.Epoch != ans.Epoch {
			t.Errorf("%s: answered epoch %d; the gateway's last drained notice is for epoch %d", what, ans.Epoch, d.Epoch)
		}
		if len(epochs) > 0 && ans.Epoch <= epochs[len(epochs)-1] {
			t.Errorf("%s: epoch %d, after epochs %v; want one above them all", what, ans.Epoch, epochs)
		}
		epochs = append(epochs, ans.Epoch)
	}
	resume := func(s *Service, version string) {
		t.Helper()
		seq++
		r := &schema.Resume{Role: role, WeightVersion: version, AtMs: at + int64(seq)}
		if err := s.handleControl(ctx, controlOf(t, r, r.MsgID(), seq)); err != nil {
			t.Fatal(err)
		}
	}
	key := schema.RoleKey(role)

	pause(s, "the first pause")
	resume(s, "step-1")
	if err := b.Sessions.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	pause(s, "a pause after the role's key was deleted")
	resume(s, "step-2")

	// Purged without a trace (as at the bucket's TTL once its marker is
	// gone), then created by another replica's resume before the pause.
	if err := b.Purge(ctx, "KV_"+bus.BucketSession, "$KV."+bus.BucketSession+"."+key); err != nil {
		t.Fatal(err)
	}
	other := newTestService(bustest.Bus(t, url, "ss-2"))
	resume(other, "step-3")
	pause(other, "another replica's pause after the key was purged and a resume wrote it anew")
	resume(other, "step-4")
	if err := b.Sessions.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	pause(s, "a pause after the role's key was purged")
}

// TestAPauseTheRoleStateWouldNotOutliveIsRefused: a pause may last a
// week, but the sessions bucket keeps the role's state for the history
// (24 h by default) from its last write, and a pause writes it once. A
// pause longer than that lost its key before its time-out, and the role ran
// again with no resume and no expiry said. Such a pause is now refused,
// naming timeout_s, the history and the most it may be; one that fits
// still pauses. The sweep runs every second here (newTestService): the
// time-out must be under the history less a second.
func TestAPauseTheRoleStateWouldNotOutliveIsRefused(t *testing.T) {
	for _, c := range []struct {
		history  time.Duration // 0: the default, a day
		name     string
		refused  []float64
		accepted []float64
	}{
		{name: "24h0m0s", refused: []float64{7 * 24 * 3600, 2 * 24 * 3600, 24 * 3600, 86399}, accepted: []float64{86398.5, 600}},
		{history: time.Hour, name: "1h0m0s", refused: []float64{24 * 3600, 3600, 3599}, accepted: []float64{3598, 60}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, url := bustest.Server(t)
			p := bus.Provisioning{History: c.history}
			if err := bus.Provision(t.Context(), bustest.Conn(t, url), bustest.Logger(), p); err != nil {
				t.Fatal(err)
			}
			b, err := bus.Connect(t.Context(), bus.ConnOptions{URL: url}, "ss", bustest.Logger(), p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.NC.Close)
			s := newTestService(b)
			most := (b.Provisioning.History - s.SweepEvery).Seconds()
			for i, timeoutS := range append(c.refused, c.accepted...) {
				checkPauseOutlived(t, s, uint64(i+1), timeoutS, slices.Contains(c.refused, timeoutS), c.name, most)
			}
		})
	}
}

// checkPauseOutlived sends a pause of the actor with timeoutS, delivered at
// seq, and checks that it is refused, naming history and most, or that it
// pauses the role.
func checkPauseOutlived(t *testing.T, s *Service, seq uint64, timeoutS float64, refuse bool, history string, most float64) {
	t.Helper()
	ctx := t.Context()
	const role = schema.RoleActor
	p := &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: timeoutS, AtMs: time.Now().UnixMilli(), Nonce: fmt.Sprint(seq)}
	if err := s.handleControl(ctx, controlOf(t, p, p.MsgID(), seq)); err != nil {
		t.Fatalf("timeout_s %g: %v", timeoutS, err)
	}
	var r schema.Refused
	refused := lastAnswer(t, s.Bus, role, "refused", &r) && r.ID == p.MsgID()
	st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
	if err != nil {
		t.Fatal(err)
	}
	if !refuse {
		if refused || !st.Paused || st.PauseID != p.MsgID() {
			t.Errorf("timeout_s %g: refused %v (%q), paused %v by %q; want it to pause the role", timeoutS, refused, r.Reason, st.Paused, st.PauseID)
		}
		return
	}
	if !refused {
		t.Errorf("timeout_s %g: not refused (paused %v by %q, for %v); want it refused: the role's state is kept %s",
			timeoutS, st.Paused, st.PauseID, time.UnixMilli(st.DeadlineMs).Sub(time.UnixMilli(st.SinceMs)), history)
		return
	}
	if st.PauseID == p.MsgID() {
		t.Errorf("timeout_s %g: refused, yet it paused the role", timeoutS)
	}
	for _, want := range []string{"pause of actor", fmt.Sprintf("timeout_s %g ", timeoutS), "--history " + history, fmt.Sprintf("under %g ", most)} {
		if !strings.Contains(r.Reason, want) {
			t.Errorf("timeout_s %g: refused for %q; want it to name %q", timeoutS, r.Reason, want)
		}
	}
}

package bus_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// collide says whether two subject filters can match one subject.
func collide(a, b string) bool {
	x, y := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(x) && i < len(y); i++ {
		switch {
		case x[i] == ">" || y[i] == ">":
			return true
		case x[i] != "*" && y[i] != "*" && x[i] != y[i]:
			return false
		}
	}
	return len(x) == len(y)
}

// TestLayoutKeepsTrainersApart: what trainers write and what planact
// writes never share a stream, only TIMEOUT allows message schedules, no
// stream a trainer writes allows roll-ups, purges or deletes, and every
// stream refuses a message when full but TIMEOUT (which NATS makes drop
// its oldest: the sweep stands in for a lost time-out).
func TestLayoutKeepsTrainersApart(t *testing.T) {
	cfgs := bus.DefaultProvisioning().StreamConfigs()
	for i, a := range cfgs {
		for _, b := range cfgs[i+1:] {
			for _, sa := range a.Subjects {
				for _, sb := range b.Subjects {
					if collide(sa, sb) {
						t.Errorf("%s (%s) and %s (%s) overlap", a.Name, sa, b.Name, sb)
					}
				}
			}
		}
	}
	trainer := map[string]bool{bus.StreamTrainer(schema.RolePlanner): true, bus.StreamTrainer(schema.RoleActor): true}
	for _, c := range cfgs {
		if c.MaxBytes <= 0 {
			t.Errorf("%s has no max_bytes", c.Name)
		}
		if c.Name == bus.StreamTimeout {
			if !c.AllowMsgSchedules {
				t.Errorf("TIMEOUT does not allow the session-store's schedules")
			}
			continue
		}
		if c.AllowMsgSchedules || c.AllowRollup || c.AllowMsgTTL || !c.DenyPurge || !c.DenyDelete || c.Discard != jetstream.DiscardNew {
			t.Errorf("%s: schedules %v, roll-ups %v, message TTLs %v, deny purge %v, deny delete %v, discard %v", c.Name,
				c.AllowMsgSchedules, c.AllowRollup, c.AllowMsgTTL, c.DenyPurge, c.DenyDelete, c.Discard)
		}
		// A gateway's presence is its last notice, dropped by the server
		// when not renewed within the lease.
		if c.Name == bus.StreamPresence && (c.MaxMsgsPerSubject != 1 || c.MaxAge != bus.PresenceLease || bus.PresenceLease < 5*bus.PresenceBeat) {
			t.Errorf("PRESENCE keeps %d notices per gateway for %v (renewed every %v), want 1 for the lease", c.MaxMsgsPerSubject, c.MaxAge, bus.PresenceBeat)
		}
		// What a trainer provokes in CONTROL (on five subjects of its
		// role) pushes out only its own older answers, each of bounded
		// size, and both roles' fit in two thirds of the smallest CONTROL,
		// leaving the rest to the gateways' drains: no trainer can fill it.
		if c.Name == bus.StreamControl {
			const envelope, id, version = 1 << 10, schema.MaxControlID, schema.MaxWeightVersion // headers and fields
			largest := map[string]int64{                                                        // each subject's largest message
				"refused":  envelope + 2*id + 4<<10 + 64, // its reason clipped to 4 KiB
				"resumed":  envelope + 2*id + version,
				"rollback": envelope + 2*id + 2*version,
				"paused":   envelope + 2*id,
				"expired":  envelope + 2*id,
			}
			var role int64
			for _, n := range largest {
				role += int64(c.MaxMsgsPerSubject) * n
			}
			smallest := bus.Provisioning{Storage: bus.MinStorage}.Bytes(bus.StreamControl)
			if c.MaxMsgsPerSubject != bus.ControlPerSubject || c.MaxMsgsPerSubject <= 0 || 2*role > smallest*2/3 {
				t.Errorf("CONTROL keeps %d messages per subject (want %d): a trainer's answers take up to %d bytes, both roles' more than two thirds of the smallest CONTROL (%d)",
					c.MaxMsgsPerSubject, bus.ControlPerSubject, role, smallest)
			}
		}
		if trainer[c.Name] && c.MaxMsgSize != bus.MaxTrainerMsg {
			t.Errorf("%s: max message size %d, want %d", c.Name, c.MaxMsgSize, bus.MaxTrainerMsg)
		}
	}
	// Every subject goes to the stream StreamOf names, and a trainer's
	// subjects to its own stream only.
	for subj, want := range map[string]string{
		subject.Arrive(7, schema.RolePlanner): bus.StreamTrainer(schema.RolePlanner), subject.Cancel(7, schema.RoleActor): bus.StreamTrainer(schema.RoleActor),
		subject.Control(schema.RoleActor, "pause"): bus.StreamTrainer(schema.RoleActor), subject.Control(schema.RolePlanner, "resume"): bus.StreamTrainer(schema.RolePlanner),
		subject.Control(schema.RoleActor, "paused"): bus.StreamControl, subject.Control(schema.RoleActor, "drained") + ".gw1": bus.StreamControl,
		subject.Control(schema.RolePlanner, "expired"): bus.StreamControl, subject.Control(schema.RolePlanner, "rollback"): bus.StreamControl,
		subject.Control(schema.RoleActor, "resumed"): bus.StreamControl, subject.Control(schema.RolePlanner, "refused"): bus.StreamControl,
		subject.Start(7): bus.StreamRollout, subject.Status(7): bus.StreamRollout, subject.EpisodeEnd(7, 1): bus.StreamRollout,
		subject.Result(7, schema.RolePlanner): bus.StreamRollout, subject.Rejected(7, schema.RoleActor): bus.StreamRollout, subject.Group(7, schema.RoleActor, 2): bus.StreamRollout,
		subject.TimeoutSchedule(7, "rollout"): bus.StreamTimeout, subject.Timeout(7, "rollout"): bus.StreamTimeout,
		subject.PlanReq(7, 0): bus.StreamPlan, subject.ActDone(7, 0, "t1-s1"): bus.StreamAct, subject.Presence(schema.RoleActor, "gw1"): bus.StreamPresence,
	} {
		if got := bus.StreamOf(subj); got != want {
			t.Errorf("StreamOf(%s) = %s, want %s", subj, got, want)
		}
		var holders []string
		for _, c := range cfgs {
			for _, f := range c.Subjects {
				if subject.Matches(f, subj) {
					holders = append(holders, c.Name)
				}
			}
		}
		if len(holders) != 1 || holders[0] != want {
			t.Errorf("%s is held by %v, want %s", subj, holders, want)
		}
	}
}

// TestProvisionRefusesTheOldLayout: a ROLLOUT made by an older planact
// (rollout.> with message schedules, which NATS cannot turn off) is not
// silently kept: provisioning says what to do.
func TestProvisionRefusesTheOldLayout(t *testing.T) {
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: bus.StreamRollout, Subjects: []string{"rollout.>"}, AllowMsgSchedules: true, AllowMsgTTL: true}); err != nil {
		t.Fatal(err)
	}
	err := bus.Provision(ctx, nc, bustest.Logger(), bus.Provisioning{})
	if !errors.Is(err, bus.ErrOldLayout) || !strings.Contains(err.Error(), "nats stream rm ROLLOUT") {
		t.Fatalf("provisioning over the old ROLLOUT: %v, want it refused with what to do", err)
	}
}

// TestReadObject: an object is read back without a consumer, chunk by
// chunk; a missing one is ErrObjectNotFound; one whose metadata does not
// match its data is refused.
func TestReadObject(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	store := b.Results[schema.RolePlanner]
	data := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640 kB: five chunks
	if _, err := store.PutBytes(ctx, "big", data); err != nil {
		t.Fatal(err)
	}
	got, err := bus.ReadObject(ctx, b.NC, bus.ObjectResults(schema.RolePlanner), "big", 0)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v; want %d", len(got), err, len(data))
	}
	if _, err := bus.ReadObject(ctx, b.NC, bus.ObjectResults(schema.RolePlanner), "absent", 0); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("absent object: %v", err)
	}
	if err := store.Delete(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.ReadObject(ctx, b.NC, bus.ObjectResults(schema.RolePlanner), "big", 0); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("deleted object: %v", err)
	}
	// A writer may record a digest its data does not have.
	info, err := store.PutBytes(ctx, "liar", []byte("the real data"))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := store.PutBytes(ctx, "other", []byte("some other data"))
	info.Digest = other.Digest
	meta, _ := json.Marshal(info)
	m := nats.NewMsg("$O." + bus.ObjectResults(schema.RolePlanner) + ".M." + base64.URLEncoding.EncodeToString([]byte("liar")))
	m.Header.Set("Nats-Rollup", "sub")
	m.Data = meta
	if _, err := b.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.ReadObject(ctx, b.NC, bus.ObjectResults(schema.RolePlanner), "liar", 0); err == nil || !strings.Contains(err.Error(), "does not match its digest") {
		t.Errorf("an object whose data does not match its digest: %v", err)
	}
}

// TestReadBatchAndFollow: a reader gets a stream's messages on a filter,
// in order, in batches, then what comes after, with no consumer.
func TestReadBatchAndFollow(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for e := range 5 {
		if err := b.Publish(ctx, &schema.PlanRequest{Rollout: 3, Episode: e, Turn: 1}); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx, &schema.PlanRequest{Rollout: 4, Episode: e, Turn: 1}); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := bus.ReadBatch(ctx, b.NC, bus.StreamPlan, "plan.3.>", 1, 3)
	if err != nil || len(batch.Msgs) != 3 || batch.Pending != 2 || batch.Msgs[2].Subject != "plan.3.req.2" {
		t.Fatalf("first batch: %v, %v", batch, err)
	}
	if last, err := bus.LastSeq(ctx, b.NC, bus.StreamPlan, "plan.3.>"); err != nil || last != 9 {
		t.Errorf("last of plan.3.>: %d, %v; want 9", last, err)
	}
	got := make(chan string, 16)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- bus.Follow(fctx, b.NC, bus.StreamPlan, "plan.3.>", 1, 10*time.Millisecond, func(m bus.StoredMsg) { got <- m.Subject }, nil)
	}()
	if err := b.Publish(ctx, &schema.PlanRequest{Rollout: 3, Episode: 5, Turn: 1}); err != nil {
		t.Fatal(err)
	}
	for e := range 6 {
		select {
		case s := <-got:
			if s != fmt.Sprintf("plan.3.req.%d", e) {
				t.Fatalf("message %d: %s", e, s)
			}
		case <-ctx.Done():
			t.Fatalf("message %d never came", e)
		}
	}
	stop()
	<-done
	var n int
	for _, c := range []string{bus.StreamPlan} {
		s, _ := b.JS.Stream(ctx, c)
		info, _ := s.Info(ctx)
		n += info.State.Consumers
	}
	if n != 0 {
		t.Errorf("%d consumers on PLAN after reading it", n)
	}
}

// TestFullStreamRefuses: a stream of planact's that is full refuses a new
// message with an error that says so and what to do, counted by stream;
// nothing it held is dropped.
func TestFullStreamRefuses(t *testing.T) {
	_, url := bustest.Server(t)
	ctx := context.Background()
	p := bus.Provisioning{Storage: bus.MinStorage}
	if err := bus.Provision(ctx, bustest.Conn(t, url), bustest.Logger(), p); err != nil {
		t.Fatal(err)
	}
	b, err := bus.Connect(ctx, bus.ConnOptions{URL: url}, "t", bustest.Logger(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	big := strings.Repeat("x", 60<<10)
	refusals := func() float64 {
		return testutil.ToFloat64(telemetry.StreamRefusals.WithLabelValues(bus.StreamControl, "full"))
	}
	before := refusals()
	var stored int
	for epoch := int64(1); ; epoch++ {
		err = b.Publish(ctx, &schema.Paused{Role: schema.RoleActor, Epoch: epoch, PauseID: "p", Mode: schema.PauseWait, Drained: []string{big}})
		if err != nil {
			break
		}
		stored++
		if epoch > 1000 {
			t.Fatal("CONTROL never filled")
		}
	}
	if !strings.Contains(err.Error(), "stream CONTROL is full") || !strings.Contains(err.Error(), "--storage") {
		t.Errorf("publish to a full stream: %v", err)
	}
	if refusals() != before+1 {
		t.Errorf("refusals counted %v, want %v", refusals(), before+1)
	}
	s, _ := b.JS.Stream(ctx, bus.StreamControl)
	info, _ := s.Info(ctx)
	if int(info.State.Msgs) != stored || info.State.FirstSeq != 1 {
		t.Errorf("CONTROL holds %d messages from %d, %d were stored: something was dropped", info.State.Msgs, info.State.FirstSeq, stored)
	}
}

func TestSizes(t *testing.T) {
	for _, s := range []string{"16G", "16 GiB", "512M", "1.5GB", "1048576"} {
		n, err := bus.ParseBytes(s)
		if err != nil || n <= 0 {
			t.Errorf("%q: %d, %v", s, n, err)
		}
	}
	if n, _ := bus.ParseBytes("16G"); n != 16<<30 || bus.FormatBytes(n) != "16 GiB" {
		t.Errorf("16G: %d (%s)", n, bus.FormatBytes(n))
	}
	for _, s := range []string{"", "G", "12x", "-1G"} {
		if _, err := bus.ParseBytes(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

package replay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/replay"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// TestRecordLeavesRefusedArrivalsOut: the recording's arrivals are the
// ones the rollout ran on, not arrivals the session-store refused before
// them. A refused arrival without a Nats-Msg-Id was named "" by replay and
// seq:<n> by its refusal, so the two were never matched and replay took
// the poisoned arrival; one whose body names another rollout than its
// subject was taken as the rollout's too.
func TestRecordLeavesRefusedArrivalsOut(t *testing.T) {
	const n, role = 11, schema.RoleActor
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	b := bustest.Bus(t, env.URL, "poison")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// publish stores a on the actor's arrival subject of rollout n, without
	// a message id, and waits for the session-store to refuse it.
	publish := func(what string, a *schema.Arrive) {
		t.Helper()
		msg, err := bus.NewMsg(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		msg.Subject = subject.Arrive(n, role)
		msg.Header.Del(jetstream.MsgIDHeader)
		ack, err := b.JS.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("seq:%d", ack.Sequence)
		for {
			m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, role))
			if err != nil {
				t.Fatal(err)
			}
			var r schema.Result
			if m != nil {
				if err := m.Decode(&r); err != nil {
					t.Fatal(err)
				}
			}
			if r.ArrivalID == want {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s (%s) is not refused: %v", what, want, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	poisoned := schema.Float(170)
	publish("an arrival with a temperature of 170", &schema.Arrive{Rollout: n, Role: role, Engine: env.Actor, WeightVersion: stacktest.ActorVersion,
		Sampling: &schema.Sampling{Temperature: poisoned}})
	publish("an arrival for another rollout", &schema.Arrive{Rollout: n + 1, Role: role, Engine: env.Actor, WeightVersion: "another"})

	env.Begin(t, n, stacktest.Tasks(2, 1, 3), nil)
	env.Wait(t, n)
	// The actor's result (not a client's wait for it: this connection
	// arrived with nothing, so it would take a refusal for its answer).
	for {
		m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Result(n, role))
		if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s result: %v", role, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	rec, err := replay.Record(ctx, b.NC, n)
	if err != nil {
		t.Fatal(err)
	}
	if a := rec.Arrivals[role]; a == nil || a.Rollout != n || a.Sampling != nil || a.WeightVersion != stacktest.ActorVersion {
		t.Errorf("recorded the %s's arrival %+v; want the one rollout %d ran on (no sampling, weights %s)", role, a, n, stacktest.ActorVersion)
	}
}

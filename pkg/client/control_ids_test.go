package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPausesInOneMillisecondAreEachAnswered: two pauses of a role stamped
// in the same millisecond (two trainer processes, or pause, resume and
// pause again at once) are two messages, each answered. Their ids used to
// be pause.<role>.<at_ms>: JetStream took the second for a copy of the
// first and dropped it, and its Pause returned the first one's answer
// (the role, resumed meanwhile, was not paused at all).
func TestPausesInOneMillisecondAreEachAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact") // stands in for the session-store
	ctx := t.Context()
	const role = schema.RoleActor
	at := time.UnixMilli(1767225600000)
	defer client.SetNow(func() time.Time { return at })()

	// The stand-in answers what the trainer's stream stored, as the
	// session-store does: each pause and resume by its Nats-Msg-Id, a
	// pause's epoch the stream sequence.
	errs := standIn(t, b, role, []string{subject.Control(role, "pause"), subject.Control(role, "resume")}, func(m jetstream.Msg, seq uint64) schema.Message {
		id := m.Headers().Get(jetstream.MsgIDHeader)
		if _, verb, _ := subject.ParseControl(m.Subject()); verb == "pause" {
			return &schema.Paused{Role: role, Epoch: int64(seq), PauseID: id, Mode: schema.PauseWait, AtMs: at.UnixMilli()}
		}
		return &schema.Resumed{Role: role, ResumeID: id, AtMs: at.UnixMilli()}
	})

	c1, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	first, err := c1.Pause(ctx, role, client.PauseOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Resume(ctx, role, "actor-v2"); err != nil {
		t.Fatal(err)
	}
	again, err := c1.Pause(ctx, role, client.PauseOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c2.Pause(ctx, role, client.PauseOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("the stand-in could not answer: %v", err)
	default:
	}
	// Stored: the first pause (1), the resume (2), the pause again (3) and
	// the other trainer's (4); each answered as itself.
	for _, p := range []struct {
		what string
		got  *schema.Paused
		seq  int64
	}{{"the first pause", first, 1}, {"the pause after the resume", again, 3}, {"the other trainer's pause", other, 4}} {
		if p.got.Epoch != p.seq {
			t.Errorf("%s: answered as stored at %d (%s); want its own answer, stored at %d", p.what, p.got.Epoch, p.got.PauseID, p.seq)
		}
	}
	if first.PauseID == again.PauseID || again.PauseID == other.PauseID {
		t.Errorf("pauses in one millisecond share an id: %s, %s, %s", first.PauseID, again.PauseID, other.PauseID)
	}
	last, err := bus.LastSeq(ctx, b.NC, bus.StreamTrainer(role), subject.Control(role, "*"))
	if err != nil || last != 4 {
		t.Errorf("the trainer's stream holds %d pauses and resumes (%v); want 4", last, err)
	}
}

// TestARetriedPauseIsStoredOnce: a pause or resume sent again (a publish
// whose ack was lost) keeps its message id, so the trainer's stream
// stores it once, whatever its nonce.
func TestARetriedPauseIsStoredOnce(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "provision")
	ctx := t.Context()
	const role = schema.RoleActor
	at := time.Now().UnixMilli()
	for _, m := range []schema.Message{
		&schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at, Nonce: "n1"},
		&schema.Resume{Role: role, WeightVersion: "v2", AtMs: at, Nonce: "n1"},
		&schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: 60, AtMs: at}, // a client before nonces
	} {
		for try := 1; try <= 2; try++ {
			msg, err := bus.NewMsg(ctx, m)
			if err != nil {
				t.Fatal(err)
			}
			ack, err := b.JS.PublishMsg(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			if ack.Duplicate != (try == 2) {
				t.Errorf("%s, try %d: duplicate %v", m.MsgID(), try, ack.Duplicate)
			}
		}
	}
	last, err := bus.LastSeq(ctx, b.NC, bus.StreamTrainer(role), subject.Control(role, "*"))
	if err != nil || last != 3 {
		t.Errorf("the trainer's stream holds %d pauses and resumes (%v); want 3", last, err)
	}
}

// standIn stands in for the session-store: it answers each message the
// role's trainer stream stores on subjects with answer(message, stream
// sequence), until the test ends; what goes wrong comes on the channel.
func standIn(t *testing.T, b *bus.Bus, role string, subjects []string, answer func(m jetstream.Msg, seq uint64) schema.Message) <-chan error {
	t.Helper()
	cons, err := b.JS.OrderedConsumer(t.Context(), bus.StreamTrainer(role), jetstream.OrderedConsumerConfig{FilterSubjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			errs <- err
			return
		}
		if err := b.Publish(context.Background(), answer(m, md.Sequence.Stream)); err != nil {
			errs <- err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return errs
}

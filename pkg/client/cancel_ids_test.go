package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestCancelsInOneMillisecondAreEachAnswered: two cancels of a rollout by
// one role stamped in the same millisecond (two processes of one trainer;
// a retry loop) are two messages, each answered by its own id. Their ids
// used to be cancel.<N>.<role>.<at_ms>: JetStream took the second for a
// copy of the first and dropped it, and its Cancel waited for an answer
// that never came, its whole patience.
func TestCancelsInOneMillisecondAreEachAnswered(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "planact") // stands in for the session-store
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const n, role = 150, schema.RoleActor
	at := time.UnixMilli(1767225600000)
	defer client.SetNow(func() time.Time { return at })()

	// The stand-in answers what the trainer's stream stored, as the
	// session-store does: the first cancel aborts the rollout, a later
	// one finds it ended; each answer names the cancel's Nats-Msg-Id.
	errs := standIn(t, b, role, []string{subject.Cancel(n, role)}, func(m jetstream.Msg, seq uint64) schema.Message {
		who := fmt.Sprintf("cancel %s by the %s trainer", m.Headers().Get(jetstream.MsgIDHeader), role)
		st := &schema.Status{Rollout: n, Event: "cancelled", Episode: -1, Detail: fmt.Sprintf("%s: rollout %d aborted", who, n)}
		if seq > 1 {
			st.Event = "rejected"
			st.Detail = fmt.Sprintf("%s: rollout %d had already ended (aborted at %s); nothing to abort", who, n, at.UTC().Format(time.RFC3339))
		}
		return st
	})

	c1, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Cancel(ctx, n, role, "enough"); err != nil {
		t.Fatalf("the first cancel: %v; want the rollout aborted", err)
	}
	for _, c := range []struct {
		what string
		c    *client.Client
	}{{"the other process's cancel", c2}, {"the same process's cancel again", c1}} {
		err := c.c.Cancel(ctx, n, role, "enough")
		if !errors.Is(err, client.ErrNothingToCancel) || !strings.Contains(err.Error(), "had already ended") {
			t.Errorf("%s, in the same millisecond: %v; want its own answer, ErrNothingToCancel (already ended)", c.what, err)
		}
	}
	select {
	case err := <-errs:
		t.Fatalf("the stand-in could not answer: %v", err)
	default:
	}
	last, err := bus.LastSeq(t.Context(), b.NC, bus.StreamTrainer(role), subject.Cancel(n, role))
	if err != nil || last != 3 {
		t.Errorf("the trainer's stream holds %d cancels (%v); want 3", last, err)
	}
}

// TestARetriedCancelIsStoredOnce: a cancel sent again (a publish whose ack
// was lost) keeps its message id, so the trainer's stream stores it once,
// whatever its nonce; one with the old id form (a client before nonces)
// too.
func TestARetriedCancelIsStoredOnce(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "provision")
	ctx := t.Context()
	const n, role = 151, schema.RoleActor
	at := time.Now().UnixMilli()
	storedOnceEach(t, ctx, b, subject.Cancel(n, role), role,
		&schema.Cancel{Rollout: n, Role: role, AtMs: at, Nonce: "0f0f0f0f0f0f0f0f"},
		&schema.Cancel{Rollout: n, Role: role, AtMs: at, Nonce: "1e1e1e1e1e1e1e1e"},
		&schema.Cancel{Rollout: n, Role: role, AtMs: at}, // a client before nonces
	)
}

// storedOnceEach publishes each of msgs twice, as a publish whose ack was
// lost is sent again, and checks that the trainer's stream of role stores
// each once: the second of each is a duplicate, and subj holds one each.
func storedOnceEach(t *testing.T, ctx context.Context, b *bus.Bus, subj, role string, msgs ...schema.Message) {
	t.Helper()
	for _, m := range msgs {
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
	last, err := bus.LastSeq(ctx, b.NC, bus.StreamTrainer(role), subj)
	if err != nil || last != uint64(len(msgs)) {
		t.Errorf("the trainer's stream holds %d messages on %s (%v); want %d", last, subj, err, len(msgs))
	}
}

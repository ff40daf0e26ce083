package client_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestACorrectedArrivalInTheSameMillisecondIsItsOwn: an arrival refused
// and corrected at once, stamped in the same millisecond, is a second
// message with its own answer. Its id used to be
// arrive.<N>.<role>.<attempt>.<at_ms>: JetStream took the correction for
// a copy of the refused arrival and dropped it, Arrive said it was sent,
// and Result returned the old refusal.
func TestACorrectedArrivalInTheSameMillisecondIsItsOwn(t *testing.T) {
	_, b, c, ctx := planactClient(t)
	const role = schema.RoleActor
	at := time.UnixMilli(1767225600000)
	defer client.SetNow(func() time.Time { return at })()

	// Stamped by the client's clock, or by the caller alike.
	for n, stamp := range map[int64]int64{170: 0, 171: at.UnixMilli()} {
		// The stand-in answers as the session-store does, by the id the
		// arrival came with: it refuses the first, runs the second.
		var stored atomic.Int32
		errs := standIn(t, b, role, []string{subject.Arrive(n, role)}, func(m jetstream.Msg, _ uint64) schema.Message {
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if stored.Add(1) == 1 {
				return &schema.Result{Rollout: n, Role: role, Status: schema.ResultInvalid, Rejected: true, ArrivalID: id,
					Reason: "sampling.temperature 170: want 0 to 100"}
			}
			return &schema.Result{Rollout: n, Role: role, Status: schema.ResultOK, ArrivalID: id,
				Samples: []schema.Sample{{RolloutID: "0"}}, SampleCount: 1, Stats: schema.Stats{FinishedMs: at.UnixMilli() + 1}}
		})
		bad := &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://e"}, AtMs: stamp,
			Sampling: &schema.Sampling{Temperature: schema.Float(170)}}
		if _, err := c.Rollout(ctx, bad, 0); !errors.Is(err, client.ErrRejected) {
			t.Fatalf("rollout %d, the bad arrival: %v; want ErrRejected", n, err)
		}
		good := &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://e"}, AtMs: stamp}
		res, err := c.Rollout(ctx, good, 0)
		if err != nil || res.Status != schema.ResultOK {
			t.Errorf("rollout %d, the corrected arrival in the same millisecond: %v; want its own result, ok", n, err)
		}
		select {
		case err := <-errs:
			t.Fatalf("the stand-in could not answer: %v", err)
		default:
		}
		if k := stored.Load(); k != 2 {
			t.Errorf("rollout %d: the trainer's stream stored %d arrivals; want 2", n, k)
		}
	}
}

// TestARetriedArrivalIsStoredOnce: an arrival sent again (a publish whose
// ack was lost) keeps its message id, so the trainer's stream stores it
// once, whatever its nonce; one with the old id form (a client before
// nonces) too.
func TestARetriedArrivalIsStoredOnce(t *testing.T) {
	_, b, _, ctx := planactClient(t)
	const n, role = 172, schema.RoleActor
	at := time.Now().UnixMilli()
	storedOnceEach(t, ctx, b, subject.Arrive(n, role), role,
		&schema.Arrive{Rollout: n, Role: role, AtMs: at, Nonce: "0f0f0f0f0f0f0f0f"},
		&schema.Arrive{Rollout: n, Role: role, AtMs: at, Nonce: "1e1e1e1e1e1e1e1e"},
		&schema.Arrive{Rollout: n, Role: role, AtMs: at}, // a client before nonces
	)
}

package sessionstore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// barrierWaits is how many waits at the barrier role's histogram holds.
func barrierWaits(t *testing.T, role string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := telemetry.BarrierWaitSeconds.WithLabelValues(role).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestARolloutWhoseStartFailedOnceIsCountedStarted: the arrival that
// completes the barrier writes the start, then settles it (the deadline,
// the start message, the first plan requests). When that settle failed
// (a stream that refused, a NATS hiccup), the arrival was delivered again
// and found its own write there, and the sweep or that redelivery started
// the rollout: planact_rollouts_started_total and the barrier's wait were
// counted only by the handling that wrote the start, which had failed, so
// the rollout ran and finished without ever being counted started. Now
// they are counted where the start is settled, once. (Not parallel: it
// reads process-wide metrics.)
func TestARolloutWhoseStartFailedOnceIsCountedStarted(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 171
	started, waits := testutil.ToFloat64(telemetry.RolloutsStarted), barrierWaits(t, schema.RoleActor)

	planner := &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"},
		Tasks: []schema.Task{{Prompt: "p", Label: "l"}}, AtMs: time.Now().UnixMilli()}
	if err := s.handle(ctx, delivered(t, b, planner)); err != nil {
		t.Fatal(err)
	}
	// The start's first step, its deadline on the TIMEOUT stream, is
	// refused for now.
	timeouts, err := b.JS.Stream(ctx, bus.StreamTimeout)
	if err != nil {
		t.Fatal(err)
	}
	cfg := timeouts.CachedInfo().Config
	small := cfg
	small.MaxMsgSize = 8
	if _, err := b.JS.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	actor := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: "http://actor:30000"}, AtMs: time.Now().UnixMilli()})
	if err := s.handle(ctx, actor); err == nil {
		t.Fatal("the start was settled though its deadline could not be scheduled")
	}
	if got := testutil.ToFloat64(telemetry.RolloutsStarted) - started; got != 0 {
		t.Fatalf("rollouts started %v while the start failed; want 0", got)
	}
	if _, err := b.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Delivered again: the session holds its write, and the start goes out.
	actor.Delivered = 2
	if err := s.handle(ctx, actor); err != nil {
		t.Fatal(err)
	}
	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if sess.State != schema.SessionRunning || len(sess.Outbox) != 0 {
		t.Fatalf("session %s, outbox %v; want running, its start settled", sess.State, sess.Outbox)
	}
	// Delivered once more: nothing more is counted.
	actor.Delivered = 3
	if err := s.handle(ctx, actor); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(telemetry.RolloutsStarted) - started; got != 1 {
		t.Errorf("planact_rollouts_started_total counted %v starts of the rollout; want 1", got)
	}
	if got := barrierWaits(t, schema.RoleActor) - waits; got != 1 {
		t.Errorf("planact_barrier_wait_seconds{role=actor} counted %d waits; want 1 (the actor arrived last)", got)
	}
}

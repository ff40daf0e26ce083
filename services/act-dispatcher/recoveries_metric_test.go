package actdispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// TestAWatchdogTryThatFailsCountsNoRecovery: planact_recoveries_total
// counts episodes the watchdog drove on. A try that failed (what it
// publishes again refused, here by a stream that takes nothing as large)
// was counted all the same, and again at each sweep that tried again: a
// stalled episode counted a recovery every Stall/4 while nothing was
// recovered. Now a try counts once it drove the episode on. (Not
// parallel: it reads process-wide metrics.)
func TestAWatchdogTryThatFailsCountsNoRecovery(t *testing.T) {
	s, _ := testService(t)
	const stall = time.Minute
	s.Stall = stall
	clock := &testClock{at: time.Now()}
	s.now = clock.now
	info := testInfo()
	info.Session.StartedMs = clock.now().Add(-time.Hour).UnixMilli()
	storeSession(t, s, info)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The episode's first plan request is lost: the watchdog asks again,
	// and the PLAN stream refuses it for now.
	plans, err := s.Bus.JS.Stream(ctx, bus.StreamPlan)
	if err != nil {
		t.Fatal(err)
	}
	cfg := plans.CachedInfo().Config
	small := cfg
	small.MaxMsgSize = 8
	if _, err := s.Bus.JS.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	asked := telemetry.Recoveries.WithLabelValues(Name, "plan-request")
	before := testutil.ToFloat64(asked)
	for range 3 {
		if err := s.probe(ctx, &info.Session, 0); err == nil {
			t.Fatal("the episode was driven on though the stream refused what the watchdog published")
		}
	}
	if got := testutil.ToFloat64(asked) - before; got != 0 {
		t.Errorf("three tries that drove nothing on counted %v recoveries; want 0", got)
	}
	if _, err := s.Bus.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.probe(ctx, &info.Session, 0); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(1, 0)); err != nil || m == nil {
		t.Fatalf("the planner was not asked again (%v)", err)
	}
	if got := testutil.ToFloat64(asked) - before; got != 1 {
		t.Errorf("the try that asked the planner again: %v recoveries counted in all; want 1", got)
	}
}

package telemetry_test

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// topBucket is the largest finite upper bound of h's buckets.
func topBucket(t *testing.T, h *prometheus.HistogramVec) float64 {
	t.Helper()
	var m dto.Metric
	// A child of a label value no service uses: its buckets are the
	// vector's, and nothing a service counts is touched.
	o := h.WithLabelValues("test-buckets")
	defer h.DeleteLabelValues("test-buckets")
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	top := 0.0
	for _, b := range m.GetHistogram().GetBucket() {
		if ub := b.GetUpperBound(); !math.IsInf(ub, 1) && ub > top {
			top = ub
		}
	}
	return top
}

// TestHistogramsReachWhatTheDefaultsAllow: a histogram whose largest
// bucket is below what it times puts the slow end in +Inf, where
// histogram_quantile answers the largest bucket: a p99 that reads 177 s
// for acts that take four minutes. planact_act_seconds and
// planact_engine_request_seconds stopped at 177 s, short of an act's
// four attempts of act_timeout_s (240 s) and of one planner generation's
// planner_timeout_s (300 s); planact_handler_seconds stopped at 131 s,
// short of a planner turn handled in one message. Each now reaches past
// what the default config lets it take. (Not parallel: process-wide
// metrics.)
func TestHistogramsReachWhatTheDefaultsAllow(t *testing.T) {
	cfg := schema.DefaultConfig()
	for _, c := range []struct {
		name string
		h    *prometheus.HistogramVec
		want float64 // seconds the defaults let one observation take
		why  string
	}{
		{"planact_act_seconds", telemetry.ActSeconds, float64(cfg.ActRetries+1) * cfg.ActTimeoutS, "act_retries+1 attempts of act_timeout_s"},
		{"planact_engine_request_seconds", telemetry.EngineSeconds, max(cfg.PlannerTimeoutS, cfg.ActTimeoutS), "planner_timeout_s"},
		{"planact_handler_seconds", telemetry.HandlerSeconds, cfg.PlannerTimeoutS, "a planner turn's planner_timeout_s"},
		{"planact_barrier_wait_seconds", telemetry.BarrierWaitSeconds, cfg.BarrierTimeoutS, "barrier_timeout_s"},
	} {
		if top := topBucket(t, c.h); top < c.want {
			t.Errorf("%s: largest bucket %g s; want at least %g s (%s)", c.name, top, c.want, c.why)
		}
	}
}

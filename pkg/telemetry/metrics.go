package telemetry

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics every service updates. They live in the default registry, so
// replicas in one process add up, as a scrape of the process should show.
var (
	MessagesHandled = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_messages_handled_total",
		Help: "Messages handled by a consumer, by outcome (ack, nak, later: asked again after a wait, term).",
	}, []string{"consumer", "outcome"})
	HandlerSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "planact_handler_seconds",
		Help:    "Time a consumer's handler took per message (buckets 0.5 ms to 524 s: a planner turn's planner_timeout_s, 300 s by default, fits).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 11),
	}, []string{"consumer"})
	RolloutsStarted = promauto.NewCounter(prometheus.CounterOpts{
		Name: "planact_rollouts_started_total",
		Help: "Rollouts released by the barrier (each exactly once).",
	})
	RolloutsFinished = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_rollouts_finished_total",
		Help: "Rollouts ended, by result status.",
	}, []string{"status"})
	EpisodesEnded = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_episodes_ended_total",
		Help: "Episodes ended, by status.",
	}, []string{"status"})
	Acts = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_acts_total",
		Help: "Acts executed, by outcome.",
	}, []string{"status"})
	Recoveries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_recoveries_total",
		Help: "Work finished or handed out again because no message did (a crash, a lost message, a bug): the session-store's sweep and the act-dispatcher's watchdog, by service and action; a try that failed counts once it is tried again and works.",
	}, []string{"service", "action"})
	KVOps = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_kv_ops_total",
		Help: "Key-value operations, by bucket and operation (get: a direct get any replica may answer; get_fresh: a read from the leader; create, update: compare-and-set writes).",
	}, []string{"bucket", "op"})
	StreamRefusals = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_stream_refusals_total",
		Help: "Publishes of planact's own a stream refused for its limits (full: max_bytes; message too large: max_msg_size), by stream and reason: planact drops none of its messages to make room, so a full stream stops the work that writes it until its history ages out or its limit is raised (docs/security.md, Limits).",
	}, []string{"stream", "reason"})
	KVConflicts = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_kv_conflicts_total",
		Help: "Compare-and-set writes that lost a race (another writer changed the key since it was read) and were tried again, by bucket.",
	}, []string{"bucket"})
	EngineSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "planact_engine_request_seconds",
		Help:    "Engine generation latency, by role (buckets 1 ms to 531 s: planner_timeout_s, 300 s by default, fits).",
		Buckets: prometheus.ExponentialBuckets(0.001, 3, 13),
	}, []string{"role"})
	ActSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "planact_act_seconds",
		Help:    "Time an act took from its first attempt to its outcome, retries and back-offs included, by outcome (done, failed) (buckets 1 ms to 531 s: the default act_retries+1 attempts of act_timeout_s, 240 s, fit).",
		Buckets: prometheus.ExponentialBuckets(0.001, 3, 13),
	}, []string{"status"})
	ActRetries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_act_retries_total",
		Help: "Acts tried again after a failed attempt (or postponed while no actor-gateway answers), by error kind (error, timeout, unavailable).",
	}, []string{"kind"})
	GenerationRetries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_generation_retries_total",
		Help: "Planner turns and acts sent to an engine again, each recorded with who and why (the turn's claim, the act's outcome), by role and reason (holder_gone: the instance that generated it died or stopped; gave_up: it stopped generating it; unanswered: no actor-gateway acknowledged the act's request, which went to any again and was generated anew; rerun: an act released by a turn runner that is gone, generated anew where no gateway had it running; failed: the engine failed and the attempt is tried again; paused: a pause aborted it).",
	}, []string{"role", "reason"})
	GenerationsAwaited = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_generations_awaited_total",
		Help: "Planner turns and acts asked for again while the instance generating them lived (a redelivery, a watchdog's request, a resent act), that waited for that generation instead of calling the engine again, by role.",
	}, []string{"role"})
	ActFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_act_failures_total",
		Help: "Acts that failed for good, after their last attempt, by error kind (error, invalid, timeout, unavailable, paused, stale, token_drift).",
	}, []string{"kind"})
	PauseWaits = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "planact_pause_waits",
		Help: "Work (planner turns, acts) held now by a pause of its role, by role: it goes on at the resume, or fails with paused at the pause's time-out.",
	}, []string{"role"})
	ActsInFlight = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "planact_acts_in_flight",
		Help: "Acts an act-dispatcher replica is executing now, by replica.",
	}, []string{"replica"})
	Truncations = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_truncations_total",
		Help: "Generations cut short by a limit, by role and limit: max_context_tokens (the planner's context had no room left, or less than max_new_tokens), max_new_tokens (the role's sampling limit), engine_context (the engine cut the prompt it was sent: refused).",
	}, []string{"role", "limit"})
	TokenDrift = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "planact_token_drift_total",
		Help: "Generations whose engine reported another input than planact's trajectory (prompt_token_ids, or the prompt token count), by role: each quarantines its episode (status quarantined, reason token_drift), which no role trains on.",
	}, []string{"role"})
	BarrierWaitSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "planact_barrier_wait_seconds",
		Help:    "Time from a rollout's first arrival to its start (the other role's arrival), by the role that arrived last.",
		Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
	}, []string{"role"})
)

// ServeMetrics serves /metrics on addr until ctx ends. An empty addr serves nothing.
func ServeMetrics(ctx context.Context, addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	base, err := serveHTTP(ctx, addr, mux)
	if err != nil {
		return "", err
	}
	return base + "/metrics", nil
}

// serveHTTP serves handler on its own listener at addr until ctx ends, and
// returns its base URL. Serving ends with ctx; there is nothing to report
// after that, so its error is dropped.
func serveHTTP(ctx context.Context, addr string, handler http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

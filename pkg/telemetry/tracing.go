package telemetry

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Span attributes planact sets. Spans of one rollout share its trace; these
// say where in the rollout a span is.
const (
	KeyRollout       = attribute.Key("planact.rollout")
	KeyEpisode       = attribute.Key("planact.episode")
	KeyTurn          = attribute.Key("planact.turn")
	KeyNode          = attribute.Key("planact.node")
	KeyRole          = attribute.Key("planact.role")
	KeyStatus        = attribute.Key("planact.status")
	KeyWeightVersion = attribute.Key("planact.weight_version")
	KeyReplica       = attribute.Key("planact.replica")
	KeyService       = attribute.Key("planact.service")
)

// scope is the instrumentation scope of every planact span.
const scope = "github.com/planact/planact"

// The tracer spans are started with. It is not otel's global provider, so
// that a process (a test) may start and stop tracing more than once: tracers
// taken from the global delegate stay bound to the first provider set.
type tracerState struct{ tracer trace.Tracer }

var (
	current    atomic.Pointer[tracerState] // nil: tracing is off
	noopTracer = noop.NewTracerProvider().Tracer(scope)
	noopSpan   = trace.SpanFromContext(context.Background()) // non-recording, no allocation
)

// Tracer returns the tracer planact's spans start from: the exporter's when
// StartTracing turned tracing on, a no-op one otherwise.
func Tracer() trace.Tracer {
	if st := current.Load(); st != nil {
		return st.tracer
	}
	return noopTracer
}

// TracingOn reports whether spans are exported.
func TracingOn() bool { return current.Load() != nil }

// StartSpan starts a span under the span ctx carries (a live one, or the
// remote parent a message brought). With tracing off it returns ctx as it is
// and a non-recording span, costing nothing: callers set attributes only
// when span.IsRecording().
func StartSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	st := current.Load()
	if st == nil {
		return ctx, noopSpan
	}
	ctx, span := st.tracer.Start(ctx, name, trace.WithTimestamp(spanNow()))
	return ctx, liveSpan{span}
}

// liveSpan ends on the clock it started on (spanNow) unless End is given
// a time: the SDK would end it at its start plus the monotonic time since,
// which leaves it on the timeline before a step of the wall clock while
// its children, started after, are on the one after.
type liveSpan struct{ trace.Span }

func (s liveSpan) End(opts ...trace.SpanEndOption) {
	s.Span.End(append([]trace.SpanEndOption{trace.WithTimestamp(spanNow())}, opts...)...)
}

// TracingConfig is what the OTEL_* environment asks of tracing.
type TracingConfig struct {
	On       bool   // an endpoint is set and the SDK is not disabled
	Endpoint string // the URL spans are sent to
	Protocol string // http/protobuf or grpc
	Service  string // service.name of the resource
}

// TracingConfigFromEnv reads the standard OpenTelemetry variables:
// OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// (the URL spans are posted to) or OTEL_EXPORTER_OTLP_ENDPOINT (a base URL,
// to which OTLP/HTTP adds /v1/traces), OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf, the default, or grpc), and
// OTEL_SERVICE_NAME (default service). Tracing is on only when an endpoint
// is set. A value it cannot use is an error that names the variable.
func TracingConfigFromEnv(getenv func(string) string, service string) (TracingConfig, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c := TracingConfig{Protocol: "http/protobuf", Service: service}
	if v := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); v != "" {
		c.Service = v
	}
	disabled := false
	switch v := strings.ToLower(strings.TrimSpace(getenv("OTEL_SDK_DISABLED"))); v {
	case "", "false":
	case "true":
		disabled = true
	default:
		return c, fmt.Errorf("OTEL_SDK_DISABLED=%q: want true or false", getenv("OTEL_SDK_DISABLED"))
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", "otlp":
	case "none":
		disabled = true
	default:
		return c, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: planact exports traces with otlp (or none)", v)
	}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	proto := strings.TrimSpace(getenv(protoVar))
	if proto == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		proto = strings.TrimSpace(getenv(protoVar))
	}
	switch proto {
	case "":
	case "http/protobuf", "grpc":
		c.Protocol = proto
	default:
		return c, fmt.Errorf("%s=%q: want http/protobuf or grpc", protoVar, proto)
	}
	endpointVar, signal := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", true
	endpoint := strings.TrimSpace(getenv(endpointVar))
	if endpoint == "" {
		endpointVar, signal = "OTEL_EXPORTER_OTLP_ENDPOINT", false
		endpoint = strings.TrimSpace(getenv(endpointVar))
	}
	if endpoint == "" {
		return c, nil // no collector named: off
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		port := "4318"
		if c.Protocol == "grpc" {
			port = "4317"
		}
		return c, fmt.Errorf("%s=%q: want a URL such as http://otel-collector:%s", endpointVar, endpoint, port)
	}
	if !signal && c.Protocol == "http/protobuf" {
		// The base endpoint names the collector; OTLP/HTTP posts traces to
		// its /v1/traces (the specification's rule).
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	c.Endpoint, c.On = u.String(), !disabled
	return c, nil
}

// Tracing is a running span exporter; Shutdown flushes it.
type Tracing struct {
	Config TracingConfig
	tp     *sdktrace.TracerProvider
	mine   *tracerState
	once   sync.Once
	err    error
}

// StartTracing turns tracing on as the OTEL_* environment says (see
// TracingConfigFromEnv), for the whole process, until Shutdown. With no
// endpoint set it returns a Tracing that does nothing and spans cost nothing.
func StartTracing(ctx context.Context, getenv func(string) string, service string) (*Tracing, error) {
	cfg, err := TracingConfigFromEnv(getenv, service)
	if err != nil {
		return nil, err
	}
	t := &Tracing{Config: cfg}
	if !cfg.On {
		return t, nil
	}
	var exp sdktrace.SpanExporter
	switch cfg.Protocol {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(cfg.Endpoint))
	default:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.Endpoint))
	}
	if err != nil {
		return nil, fmt.Errorf("otlp exporter for %s: %w", cfg.Endpoint, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", cfg.Service)))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithIDGenerator(idGenerator{}))
	t.mine = &tracerState{tracer: t.tp.Tracer(scope)}
	current.Store(t.mine)
	return t, nil
}

// Shutdown exports the spans still buffered and turns tracing off. It may
// be called more than once; later calls return the first one's error.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.tp == nil {
		return nil
	}
	t.once.Do(func() {
		current.CompareAndSwap(t.mine, nil)
		t.err = t.tp.Shutdown(ctx)
	})
	return t.err
}

// A rollout, an episode and a turn begin in one message (often in one
// process) and end in another, so none of them can be a span that one
// process starts and ends. Each is created where it ends, from recorded
// facts: its start is what planact's state recorded (the session's
// creation, the rollout's start, the stored time of the turn's plan
// request), its end the moment it was decided. Their span ids are derived
// from their place in the rollout (trace id, rollout, episode, turn), so
// every message of a turn can name the turn's span as its parent before
// the span exists, and the handler of that message, in whatever process,
// starts its spans (plan generation, plan parsing, an act) under it. A
// span link would have kept the processes' spans apart in separate trees;
// derived ids join them in one, as operators read a rollout.

// SpanOf returns the span a message of rollout n belongs to, in trace
// traceID (32 hex digits): turn's when turn > 0 and episode >= 0, episode's
// when episode >= 0, else the rollout's. It is invalid when traceID is.
func SpanOf(traceID string, n int64, episode, turn int) trace.SpanContext {
	tid, err := trace.TraceIDFromHex(traceID)
	if err != nil {
		return trace.SpanContext{}
	}
	if episode < 0 {
		episode, turn = -1, 0
	}
	turn = max(turn, 0)
	h := fnv.New64a()
	var b [8 * 3]byte
	binary.BigEndian.PutUint64(b[0:], uint64(n))
	binary.BigEndian.PutUint64(b[8:], uint64(int64(episode)))
	binary.BigEndian.PutUint64(b[16:], uint64(int64(turn)))
	h.Write(tid[:])
	h.Write(b[:])
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], mix(h.Sum64())|1) // never the invalid zero id
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// mix spreads every input bit over the whole id (splitmix64's finalizer):
// places that differ in one number get unrelated ids, as random ones are.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// RecordSpan exports the span of rollout n, of its episode (turn 0), or of
// the episode's turn, from start to end, under its parent (the episode's,
// the rollout's; the rollout's span is the trace's root). See SpanOf.
func RecordSpan(name, traceID string, n int64, episode, turn int, start, end time.Time, attrs ...attribute.KeyValue) {
	st := current.Load()
	if st == nil {
		return
	}
	sc := SpanOf(traceID, n, episode, turn)
	if !sc.IsValid() {
		return
	}
	ctx := context.Background()
	switch {
	case episode >= 0 && turn > 0:
		ctx = trace.ContextWithRemoteSpanContext(ctx, SpanOf(traceID, n, episode, 0))
	case episode >= 0:
		ctx = trace.ContextWithRemoteSpanContext(ctx, SpanOf(traceID, n, -1, 0))
	}
	ctx = context.WithValue(ctx, wantKey{}, sc)
	if end.Before(start) {
		end = start
	}
	_, span := st.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(end))
}

// wantKey carries, in the context a recorded span is started with, the ids
// it must have.
type wantKey struct{}

// idGenerator gives recorded spans their derived ids and every other span
// random ones.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := ctx.Value(wantKey{}).(trace.SpanContext); ok {
		return sc.TraceID(), sc.SpanID()
	}
	var tid trace.TraceID
	binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
	binary.BigEndian.PutUint64(tid[8:], rand.Uint64()|1)
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if sc, ok := ctx.Value(wantKey{}).(trace.SpanContext); ok && sc.TraceID() == traceID {
		return sc.SpanID()
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], rand.Uint64()|1)
	return sid
}

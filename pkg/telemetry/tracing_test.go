package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/telemetry"
)

func TestTracingConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		on      bool
		url     string
		proto   string
		service string
		err     string // a part of the error, which names the variable
	}{
		{name: "nothing set: off", env: nil, service: "planact"},
		{name: "base endpoint: /v1/traces added", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			on: true, url: "http://collector:4318/v1/traces", proto: "http/protobuf", service: "planact"},
		{name: "base endpoint with a path", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector/otlp/"},
			on: true, url: "https://collector/otlp/v1/traces", proto: "http/protobuf", service: "planact"},
		{name: "traces endpoint as it is, and it wins", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/custom"},
			on: true, url: "http://collector:4318/custom", proto: "http/protobuf", service: "planact"},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_SERVICE_NAME": "trainer-side"}, on: true, url: "http://collector:4317", proto: "grpc", service: "trainer-side"},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, on: true, url: "http://c:4317", proto: "grpc", service: "planact"},
		{name: "disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"},
			url: "http://c:4318/v1/traces", proto: "http/protobuf", service: "planact"},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
			url: "http://c:4318/v1/traces", proto: "http/protobuf", service: "planact"},
		{name: "bad disabled", env: map[string]string{"OTEL_SDK_DISABLED": "yes"}, err: `OTEL_SDK_DISABLED="yes"`},
		{name: "bad exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: `OTEL_TRACES_EXPORTER="zipkin"`},
		{name: "bad protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			err: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`},
		{name: "bad traces protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, err: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="udp"`},
		{name: "endpoint without scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
			err: `OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318": want a URL such as http://otel-collector:4318`},
		{name: "bad traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c/x"},
			err: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="ftp://c/x"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := telemetry.TracingConfigFromEnv(func(k string) string { return c.env[k] }, "planact")
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.On != c.on || cfg.Endpoint != c.url || (c.proto != "" && cfg.Protocol != c.proto) || cfg.Service != c.service {
				t.Errorf("config %+v, want on=%v endpoint %q protocol %q service %q", cfg, c.on, c.url, c.proto, c.service)
			}
		})
	}
}

// TestStartTracingRefusesABadEnvironment: the error reaches whoever starts
// tracing (planact up and serve), before anything runs.
func TestStartTracingRefusesABadEnvironment(t *testing.T) {
	_, err := telemetry.StartTracing(context.Background(), func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost"}[k]
	}, "planact")
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Fatalf("error %v, want one naming OTEL_EXPORTER_OTLP_ENDPOINT", err)
	}
	if telemetry.TracingOn() {
		t.Error("tracing is on after a refused start")
	}
}

// TestSpansCostNothingWhenTracingIsOff: with no endpoint, starting a span,
// asking whether it records and ending it allocate nothing, and the
// context comes back as it was.
func TestSpansCostNothingWhenTracingIsOff(t *testing.T) {
	tr, err := telemetry.StartTracing(context.Background(), func(string) string { return "" }, "planact")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	if telemetry.TracingOn() {
		t.Fatal("tracing is on with no endpoint")
	}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		sctx, span := telemetry.StartSpan(ctx, "act")
		if span.IsRecording() || sctx != ctx {
			t.Fatal("a span records with tracing off")
		}
		span.End()
		telemetry.RecordSpan("turn", "0123456789abcdef0123456789abcdef", 1, 2, 3, testNow, testNow)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per span with tracing off, want 0", allocs)
	}
}

var testNow = time.Unix(1_700_000_000, 0)

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestBadOTELVariablesStopUpAndServe: a tracing variable planact cannot use
// is refused at start, with an error that names it, before anything runs.
func TestBadOTELVariablesStopUpAndServe(t *testing.T) {
	env := map[string]string{"NATS_URL": "nats://127.0.0.1:1", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
	getenv := func(k string) string { return env[k] }
	for _, args := range [][]string{
		{"serve", "session-store"},
		{"up", "--port", "-1", "--metrics", "", "--data", t.TempDir()},
	} {
		var out bytes.Buffer
		err := run(context.Background(), args, getenv, nil, &out, &out)
		if err == nil || !strings.Contains(err.Error(), `OTEL_EXPORTER_OTLP_PROTOCOL="http/json"`) {
			t.Errorf("%s: error %v, want one naming OTEL_EXPORTER_OTLP_PROTOCOL", args[0], err)
		}
	}
}

package telemetry_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/telemetry"
)

// ServeProfiles serves nothing unless asked, serves a CPU profile (gzipped
// protobuf) for the seconds asked and the index, and stops with its context.
func TestServeProfiles(t *testing.T) {
	if url, err := telemetry.ServeProfiles(context.Background(), ""); err != nil || url != "" {
		t.Fatalf("empty address: %q, %v; want nothing served", url, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, err := telemetry.ServeProfiles(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") || !strings.HasSuffix(base, "/debug/pprof/") {
		t.Fatalf("address %q", base)
	}
	get := func(path string) []byte {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s: %s", path, resp.Status, body)
		}
		return body
	}
	if idx := get(""); !bytes.Contains(idx, []byte("goroutine")) {
		t.Fatalf("index lists no goroutine profile: %.200s", idx)
	}
	prof := get("profile?seconds=1")
	zr, err := gzip.NewReader(bytes.NewReader(prof))
	if err != nil {
		t.Fatalf("CPU profile is not gzipped protobuf: %v (%d bytes)", err, len(prof))
	}
	if raw, err := io.ReadAll(zr); err != nil || len(raw) == 0 {
		t.Fatalf("CPU profile: %d bytes, %v", len(raw), err)
	}
	cancel()
	// Once the context ends the listener closes: poll for the refusal.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base)
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("still serving after the context ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

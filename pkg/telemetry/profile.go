package telemetry

import (
	"context"
	"net/http"
	"net/http/pprof"
)

// ServeProfiles serves Go's runtime profiles (net/http/pprof: CPU, heap,
// allocations, goroutines, mutexes) under /debug/pprof/ on addr until ctx
// ends, and returns their address. An empty addr serves nothing. The
// profiles show the process's memory and code paths to whoever reaches the
// address, so it is off unless asked for, on its own listener: bind it to
// loopback.
func ServeProfiles(ctx context.Context, addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A CPU profile runs for as long as it was asked (?seconds=); the
	// server sets no write deadline that would cut it.
	base, err := serveHTTP(ctx, addr, mux)
	if err != nil {
		return "", err
	}
	return base + "/debug/pprof/", nil
}

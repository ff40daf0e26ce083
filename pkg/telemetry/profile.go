package telemetry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A CPU profile runs for as long as it was asked (?seconds=); the
	// server's write deadline must not cut it.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err
		}
	}()
	return "http://" + ln.Addr().String() + "/debug/pprof/", nil
}

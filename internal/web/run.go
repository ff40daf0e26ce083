package web

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/view"
)

// Name is the web view's target name in `planact serve` and `planact up`.
const Name = "web"

// DefaultAddr is where `planact serve web` listens unless told otherwise:
// loopback only, since the view has no access control.
const DefaultAddr = "127.0.0.1:8080"

// Listen opens addr (host:port) for the web view, with an error that says
// what is wrong with the address, or that it is in use.
func Listen(addr string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("web: address %q: want host:port, e.g. %s", addr, DefaultAddr)
	}
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("web: address %s is already in use (by another program, or another planact): choose another", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("web: cannot listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Run serves the web view of planact's rollouts on ln, reading them over
// nc, until ctx ends. It closes ln.
func Run(ctx context.Context, nc *nats.Conn, ln net.Listener, log zerolog.Logger) error {
	defer ln.Close()
	r, err := view.Open(log.WithContext(ctx), nc)
	if err != nil {
		return err
	}
	defer r.Close()
	srv := &http.Server{
		Handler:           New(r),
		ReadHeaderTimeout: 10 * time.Second,
		// The deadline of what the server writes itself (an answer to a
		// malformed request); the handlers set one on each write.
		WriteTimeout: WriteTimeout,
		// A connection kept alive between requests is closed after that
		// long idle: none is held forever.
		IdleTimeout: 2 * time.Minute,
		// Requests (event streams among them) end with ctx.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info().Str("url", "http://"+ln.Addr().String()+"/").Msg("web view")
	select {
	case err := <-served:
		return fmt.Errorf("web: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// A handler still writing to a client that does not read would
		// hold the shutdown until its write deadline: cut it.
		_ = srv.Close()
	}
	return nil
}

package sim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// ServeEngine is Serve for an engine the caller keeps (to read its Stats or
// change its weight version). done is closed once the server has stopped.
func ServeEngine(ctx context.Context, addr string, e *Engine) (url string, done <-chan struct{}, err error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{
		Handler:           e,
		ReadHeaderTimeout: 10 * time.Second,
		// Request contexts derive from ctx, so ending ctx releases hangs.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	return "http://" + ln.Addr().String(), ch, nil
}

package view_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/view"
)

// TestOpenWaitsOutASlowServer: a server that answers none of the view's
// first reads for longer than one request's time-out (5 s; a loaded
// three-node cluster in a flake hunt) delays Open but does not fail it
// while the caller's context has not ended; a server that never answers
// fails it when the context ends. Before, Open gave up after one
// unanswered request, and `planact inspect` failed with 25 s of its 30
// left. The requests' time-out is shortened here: the test waits for
// requests to go unanswered, not for the clock.
func TestOpenWaitsOutASlowServer(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	type opened struct {
		r   *view.Reader
		err error
	}
	// open starts Open through a frozen proxy, and returns once two of its
	// requests went unanswered and were asked again.
	open := func(t *testing.T, ctx context.Context) (*bustest.Proxy, <-chan opened) {
		t.Helper()
		proxy := bustest.StartProxy(t, url)
		nc := bustest.Conn(t, proxy.URL)
		proxy.Freeze()
		unanswered := make(chan error, 64)
		done := make(chan opened, 1)
		go func() {
			r, err := view.OpenPatient(ctx, nc, 100*time.Millisecond, func(err error) {
				select {
				case unanswered <- err:
				default: // counted enough
				}
			})
			done <- opened{r, err}
		}()
		for range 2 {
			select {
			case err := <-unanswered:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("asked again after %v, want only after a request's time-out", err)
				}
			case o := <-done:
				t.Fatalf("Open returned through a silent server without waiting: %v", o.err)
			}
		}
		return proxy, done
	}

	t.Run("answers late", func(t *testing.T) {
		proxy, done := open(t, t.Context())
		proxy.Thaw()
		o := <-done
		if o.err != nil {
			t.Fatalf("open through a server silent for two requests' time-outs: %v", o.err)
		}
		o.r.Close()
	})

	t.Run("never answers", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		_, done := open(t, ctx)
		cancel() // the caller's deadline
		o := <-done
		if o.err == nil {
			o.r.Close()
			t.Fatal("open through a server that never answered succeeded")
		}
		if !errors.Is(o.err, context.Canceled) || !strings.HasPrefix(o.err.Error(), "view: ") {
			t.Errorf("open through a server that never answered: %v, want the view's error ending with the context", o.err)
		}
	})
}

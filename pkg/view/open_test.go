package view_test

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/view"
)

// TestOpenWaitsOutASlowServer: a server that answers none of the view's
// first reads for longer than one request's time-out (5 s; a loaded
// three-node cluster in a flake hunt) delays Open but does not fail it
// while the caller's deadline has time left. Before, Open gave up after
// one unanswered request, and `planact inspect` failed with 25 s of its
// 30 left.
func TestOpenWaitsOutASlowServer(t *testing.T) {
	t.Parallel()
	_, url := bustest.Server(t)
	bustest.Provision(t, url)
	proxy := bustest.StartProxy(t, url)
	nc := bustest.Conn(t, proxy.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proxy.Freeze()
	type opened struct {
		r   *view.Reader
		err error
	}
	done := make(chan opened, 1)
	go func() {
		r, err := view.Open(ctx, nc)
		done <- opened{r, err}
	}()
	// Silent for longer than one request may take.
	time.Sleep(6 * time.Second)
	proxy.Thaw()
	o := <-done
	if o.err != nil {
		t.Fatalf("open through a server silent for 6 s, with a minute to spare: %v", o.err)
	}
	o.r.Close()
}

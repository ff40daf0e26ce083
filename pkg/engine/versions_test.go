package engine

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLeaseWeightVersionIsFresh: a caller is answered by a request sent
// after it asked, never by one already out (whose answer may predate a
// weight update); callers that ask while a request is out share the next
// one, and the engine is asked once at a time.
func TestLeaseWeightVersionIsFresh(t *testing.T) {
	var (
		mu       sync.Mutex
		version  = "step-1"
		requests atomic.Int64
		inFlight atomic.Int64
		most     atomic.Int64
		arrived  = make(chan struct{}, 16)
		release  = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/get_weight_version" {
			http.NotFound(w, r)
			return
		}
		requests.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		mu.Lock()
		v := version // what the engine serves when the request arrives
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		fmt.Fprintf(w, `{"weight_version": %q}`, v)
	}))
	defer srv.Close()
	p := &Pool{}
	lease, err := p.Acquire(context.Background(), ProtocolSGLang, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	ask := func() <-chan string {
		ch := make(chan string, 1)
		go func() {
			v, err := lease.WeightVersion(context.Background())
			if err != nil {
				t.Error(err)
			}
			ch <- v
		}()
		return ch
	}

	first := ask()
	<-arrived // the first request is out, and has read step-1
	mu.Lock()
	version = "step-2" // the weights are updated meanwhile
	mu.Unlock()
	later := []<-chan string{ask(), ask(), ask()}
	waitFor(t, "three callers waiting for the next request", func() bool {
		pr := lease.p.versions
		pr.mu.Lock()
		defer pr.mu.Unlock()
		return pr.next != nil && pr.next.waiters == 3
	})
	release <- struct{}{} // the first request answers
	if v := <-first; v != "step-1" {
		t.Errorf("first caller: %q, want step-1", v)
	}
	<-arrived // the second request, for everyone who asked after the first was out
	release <- struct{}{}
	for i, ch := range later {
		if v := <-ch; v != "step-2" {
			t.Errorf("caller %d, who asked after the update: %q, want step-2", i, v)
		}
	}
	if got := requests.Load(); got != 2 {
		t.Errorf("%d requests for four callers in two batches, want 2", got)
	}
	if got := most.Load(); got != 1 {
		t.Errorf("%d requests at once, want 1", got)
	}
	// A caller who gave up asks nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lease.WeightVersion(ctx); err == nil || requests.Load() != 2 {
		t.Errorf("a cancelled caller: %v after %d requests, want its context's error and no request", err, requests.Load())
	}
	close(release)
}

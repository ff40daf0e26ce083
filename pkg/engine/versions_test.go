package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/planact/planact/pkg/fail"
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

// versionServer is an engine that answers its weight version at path
// alone (404 elsewhere; "" answers nowhere, as vLLM), a newer one at each
// request, and counts the requests per path.
func versionServer(t *testing.T, path string) (url string, asked func() map[string]int) {
	t.Helper()
	var (
		mu    sync.Mutex
		count = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		count[r.URL.Path]++
		n := count[r.URL.Path]
		mu.Unlock()
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"weight_version":"step-%d"}`, n)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(count)
	}
}

// TestWeightVersionRemembersAbsentEndpoints: a client remembers which of
// an engine's weight-version endpoints answered 404 and asks only the
// others, so that an engine without weight versions (vLLM) costs no
// request per check once it said so (it cost three, every check, under
// max_staleness); what it serves is asked every time, never remembered;
// and an endpoint that answered 404 is asked again absentRecheck later.
func TestWeightVersionRemembersAbsentEndpoints(t *testing.T) {
	ctx := context.Background()
	const checks = 5
	for _, proto := range Protocols {
		t.Run(proto+"/none", func(t *testing.T) {
			url, asked := versionServer(t, "")
			c, _ := New(proto, url, "m", nil)
			for i := range checks {
				if v, err := c.WeightVersion(ctx); !errors.Is(err, ErrNotSupported) || fail.KindOf(err) != fail.Permanent {
					t.Fatalf("check %d: %q, %v; want ErrNotSupported", i, v, err)
				}
			}
			want := map[string]int{"/get_weight_version": 1, "/get_model_info": 1, "/model_info": 1}
			if got := asked(); !maps.Equal(got, want) {
				t.Errorf("requests %v over %d checks, want %v", got, checks, want)
			}
		})
		t.Run(proto+"/model_info", func(t *testing.T) {
			url, asked := versionServer(t, "/model_info")
			c, _ := New(proto, url, "m", nil)
			for i := range checks {
				// Each check's answer is the engine's to a request of its own.
				if v, err := c.WeightVersion(ctx); v != fmt.Sprintf("step-%d", i+1) || err != nil {
					t.Fatalf("check %d: %q, %v; want step-%d", i, v, err, i+1)
				}
			}
			want := map[string]int{"/get_weight_version": 1, "/get_model_info": 1, "/model_info": checks}
			if got := asked(); !maps.Equal(got, want) {
				t.Errorf("requests %v over %d checks, want %v", got, checks, want)
			}
		})
	}
	t.Run("asked again later", func(t *testing.T) {
		url, asked := versionServer(t, "")
		c, _ := New(ProtocolOpenAI, url, "m", nil)
		now := time.Unix(1000, 0)
		c.(*OpenAI).absent.now = func() time.Time { return now }
		check := func(what string, want int) {
			t.Helper()
			if _, err := c.WeightVersion(ctx); !errors.Is(err, ErrNotSupported) {
				t.Fatalf("%s: %v; want ErrNotSupported", what, err)
			}
			if got := asked()["/get_weight_version"]; got != want {
				t.Errorf("%s: /get_weight_version asked %d times, want %d", what, got, want)
			}
		}
		check("first check", 1)
		now = now.Add(absentRecheck - time.Nanosecond)
		check("just before absentRecheck", 1)
		now = now.Add(time.Nanosecond)
		check("at absentRecheck", 2)
	})
}

package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolBoundsGenerationsPerEngine: with a limit of 3, no more than 3
// requests reach one engine at once, however many callers there are, and
// each engine has its own limit.
func TestPoolBoundsGenerationsPerEngine(t *testing.T) {
	var now, peak atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		now.Add(-1)
		w.Write([]byte(`{"text":"x","output_ids":[4],"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-0.5,4,null]]}}`))
	}))
	defer srv.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"text":"y","output_ids":[5],"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-0.5,5,null]]}}`))
	}))
	defer other.Close()

	p := &Pool{Limit: 3}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.Acquire(ctx, "sglang", srv.URL, "")
			if err != nil {
				t.Error(err)
				return
			}
			defer l.Release()
			if _, err := l.Generate(ctx, Request{InputIDs: []int{1}}); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.InFlight("sglang", srv.URL, "") < 3 || now.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("3 generations never got in flight (%d)", now.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The other engine is not blocked by the first one's full slots.
	l, err := p.Acquire(ctx, "sglang", other.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Generate(ctx, Request{InputIDs: []int{1}}); err != nil {
		t.Fatal(err)
	}
	l.Release()
	// A caller that gives up while waiting for a slot gets its context error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Acquire(cctx, "sglang", srv.URL, ""); err == nil {
		t.Error("Acquire on a full engine with a cancelled context: want an error")
	}
	close(release)
	wg.Wait()
	if got := peak.Load(); got != 3 {
		t.Errorf("peak concurrency %d, want 3", got)
	}
}

// TestPoolQueuesFairly: callers waiting for a slot get it in the order they
// came; one that gives up leaves the queue and takes no slot from those
// behind it.
func TestPoolQueuesFairly(t *testing.T) {
	p := &Pool{Limit: 1}
	const proto, url = "sglang", "http://engine.invalid"
	ctx := context.Background()
	held, err := p.Acquire(ctx, proto, url, "")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 3)
	cancelB, cancelled := context.WithCancel(ctx)
	errB := make(chan error, 1)
	for i, name := range []string{"a", "b", "c"} {
		go func() {
			wctx := ctx
			if name == "b" {
				wctx = cancelB
			}
			l, err := p.Acquire(wctx, proto, url, "")
			if name == "b" {
				errB <- err
				if err == nil {
					l.Release()
				}
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			got <- name // before Release: the order in got is the order served
			l.Release()
		}()
		// Queue them one after the other.
		deadline := time.Now().Add(10 * time.Second)
		for p.Waiting(proto, url, "") != i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %s never queued", name)
			}
			time.Sleep(time.Millisecond)
		}
	}
	cancelled()
	if err := <-errB; err == nil {
		t.Fatal("a waiter that gave up got a slot")
	}
	if n := p.Waiting(proto, url, ""); n != 2 {
		t.Fatalf("%d waiting after one gave up, want 2", n)
	}
	// A newcomer does not overtake the queue.
	late := make(chan string, 1)
	go func() {
		l, err := p.Acquire(ctx, proto, url, "")
		if err == nil {
			late <- "late"
			l.Release()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Waiting(proto, url, "") != 3 {
		if time.Now().After(deadline) {
			t.Fatal("newcomer never queued")
		}
		time.Sleep(time.Millisecond)
	}
	held.Release()
	held.Release() // a second Release is harmless
	if a, c, l := <-got, <-got, <-late; a != "a" || c != "c" || l != "late" {
		t.Errorf("served %s, %s, %s; want a, c, late", a, c, l)
	}
	deadline = time.Now().Add(10 * time.Second)
	for p.InFlight(proto, url, "") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still held", p.InFlight(proto, url, ""))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseTokenizeRemembers: the same text is tokenized by the engine
// once; what a caller does to the ids it got does not change the next
// answer; a cache over its limit forgets the oldest text.
func TestLeaseTokenizeRemembers(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		ids := []int{}
		for _, b := range []byte(req.Prompt) {
			ids = append(ids, int(b))
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids})
	}))
	defer srv.Close()
	p := &Pool{}
	lease, err := p.Acquire(context.Background(), ProtocolSGLang, srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	ctx := context.Background()
	first, err := lease.Tokenize(ctx, "ab")
	if err != nil || !slices.Equal(first, []int{'a', 'b'}) {
		t.Fatalf("tokenize: %v %v", first, err)
	}
	first[0] = 0 // a caller changing its copy
	again, err := lease.Tokenize(ctx, "ab")
	if err != nil || !slices.Equal(again, []int{'a', 'b'}) || calls.Load() != 1 {
		t.Fatalf("again: %v %v after %d engine calls, want the first answer from one call", again, err, calls.Load())
	}
	c := newTokenCache(2)
	c.put("x", []int{1})
	c.put("y", []int{2})
	c.get("x") // x is the most recent now
	c.put("z", []int{3})
	if _, ok := c.get("y"); ok {
		t.Error("the least recently used text was kept over the limit")
	}
	if _, ok := c.get("x"); !ok {
		t.Error("a recently used text was forgotten")
	}
}

// TestPoolSharesCapacity: an engine's stated capacity is divided among the
// live replicas (at least 1 each); a share that shrinks starts nothing
// above it, one that grows starts those waiting at once; OnLimits hears
// the total; an engine without one keeps Limit.
func TestPoolSharesCapacity(t *testing.T) {
	replicas := 2
	var totals []int
	p := &Pool{Limit: 5, Replicas: func() int { return replicas }, OnLimits: func(n int) { totals = append(totals, n) }}
	ctx := context.Background()
	var leases []*Lease
	for range 5 {
		l, err := p.AcquireShare(ctx, "sglang", "http://a", "", 10)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if got := p.EngineLimit("sglang", "http://a", ""); got != 5 {
		t.Fatalf("10 shared by 2 replicas: limit %d, want 5", got)
	}
	waited := make(chan *Lease, 1)
	go func() {
		l, err := p.AcquireShare(ctx, "sglang", "http://a", "", 10)
		if err != nil {
			t.Error(err)
		}
		waited <- l
	}()
	for p.Waiting("sglang", "http://a", "") != 1 {
		time.Sleep(time.Millisecond)
	}
	replicas = 3
	p.Rebalance() // 3: the share shrinks to 3, with 5 running
	leases[0].Release()
	leases[1].Release()
	select {
	case <-waited:
		t.Fatal("a generation started above the shrunk share")
	default:
	}
	replicas = 1
	p.Rebalance() // alone: 10, the waiter starts
	leases = append(leases[2:], <-waited)
	if got := p.InFlight("sglang", "http://a", ""); got != 4 {
		t.Fatalf("in flight %d, want 4", got)
	}
	replicas = 20
	p.Rebalance()
	if got := p.EngineLimit("sglang", "http://a", ""); got != 1 {
		t.Fatalf("10 shared by 20 replicas: limit %d, want at least 1", got)
	}
	if _, err := p.AcquireShare(ctx, "sglang", "http://b", "", 0); err != nil {
		t.Fatal(err)
	}
	if got := p.EngineLimit("sglang", "http://b", ""); got != 5 {
		t.Fatalf("an engine without a capacity: limit %d, want Limit 5", got)
	}
	if want := []int{5, 3, 10, 1, 6}; !slices.Equal(totals, want) {
		t.Fatalf("OnLimits heard %v, want %v", totals, want)
	}
	for _, l := range leases {
		l.Release()
	}
}

// TestPoolHoldsStatedCapacityFromTheFirstAcquire: callers that arrive at
// once at an engine the pool has not seen yet never hold more than its
// share of the stated capacity, not even for a moment under the default
// Limit.
func TestPoolHoldsStatedCapacityFromTheFirstAcquire(t *testing.T) {
	for _, tc := range []struct{ capacity, replicas, want int }{{2, 1, 2}, {4, 2, 2}, {1, 1, 1}} {
		for round := range 20 {
			// Replicas yields, as bus.Peers.N may wait for its lock: others
			// run in the meantime.
			p := &Pool{Replicas: func() int { runtime.Gosched(); return tc.replicas }}
			url := fmt.Sprintf("http://engine-%d.invalid", round)
			var now, peak atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					l, err := p.AcquireShare(context.Background(), "sglang", url, "", tc.capacity)
					if err != nil {
						t.Error(err)
						return
					}
					n := now.Add(1)
					for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
					}
					runtime.Gosched()
					now.Add(-1)
					l.Release()
				}()
			}
			close(start)
			wg.Wait()
			if got := peak.Load(); got > int64(tc.want) {
				t.Fatalf("capacity %d over %d replicas: %d held at once, want at most %d", tc.capacity, tc.replicas, got, tc.want)
			}
		}
	}
}

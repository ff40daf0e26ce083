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

// TestPoolNamesAnEngineAsItsClientReachesIt: the same server, its url
// spelt with a trailing slash (or an OpenAI server's /v1), its protocol left
// to the default, or an SGLang engine under another model name, is one
// engine with one share; OnLimits counts it once.
func TestPoolNamesAnEngineAsItsClientReachesIt(t *testing.T) {
	var total atomic.Int64
	p := &Pool{OnLimits: func(n int) { total.Store(int64(n)) }}
	ctx := context.Background()
	for _, tc := range []struct {
		protocol, url, model string
		want                 int64
	}{
		{"sglang", "http://a:30000", "m", 8},
		{"sglang", "http://b:30000", "m", 16},
		{"sglang", "http://b:30000/", "m", 16},
		{"sglang", "http://c:30000", "m", 24},
		{"", "http://c:30000", "m", 24},
		{"sglang", "http://c:30000//", "other", 24},
		{"openai", "http://d:8000/v1", "m", 32},
		{"openai", "http://d:8000/", "m", 32},
		{"openai", "http://d:8000/v1/", "m", 32},
		{"openai", "http://d:8000", "lora-2", 40}, // another model on vLLM: requests say which
		{"openai-chat", "http://d:8000/v1", "m", 48},
	} {
		l, err := p.AcquireShare(ctx, tc.protocol, tc.url, tc.model, 8)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
		if got := total.Load(); got != tc.want {
			t.Fatalf("after %q %s %q: width %d, want %d", tc.protocol, tc.url, tc.model, got, tc.want)
		}
	}
	if got := p.EngineLimit("", "http://c:30000/", ""); got != 8 {
		t.Errorf("engine c by another spelling: limit %d, want 8", got)
	}
	l, err := p.AcquireShare(ctx, "", "http://b:30000/", "x", 8)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.InFlight("sglang", "http://b:30000", "m"); got != 1 {
		t.Errorf("engine b in flight %d by another spelling, want 1", got)
	}
	l.Release()
}

// TestPoolForgetsIdleEngines: an engine with no lease held or waited for
// and no acquire for Idle leaves OnLimits' total and is dropped with its
// caches; one whose lease is held, or that a caller waits for, is kept
// however long; one acquired again after it was forgotten starts anew,
// with the capacity stated then.
func TestPoolForgetsIdleEngines(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1e9, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	var totals []int
	p := &Pool{Idle: time.Minute, now: now, OnLimits: func(n int) { mu.Lock(); totals = append(totals, n); mu.Unlock() }}
	width := func() int { mu.Lock(); defer mu.Unlock(); return totals[len(totals)-1] }
	ctx := context.Background()
	acquire := func(url string, capacity int) *Lease {
		t.Helper()
		l, err := p.AcquireShare(ctx, "sglang", url, "", capacity)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a := acquire("http://a", 8)
	a.p.tokens.put("prompt", []int{1, 2})
	a.Release()
	held := acquire("http://held", 2)
	queued := acquire("http://queued", 1)
	waited := make(chan *Lease, 1)
	go func() {
		l, err := p.AcquireShare(ctx, "sglang", "http://queued", "", 1)
		if err != nil {
			t.Error(err)
		}
		waited <- l
	}()
	for p.Waiting("sglang", "http://queued", "") != 1 {
		time.Sleep(time.Millisecond)
	}
	if got := width(); got != 8+2+1 {
		t.Fatalf("width %d, want 11", got)
	}

	advance(59 * time.Second)
	p.Rebalance()
	if got := width(); got != 11 {
		t.Fatalf("after 59s: width %d, want 11: nothing idle for a minute yet", got)
	}
	advance(time.Second)
	b := acquire("http://b", 4) // a's minute is up: forgotten as b comes
	if got := width(); got != 2+1+4 {
		t.Fatalf("a idle for a minute: width %d, want 7 (held 2, queued 1, b 4)", got)
	}
	if p.EngineLimit("sglang", "http://a", "") != p.Limit {
		t.Fatal("a forgotten engine is still known")
	}
	advance(time.Hour)
	p.Rebalance()
	if got := width(); got != 2+1+4 {
		t.Fatalf("an hour on: width %d, want 7: every engine left has a lease held or waited for", got)
	}
	if p.Waiting("sglang", "http://queued", "") != 1 {
		t.Fatal("the caller waiting for a forgotten engine's slot lost its place")
	}
	queued.Release() // to the waiter, on the engine it waited for
	queued = <-waited
	if got := p.InFlight("", "http://queued/", ""); got != 1 {
		t.Fatalf("queued engine: %d in flight, want the waiter's 1", got)
	}
	queued.Release()
	b.Release()
	advance(59 * time.Second)
	p.Rebalance()
	if got := width(); got != 7 {
		t.Fatalf("b and queued released 59s ago: width %d, want 7", got)
	}
	advance(time.Second)
	p.Rebalance()
	if got := width(); got != 2 {
		t.Fatalf("b and queued released a minute ago: width %d, want 2 (held)", got)
	}
	a = acquire("http://a", 3) // back, with another capacity
	if _, ok := a.p.tokens.get("prompt"); ok {
		t.Error("a forgotten engine came back with its token cache")
	}
	if got := p.EngineLimit("", "http://a/", ""); got != 3 {
		t.Errorf("a back: limit %d, want 3, the capacity stated now", got)
	}
	if got := width(); got != 2+3 {
		t.Fatalf("a back: width %d, want 5", got)
	}
	a.Release()
	held.Release()
}

// TestPoolKeepsAnEngineBeingAcquired: however short Idle, an engine is
// never forgotten while a caller holds, waits for or is about to wait for
// its slot: a second entry for it would hold a second share of its
// capacity.
func TestPoolKeepsAnEngineBeingAcquired(t *testing.T) {
	var ticks atomic.Int64
	now := func() time.Time { return time.Unix(0, 0).Add(time.Duration(ticks.Add(1)) * time.Second) } // every look a second later
	p := &Pool{Idle: time.Nanosecond, now: now, Replicas: func() int { runtime.Gosched(); return 1 }}
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				l, err := p.AcquireShare(context.Background(), "sglang", "http://one", "", 1)
				if err != nil {
					t.Error(err)
					return
				}
				n := held.Add(1)
				for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
				}
				runtime.Gosched()
				held.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	if got := peak.Load(); got != 1 {
		t.Fatalf("%d generations at once on an engine of capacity 1", got)
	}
}

package engine

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Pool shares one client per engine and bounds the generations in flight
// on each engine, so that a burst of acts queues here instead of
// overloading a server. Callers wait for a slot first come, first served;
// one that gives up (its context ends) leaves the queue and takes no slot.
type Pool struct {
	// Limit is the maximum concurrent generations per engine whose
	// capacity is not stated; 0 means 64.
	Limit int
	// Replicas, when set, says how many live replicas share each stated
	// capacity (bus.Peers.N): this pool keeps floor(capacity / replicas),
	// at least 1, of it. Call Rebalance when it changes.
	Replicas func() int
	// OnLimits, when set, is told the sum of the limits of the engines this
	// pool knows whenever it changes (a consumer's width follows it).
	OnLimits func(total int)
	// HTTP is shared by every client; nil means a pooled transport sized for Limit.
	HTTP *http.Client
	// Backoff is how the clients wait out a busy engine (429, 503).
	Backoff Backoff

	once        sync.Once
	rebalancing sync.Mutex // one Rebalance at a time, so OnLimits hears the last total last
	mu          sync.Mutex
	engines     map[string]*pooled
}

type pooled struct {
	capacity int  // the engine's stated capacity, shared with the other replicas; 0: Limit
	balanced bool // its limit was set from capacity (a new engine's is Limit until then)
	client   Client
	slots    *slots
	tokens   *tokenCache
	versions *versionProbe
}

// Lease is a client with one of its engine's slots held; Release it.
type Lease struct {
	Client
	p    *pooled
	once sync.Once
}

// Release gives the slot back (once; later calls do nothing).
func (l *Lease) Release() { l.once.Do(l.p.slots.release) }

// Acquire waits for a free slot on the engine and returns its client.
func (p *Pool) Acquire(ctx context.Context, protocol, url, model string) (*Lease, error) {
	return p.AcquireShare(ctx, protocol, url, model, 0)
}

// AcquireShare is Acquire on an engine that serves capacity generations at
// once, shared by the pools of every live replica (Replicas); capacity 0
// means this pool's Limit, its own.
func (p *Pool) AcquireShare(ctx context.Context, protocol, url, model string, capacity int) (*Lease, error) {
	p.init()
	n := p.replicas() // before p.mu: Replicas may wait for a lock of its own
	p.mu.Lock()
	e, err := p.engineLocked(protocol, url, model)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	changed := e.capacity != capacity || !e.balanced
	if changed {
		// The limit changes with the capacity, under the same lock: a
		// caller that sees the capacity set acquires under its limit, never
		// under the Limit a new engine starts with.
		e.capacity, e.balanced = capacity, true
		e.slots.setLimit(p.share(capacity, n))
	}
	p.mu.Unlock()
	if changed {
		p.Rebalance() // OnLimits hears the new total
	}
	if err := e.slots.acquire(ctx); err != nil {
		return nil, err
	}
	return &Lease{Client: e.client, p: e}, nil
}

// Client returns the engine's shared client without taking a slot: for
// what is not a generation (Pause, Resume, WeightVersion, Health).
func (p *Pool) Client(protocol, url, model string) (Client, error) {
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	e, err := p.engineLocked(protocol, url, model)
	if err != nil {
		return nil, err
	}
	return e.client, nil
}

// engineLocked returns the engine's entry, made on first use with Limit;
// p.mu is held.
func (p *Pool) engineLocked(protocol, url, model string) (*pooled, error) {
	key := protocol + " " + url + " " + model
	e := p.engines[key]
	if e == nil {
		c, err := NewClient(protocol, url, Options{Model: model, HTTP: p.HTTP, Backoff: p.Backoff})
		if err != nil {
			return nil, err
		}
		e = &pooled{client: c, slots: &slots{limit: p.Limit}, tokens: newTokenCache(tokenCacheSize), versions: &versionProbe{client: c}}
		p.engines[key] = e
	}
	return e, nil
}

// replicas is how many live replicas share each stated capacity now.
func (p *Pool) replicas() int {
	if p.Replicas == nil {
		return 1
	}
	return max(p.Replicas(), 1)
}

// share is this pool's limit on an engine of the capacity when n replicas
// share it.
func (p *Pool) share(capacity, n int) int {
	if capacity <= 0 {
		return p.Limit
	}
	return max(capacity/n, 1)
}

// Rebalance sets every engine's limit from its capacity and the live
// replicas now: a limit that shrinks starts no generation until the
// engine's are under it; one that grows starts those waiting at once.
func (p *Pool) Rebalance() {
	p.init()
	p.rebalancing.Lock()
	defer p.rebalancing.Unlock()
	n := p.replicas()
	p.mu.Lock()
	total := 0
	for _, e := range p.engines {
		limit := p.share(e.capacity, n)
		e.slots.setLimit(limit)
		total += limit
	}
	onLimits := p.OnLimits
	p.mu.Unlock()
	if onLimits != nil {
		onLimits(total)
	}
}

// EngineLimit is how many generations this pool keeps in flight on the engine
// now (its share of the engine's capacity, or Limit).
func (p *Pool) EngineLimit(protocol, url, model string) int {
	p.init()
	p.mu.Lock()
	e := p.engines[protocol+" "+url+" "+model]
	p.mu.Unlock()
	if e == nil {
		return p.Limit
	}
	e.slots.mu.Lock()
	defer e.slots.mu.Unlock()
	return e.slots.limit
}

func (p *Pool) init() {
	p.once.Do(func() {
		if p.Limit <= 0 {
			p.Limit = 64
		}
		if p.HTTP == nil {
			p.HTTP = &http.Client{Transport: &http.Transport{
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				MaxIdleConnsPerHost: p.Limit,
				IdleConnTimeout:     90 * time.Second,
			}}
		}
		p.engines = map[string]*pooled{}
	})
}

// InFlight is the number of generations running on the engine at url.
func (p *Pool) InFlight(protocol, url, model string) int {
	used, _ := p.counts(protocol, url, model)
	return used
}

// Waiting is the number of callers waiting for a slot on the engine at url.
func (p *Pool) Waiting(protocol, url, model string) int {
	_, waiting := p.counts(protocol, url, model)
	return waiting
}

func (p *Pool) counts(protocol, url, model string) (used, waiting int) {
	p.init()
	p.mu.Lock()
	e := p.engines[protocol+" "+url+" "+model]
	p.mu.Unlock()
	if e == nil {
		return 0, 0
	}
	e.slots.mu.Lock()
	defer e.slots.mu.Unlock()
	return e.slots.used, e.slots.waiters.Len()
}

// slots is a counting semaphore whose waiters are served in the order they
// came. A freed slot goes straight to the first waiter, so a newcomer never
// overtakes the queue.
type slots struct {
	mu      sync.Mutex
	limit   int
	used    int
	waiters list.List // of chan struct{}, closed when the slot is granted
}

func (s *slots) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.used < s.limit && s.waiters.Len() == 0 {
		s.used++
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return err
	}
	granted := make(chan struct{})
	elem := s.waiters.PushBack(granted)
	s.mu.Unlock()
	select {
	case <-granted:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-granted:
			// Granted as the context ended: pass the slot on.
			s.used--
			s.grant()
		default:
			s.waiters.Remove(elem)
		}
		s.mu.Unlock()
		return ctx.Err()
	}
}

func (s *slots) setLimit(n int) {
	s.mu.Lock()
	s.limit = n
	s.grant()
	s.mu.Unlock()
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	s.grant()
	s.mu.Unlock()
}

// grant hands free slots to the first waiters; s.mu is held.
func (s *slots) grant() {
	for s.used < s.limit {
		front := s.waiters.Front()
		if front == nil {
			return
		}
		s.used++
		close(s.waiters.Remove(front).(chan struct{}))
	}
}

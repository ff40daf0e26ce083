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
// An engine is named as its client reaches it (the default protocol named,
// the base URL as requests are built on it, the model where requests carry
// it), and one that nobody has used for Idle is forgotten.
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
	// Idle is how long an engine stays known with no lease held or waited
	// for and no acquire: then it is forgotten (its limit leaves OnLimits'
	// total; its client and caches are dropped), and one acquired again
	// starts anew, with the capacity stated then. 0 means DefaultIdle.
	Idle time.Duration

	now         func() time.Time // the clock; nil: time.Now (a test's own)
	once        sync.Once
	rebalancing sync.Mutex // one Rebalance at a time, so OnLimits hears the last total last
	mu          sync.Mutex
	engines     map[string]*pooled
}

// DefaultIdle is how long Pool keeps an engine nobody uses. Longer than an
// engine in use by a running rollout goes without a generation (a planner
// turn waits for its acts: with the default act_timeout_s and act_retries,
// up to about 4 minutes), so that its shares and caches are not dropped
// between turns; short enough that a replica whose rollouts moved on to
// other engines (a checkpoint or LoRA name per rollout) stops pulling
// work for the old ones within minutes.
const DefaultIdle = 10 * time.Minute

type pooled struct {
	capacity int  // the engine's stated capacity, shared with the other replicas; 0: Limit
	balanced bool // its limit was set from capacity (a new engine's is Limit until then)
	// acquiring counts the callers between finding the engine and holding
	// or queueing for its slot (p.mu): the engine is not forgotten then.
	acquiring int
	client    Client
	slots     *slots
	tokens    *tokenCache
	chats     *tokenCache // a chat engine's renderings of one-message conversations
	versions  *versionProbe
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
	forgot := p.forgetIdleLocked()
	e, err := p.engineLocked(protocol, url, model)
	if err != nil {
		p.mu.Unlock()
		if forgot {
			p.Rebalance()
		}
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
	e.acquiring++
	p.mu.Unlock()
	if changed || forgot {
		p.Rebalance() // OnLimits hears the new total
	}
	err = e.slots.acquire(ctx)
	p.mu.Lock()
	e.acquiring--
	p.mu.Unlock()
	if err != nil {
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

// engineLocked returns the engine's entry, made on first use with Limit,
// and marks it used now; p.mu is held.
func (p *Pool) engineLocked(protocol, url, model string) (*pooled, error) {
	key := engineKey(protocol, url, model)
	e := p.engines[key]
	if e == nil {
		c, err := NewClient(protocol, url, Options{Model: model, HTTP: p.HTTP, Backoff: p.Backoff})
		if err != nil {
			return nil, err
		}
		e = &pooled{client: c, slots: &slots{limit: p.Limit, now: p.now}, tokens: newTokenCache(tokenCacheSize), chats: newTokenCache(tokenCacheSize), versions: &versionProbe{client: c}}
		p.engines[key] = e
	}
	e.slots.touch()
	return e, nil
}

// engineKey names the engine a client reaches: the same server, however
// its url is spelt (a trailing slash, an OpenAI server's /v1) or its
// protocol left to the default, is one engine with one share of its
// capacity. The model is part of it only where requests carry it.
func engineKey(protocol, url, model string) string {
	protocol, base := endpoint(protocol, url)
	if protocol == ProtocolSGLang {
		model = "" // SGLang's /generate names no model
	}
	return protocol + " " + base + " " + model
}

// forgetIdleLocked drops the engines that nobody has used for Idle: no
// lease held or waited for, none being acquired, no acquire since. It
// reports whether it dropped any (OnLimits' total changed); p.mu is held.
func (p *Pool) forgetIdleLocked() bool {
	now := p.clock()
	forgot := false
	for key, e := range p.engines {
		if e.acquiring == 0 && e.slots.idleSince(now) >= p.Idle {
			delete(p.engines, key)
			forgot = true
		}
	}
	return forgot
}

func (p *Pool) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
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
	p.forgetIdleLocked()
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
	e := p.engines[engineKey(protocol, url, model)]
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
		if p.Idle <= 0 {
			p.Idle = DefaultIdle
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
	e := p.engines[engineKey(protocol, url, model)]
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
	waiters list.List        // of chan struct{}, closed when the slot is granted
	now     func() time.Time // the pool's clock; nil: time.Now
	last    time.Time        // the last acquire or release
}

// touch marks the slots used now.
func (s *slots) touch() {
	s.mu.Lock()
	s.last = s.clock()
	s.mu.Unlock()
}

// idleSince is how long no slot has been held or waited for, as of now;
// 0 while one is.
func (s *slots) idleSince(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used > 0 || s.waiters.Len() > 0 {
		return 0
	}
	return now.Sub(s.last)
}

func (s *slots) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
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
	s.last = s.clock()
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

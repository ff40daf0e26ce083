package engine

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// Pool shares one client per engine and bounds the generations in flight
// on each engine, so that a burst of acts queues here instead of
// overloading a server.
type Pool struct {
	// Limit is the maximum concurrent generations per engine; 0 means 64.
	Limit int
	// HTTP is shared by every client; nil means a pooled transport sized for Limit.
	HTTP *http.Client

	once    sync.Once
	mu      sync.Mutex
	engines map[string]*pooled
}

type pooled struct {
	client Client
	slots  chan struct{}
}

// Lease is a client with one of its engine's slots held; Release it.
type Lease struct {
	Client
	p *pooled
}

// Release gives the slot back.
func (l *Lease) Release() { <-l.p.slots }

// Acquire waits for a free slot on the engine and returns its client.
func (p *Pool) Acquire(ctx context.Context, protocol, url, model string) (*Lease, error) {
	p.init()
	key := protocol + " " + url + " " + model
	p.mu.Lock()
	e := p.engines[key]
	if e == nil {
		c, err := New(protocol, url, model, p.HTTP)
		if err != nil {
			p.mu.Unlock()
			return nil, err
		}
		e = &pooled{client: c, slots: make(chan struct{}, p.Limit)}
		p.engines[key] = e
	}
	p.mu.Unlock()
	select {
	case e.slots <- struct{}{}:
		return &Lease{Client: e.client, p: e}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
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
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.engines[protocol+" "+url+" "+model]; e != nil {
		return len(e.slots)
	}
	return 0
}

package engine

import (
	"context"
	"sync"
	"time"
)

// versionProbe asks an engine which weights it serves (WeightVersion), for
// the callers that must know right before they generate. A caller is
// answered only by a request sent after it asked, never by an older one,
// so what it learns is no older than its question; callers that ask while
// a request is out share the next one. An engine is thus asked at most
// once at a time, and each caller waits at most two of its answers,
// however many generations are about to start.
type versionProbe struct {
	client Client

	mu      sync.Mutex
	sending bool         // a request is out, or about to be
	next    *versionCall // the callers waiting for the request after it
}

type versionCall struct {
	done    chan struct{} // closed once version and err are set
	waiters int           // callers sharing it (p.mu)
	version string
	err     error
}

// versionTimeout bounds one request for the version: callers wait on
// their own contexts, the request on this.
const versionTimeout = 10 * time.Second

// ask returns what the engine answers to a request sent after ask was called.
func (p *versionProbe) ask(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p.mu.Lock()
	if p.next == nil {
		p.next = &versionCall{done: make(chan struct{})}
	}
	call := p.next
	call.waiters++
	if !p.sending {
		p.sending = true
		go p.send()
	}
	p.mu.Unlock()
	select {
	case <-call.done:
		return call.version, call.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// send sends one request per batch of callers until none waits.
func (p *versionProbe) send() {
	for {
		p.mu.Lock()
		call := p.next
		if call == nil {
			p.sending = false
			p.mu.Unlock()
			return
		}
		p.next = nil // who asks from now on waits for the request after this one
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
		call.version, call.err = p.client.WeightVersion(ctx)
		cancel()
		close(call.done)
	}
}

// WeightVersion is the version of the weights the engine serves, asked of
// the engine after this call began (never an answer it gave before):
// what a generation about to start may be checked against. Concurrent
// callers share requests, one at a time per engine.
func (l *Lease) WeightVersion(ctx context.Context) (string, error) {
	return l.p.versions.ask(ctx)
}

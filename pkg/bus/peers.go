package bus

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// HdrPeer names, on a $SRV.PING.<service> a replica sends to find the
// others, the instance that asks: every replica that hears it counts the
// asker at once, before it answers.
const HdrPeer = "Planact-Peer"

// PeerEvery is how often Peers asks which replicas of its service live.
const PeerEvery = time.Second

// peerWindow is how long a round waits for the answers to its ping.
const peerWindow = 200 * time.Millisecond

// peerLease is how many rounds a replica that stopped answering still
// counts: then what it held (its share of an engine) goes to the others.
const peerLease = 3

// Peers follows the live replicas of this process's service (those that
// answer $SRV.PING.<service>, this one included), so that what they share,
// an engine's capacity, is divided among those alive. A replica that
// appears is counted at once (the others shrink their shares first); one
// that stops answering is counted for peerLease rounds more, then its share
// goes to the others: nothing waits for a replica that died.
type Peers struct {
	b    *Bus
	name string
	id   string

	mu      sync.Mutex
	seen    map[string]time.Time // other replicas: when each last answered or asked
	n       int
	changed []func(n int)
	calling sync.Mutex // the OnChange calls, one at a time, each with the number then
}

// Peers starts following the replicas of the service this bus answers for
// until ctx ends; its first round is over when it returns. Without a
// service (a bare bus in a test), the process is alone: N is 1.
func (b *Bus) Peers(ctx context.Context) *Peers {
	p := &Peers{b: b, seen: map[string]time.Time{}, n: 1}
	s := b.Service()
	if s == nil {
		return p
	}
	p.name, p.id = s.identity.Name, s.identity.ID
	s.onPing(p.note)
	p.round(ctx)
	go func() {
		t := time.NewTicker(PeerEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.round(ctx)
			}
		}
	}()
	return p
}

// N is the number of live replicas, this one included (at least 1).
func (p *Peers) N() int {
	if p == nil {
		return 1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// OnChange calls f with the new number of replicas whenever it changes.
func (p *Peers) OnChange(f func(n int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.changed = append(p.changed, f)
}

// note counts the replica id as alive now.
func (p *Peers) note(id string) {
	if id == "" || id == p.id {
		return
	}
	p.mu.Lock()
	p.seen[id] = time.Now()
	p.mu.Unlock()
	p.recount()
}

// round asks every replica of the service, counts those that answer and
// forgets those whose lease ran out. The answers come over the bus's reply
// inbox, each counted as it comes; the round ends peerWindow after the ask,
// or when ctx does (the answers heard by then are counted).
func (p *Peers) round(ctx context.Context) {
	inbox, end, err := p.b.replies.Open(p.b.NC, func(m *nats.Msg) {
		var a micro.Ping
		if json.Unmarshal(m.Data, &a) == nil && a.Name == p.name {
			p.note(a.ID)
		}
	})
	if err != nil {
		return
	}
	ping := nats.NewMsg("$SRV.PING." + p.name)
	ping.Reply = inbox
	ping.Header.Set(HdrPeer, p.id)
	if err := p.b.NC.PublishMsg(ping); err != nil {
		end()
		return
	}
	window := time.NewTimer(peerWindow)
	select {
	case <-window.C:
	case <-ctx.Done():
		window.Stop()
	}
	end()
	p.mu.Lock()
	for id, at := range p.seen {
		if time.Since(at) > peerLease*PeerEvery+peerWindow {
			delete(p.seen, id)
		}
	}
	p.mu.Unlock()
	p.recount()
}

func (p *Peers) recount() {
	p.calling.Lock()
	defer p.calling.Unlock()
	p.mu.Lock()
	n := len(p.seen) + 1
	if n == p.n {
		p.mu.Unlock()
		return
	}
	p.n = n
	fs := append([]func(int){}, p.changed...)
	p.mu.Unlock()
	for _, f := range fs {
		f(n)
	}
}

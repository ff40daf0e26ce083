package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Slots bounds the messages a consumer holds at once: those its handlers
// run and those it has asked JetStream for. The limit may change while the
// consumer runs (an engine's capacity, learned): messages already held are
// finished, and no more are asked for until the consumer is under the new
// limit.
type Slots struct {
	mu      sync.Mutex
	limit   int
	changed chan struct{} // closed and replaced at every change
}

// NewSlots returns slots with the given limit (at least 1).
func NewSlots(limit int) *Slots { return &Slots{limit: max(limit, 1), changed: make(chan struct{})} }

// SetLimit changes the limit (at least 1).
func (s *Slots) SetLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n = max(n, 1); n != s.limit {
		s.limit = n
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// Limit is the limit now.
func (s *Slots) Limit() int {
	l, _ := s.get()
	return l
}

func (s *Slots) get() (int, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit, s.changed
}

// puller asks a durable pull consumer for exactly as many messages as there
// are free slots, so that every message it receives starts its handler at
// once (and its in-progress signals with it): none waits in a buffer
// unseen, to be handed out a second time when its ack wait runs out. (The
// client library's Consume pulls a fixed batch ahead of the handlers.)
//
// Requests expire after at most the ack wait: a replica that is frozen
// (SIGSTOP, a long pause) keeps no request open that could take a message
// it will not handle beyond that, and a message it took is never given to
// it a second time. Each request has its own reply subject under one
// subscription, so that its end (the 408 at expiry, which says how many of
// its messages did not come) is counted against the right request.
//
// When the count of what open requests still owe is lost (a reconnect, a
// request ended without saying), the requests are ended for good with
// it: the subscription moves to a new inbox, and JetStream drops a request
// whose reply subject nobody listens on before it delivers to it. Asking
// again for every free slot while old requests might still deliver would
// hold more messages than slots.
type puller struct {
	b       *Bus
	c       Consumer
	slots   *Slots
	subject string // $JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>
	expires time.Duration
	log     zerolog.Logger
	handle  func(m *nats.Msg) // runs the handler of a message we hold a slot for; returns when it is done

	mu       sync.Mutex
	inbox    string               // the requests' reply subjects are under it
	sub      *nats.Subscription   // on inbox.*; replaced when the requests are forgotten
	running  int                  // handlers running
	asked    int                  // messages asked for and not yet come, in all open requests
	reqs     map[string]time.Time // open requests: when each is over for sure
	seq      uint64
	retryAt  time.Time // after a refused request: not before then
	failures int
	wake     chan struct{}
	wg       sync.WaitGroup
	stopping bool
}

// pullGrace is how long after its expiry a request is over for sure: its
// messages came, or its end (a 408 that says how many did not), or it was
// lost with a connection.
const pullGrace = time.Second

func newPuller(b *Bus, c Consumer, handle func(*nats.Msg)) *puller {
	slots := c.Slots
	if slots == nil {
		slots = NewSlots(c.Concurrency)
	}
	return &puller{
		b: b, c: c, slots: slots, handle: handle,
		subject: fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", c.Stream, c.Durable),
		// Within the ack wait, with a margin for the clocks of the two ends.
		expires: min(c.AckWait*9/10, 30*time.Second),
		log:     b.Log.With().Str("consumer", c.Durable).Logger(),
		reqs:    map[string]time.Time{},
		wake:    make(chan struct{}, 1),
	}
}

func (p *puller) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run pulls until ctx ends, then stops asking, hands back what still
// arrives and waits for the handlers.
func (p *puller) run(ctx context.Context) error {
	p.mu.Lock()
	err := p.listen()
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("consume %s: %w", p.c.Durable, err)
	}
	status := p.b.NC.StatusChanged(nats.CONNECTED)
	defer p.b.NC.RemoveStatusListener(status)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		limit, changed := p.slots.get()
		wait := p.ask(limit)
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.stopping = true
			sub := p.sub
			p.mu.Unlock()
			_ = sub.Drain() // what is on its way is handed back (nak) by receive
			p.wg.Wait()
			return nil
		case <-p.wake:
		case <-changed:
		case <-timer.C:
		case <-status:
			// Reconnected: the requests sent before may be gone with the
			// old connection.
			p.mu.Lock()
			p.log.Debug().Int("requests", len(p.reqs)).Int("asked", p.asked).Int("running", p.running).Msg("reconnected: open pull requests taken for lost")
			p.forget()
			p.mu.Unlock()
		}
	}
}

// forget ends every open request: none is counted any more, and none can
// deliver, its reply subject being gone (a message already on its way is
// handled if a slot is free, else handed back). p.mu is held.
func (p *puller) forget() {
	clear(p.reqs)
	p.asked = 0
	if err := p.listen(); err != nil {
		// The old subscription stays: its requests expire within the ack
		// wait, and until then a message beyond the slots is handed back
		// with a delay (receive).
		p.log.Warn().Err(err).Msg("pull requests forgotten on the same inbox")
	}
}

// listen subscribes a new inbox for the requests, and ends the old one's.
// The old subscription is drained, not dropped: a message JetStream sent
// it before the server took its end is still received (receive handles or
// hands it back), not discarded by the client to wait out its ack wait
// and count a delivery. p.mu is held.
func (p *puller) listen() error {
	inbox := p.b.NC.NewInbox()
	sub, err := p.b.NC.Subscribe(inbox+".*", p.receive)
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, -1) // every message here was asked for
	if p.sub != nil {
		_ = p.sub.Drain()
	}
	p.inbox, p.sub = inbox, sub
	return nil
}

// ask sends a pull request for the free slots when it should, and says
// how long until something must be looked at again.
func (p *puller) ask(limit int) time.Duration {
	p.mu.Lock()
	now := time.Now()
	next := time.Hour
	for id, over := range p.reqs {
		if now.After(over) {
			// Messages do not say which request they came for: one that
			// came for all it asked leaves no trace; it is over now.
			delete(p.reqs, id)
			continue
		}
		next = min(next, over.Sub(now))
	}
	if len(p.reqs) == 0 {
		p.asked = 0 // no request is open: none owes a message
	}
	free := limit - p.running - p.asked
	// One request for all that is free; while requests are open (no
	// message is waiting, or they would have filled), only when half the
	// slots are free: a busy consumer does not send a request per message.
	if free <= 0 || (len(p.reqs) > 0 && free < (limit+1)/2) {
		p.mu.Unlock()
		return next
	}
	if now.Before(p.retryAt) {
		p.mu.Unlock()
		return min(next, p.retryAt.Sub(now))
	}
	if !p.b.NC.IsConnected() {
		// Sent now, it would wait in the client's buffer and reach the
		// server after the reconnect, when its count is forgotten.
		p.mu.Unlock()
		return min(next, maxPullRetry)
	}
	p.seq++
	id := strconv.FormatUint(p.seq, 10)
	p.reqs[id] = now.Add(p.expires + pullGrace)
	p.asked += free
	inbox := p.inbox
	p.mu.Unlock()
	body, _ := json.Marshal(struct {
		Batch   int           `json:"batch"`
		Expires time.Duration `json:"expires"`
	}{free, p.expires})
	if err := p.b.NC.PublishRequest(p.subject, inbox+"."+id, body); err != nil {
		p.log.Debug().Err(err).Msg("pull request not sent")
		p.mu.Lock()
		delete(p.reqs, id)
		p.asked = max(p.asked-free, 0)
		p.refused()
		p.mu.Unlock()
	}
	return 0
}

// refused makes the next request wait a little, longer each time up to
// maxPullRetry. p.mu is held.
func (p *puller) refused() {
	p.failures++
	p.retryAt = time.Now().Add(pullRetry(p.failures))
}

// maxPullRetry bounds the wait after refused requests. While a consumer
// has no leader (JetStream elects one 4–9 s after its node's crash) every
// request is refused (no responders); the first request after the
// election must follow it closely, not a back-off of seconds later.
const maxPullRetry = 500 * time.Millisecond

// pullRetry is the wait after the failures-th refused request in a row.
func pullRetry(failures int) time.Duration {
	return min(100*time.Millisecond<<min(max(failures-1, 0), 6), maxPullRetry)
}

// end closes request id, which JetStream ended with status code; the
// messages it did not bring are asked for again.
func (p *puller) end(sub *nats.Subscription, id string, code string, h nats.Header) {
	p.mu.Lock()
	defer p.poke()
	defer p.mu.Unlock()
	if _, open := p.reqs[id]; !open || sub != p.sub {
		return
	}
	delete(p.reqs, id)
	if code != "404" && code != "408" {
		// 409: the consumer's leader moved, too many requests wait, the
		// consumer was deleted…: the next request waits a little.
		p.log.Debug().Str("status", code).Str("description", h.Get("Description")).Msg("pull request ended")
		p.refused()
	}
	pending, err := strconv.Atoi(h.Get("Nats-Pending-Messages"))
	if err != nil {
		// How many it did not bring is not said: every request is taken
		// for lost, and asked for again.
		p.forget()
		return
	}
	p.asked = max(p.asked-pending, 0)
}

// receive takes what JetStream sends to the requests: a message, or the
// end of a request. (A message comes on its own subject, with a reply
// subject to ack it on; an end on the request's reply subject, with none.
// A message's headers are its writer's: a Status among them with no body
// does not make it an end.)
func (p *puller) receive(m *nats.Msg) {
	if code := m.Header.Get("Status"); code != "" && len(m.Data) == 0 && m.Reply == "" {
		if code != "100" { // a heartbeat; none is asked for
			p.end(m.Sub, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], code, m.Header)
		}
		return
	}
	p.mu.Lock()
	ours, stopping := false, p.stopping
	switch {
	case stopping:
	case p.asked > 0 && m.Sub == p.sub:
		p.asked--
		if p.asked == 0 {
			clear(p.reqs) // every request came for all it asked
		}
		ours = true
	default:
		// A request forgotten (at a reconnect) delivered on its way out:
		// handled only if a slot is free, one the open requests may not
		// fill.
		limit, _ := p.slots.get()
		ours = limit-p.running-p.asked > 0
	}
	if ours {
		p.running++
		p.failures = 0
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if !ours {
		if stopping {
			// Handed back at once, for a replica with a free slot.
			_ = ack(p.b.NC, m, ackNak)
		} else {
			// Not at once: a request of this consumer that is still open
			// would take it straight back, each time a delivery more.
			_ = nakWithDelay(p.b.NC, m, pullGrace)
		}
		return
	}
	go func() {
		defer func() {
			p.mu.Lock()
			p.running--
			p.mu.Unlock()
			p.poke()
			p.wg.Done()
		}()
		p.handle(m)
	}()
}

// What a handler's outcome tells JetStream, on the message's reply subject.
var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
)

func ack(nc *nats.Conn, m *nats.Msg, body []byte) error {
	if m.Reply == "" {
		return nil
	}
	return nc.Publish(m.Reply, body)
}

// nakWithDelay hands m back, to be delivered again after d.
func nakWithDelay(nc *nats.Conn, m *nats.Msg, d time.Duration) error {
	return ack(nc, m, fmt.Appendf(nil, `-NAK {"delay": %d}`, d.Nanoseconds()))
}

// term tells JetStream never to deliver m again, and why.
func term(nc *nats.Conn, m *nats.Msg, reason string) error {
	return ack(nc, m, []byte("+TERM "+reason))
}

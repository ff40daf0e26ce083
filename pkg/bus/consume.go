package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// Msg is a message handed to a Handler.
type Msg struct {
	Subject   string
	Header    nats.Header
	Data      []byte
	Delivered uint64    // 1 on first delivery; for logs and back-off, never to decide what happened
	Seq       uint64    // the message's stream sequence
	Time      time.Time // when the stream stored it (its clock)
	raw       *nats.Msg
	nc        *nats.Conn
}

// ID names the message as its publisher did (its Nats-Msg-Id), or by its
// stream sequence ("seq:<n>") when it has none.
func (m Msg) ID() string {
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	return fmt.Sprintf("seq:%d", m.Seq)
}

// Decode decodes the body into v, checking its schema version.
func (m Msg) Decode(v schema.Message) error {
	if err := schema.Unmarshal(m.Data, v); err != nil {
		return fmt.Errorf("%s: %w", m.Subject, err)
	}
	return nil
}

// InProgress tells JetStream the handler is still working on m, so that it
// is not redelivered to another worker. The consume loop already does this
// periodically; call it after steps that may take longer than AckWait/3.
func (m Msg) InProgress() error {
	if m.raw == nil {
		return nil
	}
	return ack(m.nc, m.raw, ackProgress)
}

// Handler handles one message. It never acks: the returned error decides.
// nil acks; a fail.Permanent or fail.Invalid error terminates the message
// (no redelivery); anything else naks it with a delay.
type Handler func(ctx context.Context, m Msg) error

// Consumer describes a durable consumer shared by every replica of a service.
type Consumer struct {
	Stream      string
	Durable     string
	Filters     []string
	Concurrency int // handlers running at once in this process; default 16
	// Slots, when set, bound the handlers instead of Concurrency, with a
	// limit that may change while the consumer runs.
	Slots *Slots
	// AckWait is how long a message may go without a sign of life before
	// JetStream hands it to another replica; the consume loop sends one
	// every AckWait/3 while a handler works, so only the work of a process
	// that died (or stopped) moves. Default DefaultAckWait.
	AckWait    time.Duration
	MaxDeliver int // deliveries before a message is given up; default 10
	// MaxAckPending bounds the messages handed out and not yet acked, by
	// every replica together; default max(4×Concurrency, 64). A consumer
	// whose width follows Slots states the most its replicas may hold.
	MaxAckPending int
	Backoff       func(delivered uint64) time.Duration
}

func (c Consumer) withDefaults() Consumer {
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.AckWait <= 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxDeliver <= 0 {
		c.MaxDeliver = 10
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	return c
}

// DefaultAckWait bounds how long the work of a replica that died waits
// before another replica takes it.
const DefaultAckWait = 5 * time.Second

// DefaultBackoff naks with 100ms, 200ms, 400ms … up to 10s.
func DefaultBackoff(delivered uint64) time.Duration {
	d := 100 * time.Millisecond
	for i := uint64(1); i < delivered && d < 10*time.Second; i++ {
		d *= 2
	}
	return min(d, 10*time.Second)
}

// Config is the durable consumer JetStream holds for c.
func (c Consumer) Config() jetstream.ConsumerConfig {
	c = c.withDefaults()
	return jetstream.ConsumerConfig{
		Durable:        c.Durable,
		FilterSubjects: c.Filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     c.MaxDeliver + 1, // the adapter terms at MaxDeliver and logs why
		MaxAckPending:  cmp.Or(c.MaxAckPending, max(c.Concurrency*4, 64)),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
}

// EnsureConsumer creates c's durable consumer, or updates it to c: the
// provisioning of a service's consumers (`planact provision`), so that the
// services need no right to create or change one. A user that may create a
// consumer may make it push every message of its stream to any subject:
// NATS checks no right of its creator on the deliver subject.
func (b *Bus) EnsureConsumer(ctx context.Context, c Consumer) error {
	want := c.Config()
	if cons, err := b.JS.Consumer(ctx, c.Stream, c.Durable); err == nil && sameConsumer(cons.CachedInfo().Config, want) {
		return nil
	}
	if _, err := b.JS.CreateOrUpdateConsumer(ctx, c.Stream, want); err != nil {
		return fmt.Errorf("consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	return nil
}

// ObsoleteConsumers are durable consumers older planacts made that none
// uses now, by stream: provisioning removes them.
var ObsoleteConsumers = map[string][]string{StreamControl: {"session-store-control"}}

// RemoveObsolete removes the ObsoleteConsumers that exist.
func (b *Bus) RemoveObsolete(ctx context.Context) error {
	for stream, names := range ObsoleteConsumers {
		for _, name := range names {
			err := b.JS.DeleteConsumer(ctx, stream, name)
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("remove obsolete consumer %s on %s: %w", name, stream, err)
			}
		}
	}
	return nil
}

// sameConsumer reports whether have holds every field c.Config sets.
func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	return slices.Equal(have.FilterSubjects, want.FilterSubjects) && have.AckPolicy == want.AckPolicy && have.AckWait == want.AckWait &&
		have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending && have.DeliverPolicy == want.DeliverPolicy &&
		have.DeliverSubject == "" && have.FilterSubject == ""
}

// consumer opens c's durable consumer. One that is missing is created where
// this user may (in process, as `planact up` runs); else the error says to
// run `planact provision`. One that differs from c is used as it is, with a
// warning: provisioning decides what the services' consumers are.
func (b *Bus) consumer(ctx context.Context, c Consumer) (jetstream.Consumer, error) {
	want := c.Config()
	cons, err := b.JS.Consumer(ctx, c.Stream, c.Durable)
	if err == nil {
		if have := cons.CachedInfo().Config; !sameConsumer(have, want) {
			b.Log.Warn().Str("consumer", c.Durable).Str("stream", c.Stream).Strs("filters", have.FilterSubjects).Dur("ack_wait", have.AckWait).
				Int("max_ack_pending", have.MaxAckPending).Msg("the consumer differs from what this service asks for; using it as planact provision made it")
		}
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	cons, cerr := b.JS.CreateOrUpdateConsumer(ctx, c.Stream, want)
	if cerr != nil {
		return nil, fail.Permanentf("consumer %s on %s does not exist (%w) and could not be made (%v): run planact provision first, as a user that may create consumers (compose's admin)",
			c.Durable, c.Stream, ErrNotProvisioned, cerr)
	}
	return cons, nil
}

// Consume runs h on every message of the durable consumer c until ctx ends,
// then waits for the handlers in flight.
func (b *Bus) Consume(ctx context.Context, c Consumer, h Handler) error {
	c, err := b.openConsumer(ctx, c)
	if err != nil {
		return err
	}
	// `nats micro stats` shows the consumer's real work: messages handled,
	// errors, time in the handler.
	ep := b.service.Endpoint(c.Durable, strings.Join(c.Filters, " "), "jetstream "+c.Stream,
		map[string]string{"stream": c.Stream, "consumer": c.Durable})
	// Every message pulled has a slot: its handler starts at once, and with
	// it the in-progress signals that keep it ours (see puller).
	p := newPuller(b, c, func(raw *nats.Msg) {
		stop := keepInProgress(b.NC, raw, c.AckWait/3)
		defer stop()
		b.handle(ctx, c, h, raw, ep)
	})
	return p.run(ctx)
}

// openConsumer opens c's durable consumer and returns c as the consume
// loop runs it. A service may start, or reach this point, while NATS
// restarts or a leader is elected, or while JetStream is away for longer:
// the consumer is asked for again, with a back-off up to 5 s and a warning
// each time, until NATS answers or ctx ends, so that a service does not
// stop for an outage it would outlive (a missing one that this user may
// not create is an error at once). A consumer used as provisioning made
// it, with a shorter ack wait than c asks for, sets the pace of the signs
// of life and the pull requests' expiry: paced by c's, a handler at work
// would lose its message to another replica. Fewer deliveries than c asks
// for bound the handler's tries likewise.
func (b *Bus) openConsumer(ctx context.Context, c Consumer) (Consumer, error) {
	c = c.withDefaults()
	var cons jetstream.Consumer
	if err := b.retryFor(ctx, "opening consumer "+c.Durable, 0, func() error {
		var err error
		cons, err = b.consumer(ctx, c)
		return err
	}); err != nil {
		return c, err
	}
	have := cons.CachedInfo().Config
	if have.AckWait > 0 && have.AckWait < c.AckWait {
		c.AckWait = have.AckWait
	}
	// Likewise a message is given up aloud (term) before JetStream drops
	// it in silence at the consumer's own most deliveries.
	if have.MaxDeliver > 0 && have.MaxDeliver-1 < c.MaxDeliver {
		c.MaxDeliver = max(have.MaxDeliver-1, 1)
	}
	return c, nil
}

func (b *Bus) handle(ctx context.Context, c Consumer, h Handler, raw *nats.Msg, ep *Endpoint) {
	m := Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data, raw: raw, nc: b.NC, Delivered: 1}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	if md, err := raw.Metadata(); err == nil {
		m.Delivered, m.Seq, m.Time = md.NumDelivered, md.Sequence.Stream, md.Timestamp
	}
	log := b.Log.With().Str("consumer", c.Durable).Str("subject", m.Subject).Uint64("delivered", m.Delivered).Logger()
	log = withHeaderFields(log, m.Header)
	hctx := log.WithContext(ctx)
	if tid := TraceIDOf(m.Header.Get(schema.HdrTraceparent)); tid != "" {
		hctx = WithTrace(hctx, tid)
	}
	hctx = ExtractSpan(hctx, m.Header) // the handler's spans hang under the message's place in the rollout

	began := time.Now()
	err := safeCall(hctx, h, m)
	took := time.Since(began)
	telemetry.HandlerSeconds.WithLabelValues(c.Durable).Observe(took.Seconds())
	if isLater(err) {
		ep.Record(took, nil) // not yet, not an error
	} else {
		ep.Record(took, err)
	}
	outcome := "nak"
	defer func() {
		telemetry.MessagesHandled.WithLabelValues(c.Durable, outcome).Inc()
		log.Debug().Str("outcome", outcome).Dur("took", took).Msg("handled")
	}()

	switch {
	case err == nil:
		outcome = "ack"
		if aerr := ack(b.NC, raw, ackAck); aerr != nil {
			log.Warn().Err(aerr).Msg("ack")
		}
	case ctx.Err() != nil:
		// Shutting down: let another replica have it right away.
		_ = ack(b.NC, raw, ackNak)
	case !fail.IsRetryable(err):
		outcome = "term"
		log.Error().Err(err).Str("kind", fail.KindOf(err).String()).Msg("message rejected")
		_ = term(b.NC, raw, err.Error())
	case isLater(err) && m.Delivered < uint64(c.MaxDeliver):
		d, _ := fail.RetryAfter(err)
		outcome = "later"
		log.Debug().Err(err).Dur("retry_in", d).Msg("not yet; will retry")
		_ = nakWithDelay(b.NC, raw, d)
	case m.Delivered >= uint64(c.MaxDeliver):
		// "Not yet" counts a delivery too: past the most, JetStream would
		// drop the message in silence; given up here, it says so.
		outcome = "term"
		log.Error().Err(err).Msg("message given up after max deliveries")
		_ = term(b.NC, raw, "max deliveries: "+err.Error())
	default:
		d := c.Backoff(m.Delivered)
		log.Warn().Err(err).Dur("retry_in", d).Msg("handler failed, will retry")
		_ = nakWithDelay(b.NC, raw, d)
	}
}

// keepInProgress tells JetStream every interval that raw is being worked
// on, until stop is called; after stop returns it tells nothing more. It
// is a timer, not a goroutine: most handlers end well within interval, and
// then nothing ran for it but the timer's start and stop.
func keepInProgress(nc *nats.Conn, raw *nats.Msg, interval time.Duration) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	mu.Lock() // t is set before the first tick reads it
	t = time.AfterFunc(interval, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		_ = ack(nc, raw, ackProgress)
		t.Reset(interval)
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

func safeCall(ctx context.Context, h Handler, m Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fail.Permanentf("handler panic: %v\n%s", r, debug.Stack())
		}
	}()
	return h(ctx, m)
}

func withHeaderFields(log zerolog.Logger, h nats.Header) zerolog.Logger {
	lc := log.With()
	if v := h.Get(schema.HdrRollout); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			lc = lc.Int64("rollout", n)
		}
	}
	if v := h.Get(schema.HdrEpisode); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			lc = lc.Int("episode", n)
		}
	}
	if v := h.Get(schema.HdrTurn); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			lc = lc.Int("turn", n)
		}
	}
	if v := h.Get(schema.HdrNode); v != "" {
		lc = lc.Str("node", v)
	}
	if v := h.Get(schema.HdrRole); v != "" {
		lc = lc.Str("role", v)
	}
	return lc.Logger()
}

func isLater(err error) bool {
	_, ok := fail.RetryAfter(err)
	return ok
}

package bus

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

type traceKey struct{}

// WithTrace returns a context that carries a rollout's trace id (32 hex).
func WithTrace(ctx context.Context, traceID string) context.Context {
	return context.WithValue(ctx, traceKey{}, traceID)
}

// TraceFrom returns the trace id carried by ctx, or "".
func TraceFrom(ctx context.Context) string {
	s, _ := ctx.Value(traceKey{}).(string)
	return s
}

// NewTraceID returns a random W3C trace id.
func NewTraceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RolloutTraceID is the trace id both trainers of rollout n derive when
// they bring none, so that the whole rollout, arrivals included, is one
// trace: the first 32 hex digits of sha256("planact-rollout-<n>").
func RolloutTraceID(n int64) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("planact-rollout-%d", n)))
	return hex.EncodeToString(sum[:16])
}

// TraceIDOf extracts the trace id of a traceparent header, or "".
func TraceIDOf(traceparent string) string {
	if len(traceparent) < 55 || traceparent[2] != '-' {
		return ""
	}
	return traceparent[3:35]
}

// NewMsg builds the NATS message for m: msgpack body and every planact header.
func NewMsg(ctx context.Context, m schema.Message) (*nats.Msg, error) {
	var body []byte
	if e, ok := m.(Encoded); ok {
		body, m = e.Body, e.Message
	} else {
		var err error
		if body, err = schema.Marshal(m); err != nil {
			return nil, err
		}
	}
	msg := nats.NewMsg(m.Subject())
	msg.Data = body
	meta := m.Meta()
	h := msg.Header
	h.Set(schema.HdrSchema, m.Kind())
	h.Set(schema.HdrContentType, schema.ContentType)
	if meta.Rollout >= 0 {
		h.Set(schema.HdrRollout, strconv.FormatInt(meta.Rollout, 10))
	}
	if meta.Episode >= 0 {
		h.Set(schema.HdrEpisode, strconv.Itoa(meta.Episode))
	}
	if meta.Turn > 0 {
		h.Set(schema.HdrTurn, strconv.Itoa(meta.Turn))
	}
	if meta.Node != "" {
		h.Set(schema.HdrNode, meta.Node)
	}
	if meta.Role != "" {
		h.Set(schema.HdrRole, meta.Role)
	}
	if id := m.MsgID(); id != "" {
		h.Set(jetstream.MsgIDHeader, id)
	}
	if tid := TraceFrom(ctx); tid != "" {
		// The parent a message names is its place in the rollout (its
		// turn's, episode's or the rollout's span; telemetry.SpanOf), the
		// same however often it is published, so that the spans its
		// handler starts, in any process, hang in the rollout's tree.
		if sc := telemetry.SpanOf(tid, meta.Rollout, meta.Episode, meta.Turn); sc.IsValid() {
			propagator.Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), headerCarrier(h))
		}
	}
	return msg, nil
}

// propagator writes and reads the W3C traceparent header.
var propagator = propagation.TraceContext{}

// headerCarrier lets the propagator use NATS headers with their exact
// (lower-case) names; http.Header's carrier would capitalize them.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c[key] = []string{value} }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// InjectSpan makes the span ctx holds the parent named by h's traceparent:
// a request whose handler works for the caller's span (an act's attempt)
// rather than for a place in the rollout. A ctx without a span leaves h as
// it is.
func InjectSpan(ctx context.Context, h nats.Header) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && !sc.IsRemote() {
		propagator.Inject(ctx, headerCarrier(h))
	}
}

// ExtractSpan returns ctx with the parent span h's traceparent names, for
// the spans its handler starts. With tracing off it returns ctx unchanged.
func ExtractSpan(ctx context.Context, h nats.Header) context.Context {
	if !telemetry.TracingOn() || h == nil {
		return ctx
	}
	return propagator.Extract(ctx, headerCarrier(h))
}

// Encoded is a message with its body: schema.Marshal(Message), which the
// caller has already made (to weigh it, say). Published, it is sent as it
// is rather than encoded again.
type Encoded struct {
	schema.Message
	Body []byte
}

// Publish publishes m to its stream and waits for the stream's ack. A
// message whose Nats-Msg-Id was seen within the duplicate window is
// accepted without being stored twice.
func (b *Bus) Publish(ctx context.Context, m schema.Message, opts ...jetstream.PublishOpt) error {
	msg, err := NewMsg(ctx, m)
	if err != nil {
		return fail.E(fail.Permanent, err)
	}
	return b.publishMsg(ctx, msg, opts...)
}

// PublishAs publishes m under the message id msgID instead of its own:
// work handed out once more, which the duplicate window must not drop.
func (b *Bus) PublishAs(ctx context.Context, m schema.Message, msgID string) error {
	msg, err := NewMsg(ctx, m)
	if err != nil {
		return fail.E(fail.Permanent, err)
	}
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	return b.publishMsg(ctx, msg)
}

// PublishTimeout bounds one attempt to get a stream's ack. An ack can be
// lost (a stream being updated, a leader change); waiting for it forever
// would hang the handler, so the publish is tried again, which the message
// id makes safe.
const PublishTimeout = 5 * time.Second

// publishPatience is how long a publish goes on trying while its stream
// has no leader (a node's crash: JetStream's election takes 4–9 s) or its
// ack is lost. Each attempt waits publishAttempt for the ack, and a stream
// that does not answer at all (no responders, during the election) is
// asked again every leaderPoll: the publish lands within a fraction of a
// second of the new leader, not a whole PublishTimeout after it.
const (
	publishPatience = 3 * PublishTimeout
	publishAttempt  = time.Second
	leaderPoll      = 100 * time.Millisecond
)

// leaderless reports whether err says that a stream had no leader to
// answer (no responders) or that the answer was lost (time-out): both pass
// when a leader is elected, so the request is worth sending again.
func leaderless(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

func (b *Bus) publishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) error {
	_, err := b.publishAck(ctx, msg, opts...)
	return err
}

func (b *Bus) publishAck(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	var err error
	var ack *jetstream.PubAck
	deadline := time.Now().Add(publishPatience)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, min(publishAttempt, time.Until(deadline)))
		ack, err = b.JS.PublishMsg(actx, msg, opts...)
		cancel()
		if err == nil || ctx.Err() != nil || !leaderless(err) || !time.Now().Before(deadline) {
			break
		}
		if attempt == 1 {
			b.Log.Warn().Err(err).Str("subject", msg.Subject).Msg("no ack from the stream (a leader being elected?); publishing again until it answers")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			select {
			case <-ctx.Done():
			case <-time.After(leaderPoll):
			}
		}
	}
	if err != nil {
		if why := refusedForLimits(err); why != "" {
			stream := StreamOf(msg.Subject)
			telemetry.StreamRefusals.WithLabelValues(stream, why).Inc()
			b.Log.Error().Err(err).Str("stream", stream).Str("subject", msg.Subject).
				Msgf("stream %s refused a message of planact's: %s; nothing is dropped to make room: raise planact provision --storage, or shorten --history (docs/security.md, Limits)", stream, why)
			return nil, fail.Transientf("publish %s: stream %s is %s (%w): raise planact provision --storage or shorten --history", msg.Subject, stream, why, err)
		}
		return nil, fail.Transientf("publish %s: %w", msg.Subject, err)
	}
	return ack, nil
}

// refusedForLimits says why a stream refused a publish for its limits
// ("full", "message too large"), or "" when it did not.
func refusedForLimits(err error) string {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return ""
	}
	switch {
	case apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return "message too large"
	case apiErr.ErrorCode == 10077 && strings.Contains(apiErr.Description, "maximum"):
		return "full" // maximum bytes or messages exceeded, with discard new
	}
	return ""
}

// StreamOf names the stream of planact's that holds subject.
func StreamOf(subj string) string {
	switch tok := strings.SplitN(subj, ".", 5); {
	case tok[0] == "plan":
		return StreamPlan
	case tok[0] == "act":
		return StreamAct
	case tok[0] == "$KV" && len(tok) > 1:
		return "KV_" + tok[1]
	case tok[0] == "$O" && len(tok) > 1:
		return "OBJ_" + tok[1]
	case tok[0] == "control" && len(tok) > 2 && (tok[2] == "pause" || tok[2] == "resume"):
		return StreamTrainer(tok[1])
	case tok[0] == "control":
		return StreamControl
	case tok[0] == "presence":
		return StreamPresence
	case tok[0] == "rollout" && len(tok) > 2 && (tok[2] == "schedule" || tok[2] == "timeout"):
		return StreamTimeout
	case tok[0] == "rollout" && len(tok) > 3 && (tok[2] == "arrive" || tok[2] == "cancel"):
		return StreamTrainer(tok[3])
	}
	return StreamRollout
}

// PublishOnce publishes m only if its subject holds no message yet: the
// stream's leader checks it, so of two replicas publishing the outcome of
// the same work only one is stored, however long apart they come. stored
// is false when the subject already held a message (the caller reads it
// with LastMsg and goes on with that one).
func (b *Bus) PublishOnce(ctx context.Context, m schema.Message) (stored bool, err error) {
	msg, err := NewMsg(ctx, m)
	if err != nil {
		return false, fail.E(fail.Permanent, err)
	}
	ack, err := b.publishAck(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !ack.Duplicate, nil
}

// PublishAfter publishes m only if the last message of its stream on
// filter (a subject, or a wildcard over several, m's own among them) is
// the one at seq (0: there is none): a compare-and-set over every subject
// filter matches, checked by the stream's leader, so that two writers of
// filter, each publishing after what it read, never both succeed. stored
// is false when the last message was another (the caller reads it again
// and decides anew); dup, with stored, when the stream held m's id
// already (m was stored by an earlier publish of it). Which check comes
// first differs: a cluster's leader checks the id first (dup), a single
// server the sequence first, so that m sent again after its ack was lost
// (publishAck) is refused there, stored false, the last message m itself
// (its Nats-Msg-Id): a caller that reads it again must know it as its own.
func (b *Bus) PublishAfter(ctx context.Context, m schema.Message, filter string, seq uint64) (stored, dup bool, err error) {
	msg, err := NewMsg(ctx, m)
	if err != nil {
		return false, false, fail.E(fail.Permanent, err)
	}
	ack, err := b.publishAck(ctx, msg, jetstream.WithExpectLastSequenceForSubject(seq, filter))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	return true, ack.Duplicate, nil
}

// PublishAll publishes ms without waiting for each ack before the next
// publish, then waits for every ack: a fan-out costs one round trip per
// publishWindow messages, not one per message. It returns the first error.
func (b *Bus) PublishAll(ctx context.Context, ms ...schema.Message) error {
	if len(ms) == 1 {
		return b.Publish(ctx, ms[0])
	}
	for len(ms) > 0 {
		n := min(len(ms), publishWindow)
		if err := b.publishBatch(ctx, ms[:n]); err != nil {
			return err
		}
		ms = ms[n:]
	}
	return nil
}

// publishWindow bounds the messages PublishAll has encoded and not yet
// seen acknowledged: a rollout of tens of thousands of episodes starts with
// as many plan requests, which must not all sit in memory at once, with
// their headers, until the last ack comes.
const publishWindow = 512

func (b *Bus) publishBatch(ctx context.Context, ms []schema.Message) error {
	msgs := make([]*nats.Msg, len(ms))
	futures := make([]jetstream.PubAckFuture, len(ms))
	for i, m := range ms {
		msg, err := NewMsg(ctx, m)
		if err != nil {
			return fail.E(fail.Permanent, err)
		}
		msgs[i] = msg
		if futures[i], err = b.JS.PublishMsgAsync(msg); err != nil {
			return fail.Transientf("publish %s: %w", m.Subject(), err)
		}
	}
	deadline := time.Now().Add(PublishTimeout)
	for i, f := range futures {
		// Each wait is bounded: after a first lost ack the others still
		// get their own chance, then a synchronous retry.
		t := time.NewTimer(max(time.Until(deadline), 0))
		select {
		case <-f.Ok():
			t.Stop()
			continue
		case <-f.Err():
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fail.Transientf("publish %s: %w", ms[i].Subject(), ctx.Err())
		}
		t.Stop()
		// Failed or no ack in time: publish it again on its own, with
		// retries; its message id keeps it from being stored twice.
		if err := b.publishMsg(ctx, msgs[i]); err != nil {
			return err
		}
	}
	return nil
}

// Package client is the Go trainer SDK: a training job arrives for rollout
// N as its role, waits for its result, and falls back when planact times
// out. Any NATS client in any language can do the same with the wire
// schemas in schemas/.
package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// ErrTimeout is returned (wrapped) when a rollout did not produce a result
// in time, whether planact said so (barrier or rollout time-out) or the
// client stopped waiting. A trainer falls back to its standard rollout.
var ErrTimeout = errors.New("planact: rollout timed out")

// ErrRejected is returned (wrapped) when planact refused the arrival or the
// rollout; the error says why.
var ErrRejected = errors.New("planact: rollout rejected")

// ErrRefused is returned (wrapped) when planact refused a pause or a
// resume (control.<role>.refused), or could not read a cancel; the error
// says why, naming the field. Nothing of the role or rollout changed.
var ErrRefused = errors.New("planact: refused")

// ErrFailed is returned (wrapped) when planact could not produce the
// samples of a rollout (for example, its streams lost the history).
var ErrFailed = errors.New("planact: rollout failed")

// Client talks to planact over an existing NATS connection.
type Client struct {
	// InlineTasksLimit overrides DefaultInlineTasksLimit (0); a negative
	// one is an error.
	InlineTasksLimit int
	// Recheck is how often a wait for a result reads the result subject
	// again, in case the result was published while the connection was
	// down (a NATS restart); 0: 2s; a negative one is an error.
	Recheck time.Duration

	nc *nats.Conn
	js jetstream.JetStream

	mu      sync.Mutex
	arrived map[string]arrival // "N/role" -> this client's last arrival, until planact answers it

	// get sends a direct get; nil: the connection's request. A test
	// answers as a follower behind, or a server away, would.
	get func(ctx context.Context, subj string) (*nats.Msg, error)
}

// New returns a client over nc. A nats-server older than planact needs
// (bus.MinServerVersion) is refused at once with bus.ErrServerTooOld: no
// rollout could run there. With planact's accounts (compose/nats) nc must
// use its user's inbox prefix, where the replies to the client's requests
// come: nats.CustomInboxPrefix(bus.InboxPrefix(user)), which
// bus.ConnOptions.Dial sets (docs/security.md, "Private inboxes").
func New(nc *nats.Conn) (*Client, error) {
	if err := bus.CheckServerVersion(nc); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Client{nc: nc, js: js}, nil
}

// Arrive announces a as its role for its rollout. Arriving twice is
// harmless: the barrier counts each role once. Each call is a message of
// its own (its id ends in a random nonce, unless a.Nonce is set), so a
// corrected arrival sent in the millisecond of the one it replaces is not
// dropped as its copy; a publish tried again keeps the call's id.
func (c *Client) Arrive(ctx context.Context, a *schema.Arrive) error {
	_, err := c.arrive(ctx, a)
	return err
}

// checkArrival refuses, before sending, what planact could not even answer
// (a role it does not know has no result subject); the session-store checks
// the rest and answers with ErrRejected.
func checkArrival(a *schema.Arrive) error {
	if err := schema.CheckRole(a.Role); err != nil {
		return fmt.Errorf("%w: %v", ErrRejected, err)
	}
	switch {
	case a.Rollout < 0:
		return fmt.Errorf("%w: %v", ErrRejected, checkRollout(a.Rollout))
	case a.Engine.URL == "":
		return fmt.Errorf("%w: %s arrives without an engine url", ErrRejected, a.Role)
	}
	return nil
}

// checkRollout refuses a rollout id planact never runs: rollout ids start
// at 0, and nothing would ever answer on a subject of another.
func checkRollout(n int64) error {
	if n < 0 {
		return fmt.Errorf("rollout %d: must not be negative", n)
	}
	return nil
}

// maxArrivals bounds the arrivals a client remembers that planact did not
// answer yet (a wait given up, an arrival whose result is never asked for).
var maxArrivals = 4096

// arrival is what names an arrival: its message id, and when it was made.
type arrival struct {
	id   string
	atMs int64
}

// arrive publishes the arrival and returns what names it.
func (c *Client) arrive(ctx context.Context, a *schema.Arrive) (arrival, error) {
	if err := checkArrival(a); err != nil {
		return arrival{}, err
	}
	if err := c.settings(); err != nil {
		// Rollout waits after it arrives: an arrival that cannot be waited
		// for is not sent.
		return arrival{}, fmt.Errorf("arrive rollout %d as %s: %w", a.Rollout, a.Role, err)
	}
	cp := *a // the caller's arrival keeps its tasks
	a = &cp
	if a.AtMs == 0 {
		a.AtMs = now().UnixMilli()
	}
	if a.Nonce == "" {
		// Its own id even in the millisecond of another arrival (the one
		// it corrects): JetStream would drop it as a copy. Built once, so a
		// publish tried again (untilUp) keeps it.
		a.Nonce = nonce()
	}
	if id := a.MsgID(); len(id) > schema.MaxControlID {
		// planact refuses it (and names it seq:<n>, an answer this
		// client would not know for its own): refused before sending.
		return arrival{}, fmt.Errorf("%w: arrival of %s for rollout %d: an attempt of %d bytes and a nonce of %d make its Nats-Msg-Id %d bytes: want at most %d",
			ErrRejected, a.Role, a.Rollout, len(a.Attempt), len(a.Nonce), len(id), schema.MaxControlID)
	}
	if err := c.offloadTasks(ctx, a); err != nil {
		return arrival{}, err
	}
	if bus.TraceFrom(ctx) == "" {
		ctx = bus.WithTrace(ctx, bus.RolloutTraceID(a.Rollout))
	}
	msg, err := bus.NewMsg(ctx, a)
	if err != nil {
		return arrival{}, err
	}
	err = untilUp(ctx, trainerStream(a.Role), func(ctx context.Context) error { return c.publish(ctx, msg) })
	if err != nil {
		return arrival{}, fmt.Errorf("arrive rollout %d as %s: %w", a.Rollout, a.Role, err)
	}
	c.mu.Lock()
	if c.arrived == nil {
		c.arrived = map[string]arrival{}
	}
	made := arrival{id: a.MsgID(), atMs: a.AtMs}
	c.arrived[arrivalKey(a.Rollout, a.Role)] = made
	for len(c.arrived) > maxArrivals {
		// Never answered, or not waited for: the oldest goes.
		oldest := ""
		for k, at := range c.arrived {
			if oldest == "" || at.atMs < c.arrived[oldest].atMs {
				oldest = k
			}
		}
		delete(c.arrived, oldest)
	}
	c.mu.Unlock()
	return made, nil
}

func arrivalKey(n int64, role string) string { return fmt.Sprintf("%d/%s", n, role) }

// answered forgets the arrival planact answered (a result, or its
// rejection): unless a newer arrival for the rollout replaced it, nothing
// waits for another answer to it.
func (c *Client) answered(n int64, role string, mine arrival) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := arrivalKey(n, role); mine.id != "" && c.arrived[k] == mine {
		delete(c.arrived, k)
	}
}

// untilUp retries op while where (the stream or object store of planact's
// that op writes) does not exist yet (a trainer that starts before
// planact), until ctx ends; the error then names where, also when ctx
// ended within an attempt.
// Each attempt is bounded by bus.PublishTimeout: a request whose answer is
// lost is tried again rather than waited for until ctx ends.
func untilUp(ctx context.Context, where string, op func(ctx context.Context) error) error {
	wait := 50 * time.Millisecond
	var down error // why an attempt found where missing
	for {
		actx, cancel := context.WithTimeout(ctx, bus.PublishTimeout)
		err := op(actx)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders):
			down = err
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			// The answer lost: try again.
		case err != nil && ctx.Err() != nil && down != nil:
			// ctx ended in an attempt while planact was not up: say so.
		default:
			return err
		}
		select {
		case <-ctx.Done():
			if down != nil {
				return fmt.Errorf("planact is not up (no %s): %w (%w)", where, down, ctx.Err())
			}
			return fmt.Errorf("no answer from the %s: %w", where, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// publish sends msg to its trainer stream and waits for the stream's
// acknowledgement. untilUp retries it: a publish that finds no stream is
// not tried again within the attempt (the library's default), which could
// outlast ctx and leave the caller an error that does not say why.
func (c *Client) publish(ctx context.Context, msg *nats.Msg) error {
	_, err := c.js.PublishMsg(ctx, msg, jetstream.WithRetryAttempts(0))
	return err
}

// trainerStream names the stream that role's trainer writes, for untilUp.
func trainerStream(role string) string { return bus.StreamTrainer(role) + " stream" }

// DefaultInlineTasksLimit is the encoded size above which Arrive puts the
// tasks in the object store and sends a reference: NATS servers refuse
// messages over 1 MiB by default.
const DefaultInlineTasksLimit = 256 << 10

func (c *Client) offloadTasks(ctx context.Context, a *schema.Arrive) error {
	if len(a.Tasks) == 0 {
		return nil
	}
	data, err := schema.Marshal(&schema.TaskList{Tasks: a.Tasks})
	if err != nil {
		return err
	}
	limit := c.InlineTasksLimit
	if limit <= 0 {
		limit = DefaultInlineTasksLimit
	}
	if len(data) <= limit {
		return nil
	}
	bucket := bus.ObjectTasks(a.Role)
	var store jetstream.ObjectStore
	err = untilUp(ctx, bucket+" object store", func(ctx context.Context) error {
		var err error
		store, err = c.js.ObjectStore(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return jetstream.ErrStreamNotFound // planact has not provisioned yet
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("tasks of rollout %d: %w", a.Rollout, err)
	}
	// Named by its content: an arrival sent again finds the same object
	// (a trainer may not purge its store, which replacing an object would
	// need), one that brings another list never replaces the one a rollout
	// runs.
	sum := bus.SHA256(data)
	name := fmt.Sprintf("rollout-%d-%s-%s.tasks", a.Rollout, a.Role, sum[:16])
	err = untilUp(ctx, bucket+" object store", func(ctx context.Context) error {
		if info, err := store.GetInfo(ctx, name); err == nil && info.Size == uint64(len(data)) && info.Digest == objectDigest(data) {
			return nil // put before (a retried arrival)
		}
		// Put again where the stream did not answer (a loaded or restarting
		// server).
		_, err := store.PutBytes(ctx, name, data)
		return err
	})
	if err != nil {
		return fmt.Errorf("tasks of rollout %d: %w", a.Rollout, err)
	}
	a.Tasks, a.TasksObject, a.TasksSHA256 = nil, name, sum
	return nil
}

// objectDigest is the digest an object store records for data.
func objectDigest(data []byte) string {
	sum := sha256.Sum256(data)
	return "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
}

// ErrNothingToCancel is returned (wrapped) by Cancel when the rollout had
// already ended (the error says how, and its results stay on the result
// subjects) or planact does not know it.
var ErrNothingToCancel = errors.New("planact: nothing to cancel")

// CancelPatience bounds how long Cancel waits for planact's answer when ctx
// has no deadline.
const CancelPatience = time.Minute

// Cancel aborts a rollout, as the trainer of role: both roles get an
// aborted result. It returns once planact answered: nil when the rollout
// was aborted, ErrNothingToCancel when there was nothing to abort (it had
// already ended: the error says when, and each role's result status and
// why, role's own first, never one status for both: the actor's can be
// failed where the planner's is ok; or it is not known), ErrRefused when
// planact could not read the cancel, or an error saying so when planact
// could not record the cancel (cancel again). One planact would refuse (a
// reason over schema.MaxReason bytes) is an error before anything is sent.
// An answer published while the connection was down is read from the
// stream (every Recheck). Without an answer by the end of ctx (at most
// CancelPatience when ctx has no deadline) it says so; the cancel stays
// published and is acted on when planact's session-store runs.
func (c *Client) Cancel(ctx context.Context, rollout int64, role, reason string) error {
	if err := schema.CheckRole(role); err != nil {
		return fmt.Errorf("cancel rollout %d: %w", rollout, err)
	}
	if err := checkRollout(rollout); err != nil {
		// Stored, it would be answered nowhere Cancel listens.
		return fmt.Errorf("cancel: %w", err)
	}
	if len(reason) > schema.MaxReason {
		return fmt.Errorf("cancel rollout %d: reason of %d bytes: want at most %d (planact repeats it in the rollout's results and answers)",
			rollout, len(reason), schema.MaxReason)
	}
	recheck, err := c.recheck()
	if err != nil {
		return fmt.Errorf("cancel rollout %d: %w", rollout, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, CancelPatience)
		defer cancel()
	}
	// Built once: a publish tried again (untilUp) keeps the cancel's id,
	// and JetStream stores it once.
	msg, err := bus.NewMsg(ctx, &schema.Cancel{Rollout: rollout, Role: role, Reason: reason, AtMs: now().UnixMilli(), Nonce: nonce()})
	if err != nil {
		return err
	}
	id := msg.Header.Get(jetstream.MsgIDHeader)
	// The answer comes on the rollout's status subject, among its episodes'
	// events, and on a subject of its own (the last message there), which
	// is read from the stream too: listen first, and keep only the answers
	// to this cancel (a channel of every event drops what comes while the
	// publish waits, the answer too).
	stored := subject.CancelAnswer(rollout, role, id)
	answers := make(chan schema.Status, 1)
	take := func(m *nats.Msg) {
		var st schema.Status
		if schema.Unmarshal(m.Data, &st) != nil || !answersCancel(&st, id, role) {
			return
		}
		select {
		case answers <- st:
		default: // answered already
		}
	}
	for _, subj := range []string{subject.Status(rollout), stored} {
		sub, err := c.nc.Subscribe(subj, take)
		if err != nil {
			return fmt.Errorf("cancel rollout %d: %w", rollout, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	err = untilUp(ctx, trainerStream(role), func(ctx context.Context) error { return c.publish(ctx, msg) })
	if err != nil {
		return fmt.Errorf("cancel rollout %d: %w", rollout, err)
	}
	t := time.NewTicker(recheck)
	defer t.Stop()
	for {
		if data, err := c.lastResult(ctx, stored); err == nil && data != nil {
			take(&nats.Msg{Data: data})
		}
		select {
		case st := <-answers:
			return cancelled(rollout, id, role, &st)
		case <-t.C:
		case <-ctx.Done():
		}
		if cause := expired(ctx); cause != nil {
			return fmt.Errorf("cancel rollout %d: sent, but no answer from planact (is its session-store running?): %w", rollout, cause)
		}
		if c.nc.IsClosed() {
			return fmt.Errorf("cancel rollout %d: sent, but the connection closed before planact answered: %w", rollout, nats.ErrConnectionClosed)
		}
	}
}

// answersCancel says whether st is planact's answer to the cancel id of
// role: by its cancel_id, or, from a session-store before that field, by
// the head of its detail.
func answersCancel(st *schema.Status, id, role string) bool {
	if st.Event != "cancelled" && st.Event != "rejected" {
		return false
	}
	if st.CancelID != "" {
		return st.CancelID == id
	}
	return strings.HasPrefix(st.Detail, cancelHead(id, role))
}

// cancelHead is how the detail of an answer to the cancel id of role
// starts.
func cancelHead(id, role string) string {
	return fmt.Sprintf("cancel %s by the %s trainer: ", id, role)
}

// cancelled turns st, planact's answer to the cancel id of role, into
// Cancel's error.
func cancelled(rollout int64, id, role string, st *schema.Status) error {
	why := strings.TrimPrefix(st.Detail, cancelHead(id, role))
	outcome := st.CancelOutcome
	if outcome == "" {
		// A session-store before cancel_outcome: its words say.
		switch {
		case st.Event == "cancelled":
			outcome = schema.CancelAborted
		case strings.HasPrefix(why, "could not be recorded"):
			outcome = schema.CancelNotRecorded
		default:
			outcome = schema.CancelNothingToAbort
		}
	}
	switch outcome {
	case schema.CancelAborted:
		return nil
	case schema.CancelNotRecorded:
		// Given up, not done: the rollout may still run.
		return fmt.Errorf("cancel rollout %d: not done: planact %s", rollout, why)
	case schema.CancelRefused:
		return fmt.Errorf("%w: cancel rollout %d (%s): %s", ErrRefused, rollout, id, why)
	case schema.CancelNothingToAbort:
		return fmt.Errorf("%w: %s", ErrNothingToCancel, why)
	}
	return fmt.Errorf("cancel rollout %d: planact's answer says %s %q, which this client does not know: %s", rollout, st.Event, outcome, why)
}

// Result waits for role's result of rollout n until ctx ends. It finds a
// result published before it was called too. Samples kept in the object
// store are fetched. A timeout result returns the result and ErrTimeout; an
// invalid one ErrRejected; a failed one ErrFailed. Partial (some episodes
// ran out of time) and aborted (cancelled) results come with a nil error
// and the samples of the episodes that ended: check Status. A result that
// leaves the delivered groups' samples out (result_samples undelivered:
// DeliveredGroups, GroupSamples) is returned whole, its groups' samples
// read from their messages, unless WithoutGroups names them. The samples
// must be what the result and each group read count (sample_count,
// group_samples); otherwise the error names both counts. Samples not read
// by the end of ctx (a group behind a follower, a server away) are
// ErrTimeout too, naming what was not read.
//
// Call it after this client's Arrive for n and role has returned: the
// arrival tells this rollout's result from an earlier one of the number
// (a training run that counted from 0 again) still in the stream. Without
// an arrival of this client's, any result on the subject is taken.
func (c *Client) Result(ctx context.Context, n int64, role string, opts ...ResultOption) (*schema.Result, error) {
	if err := schema.CheckRole(role); err != nil {
		// No result ever comes on a subject of no role: say so now.
		return nil, fmt.Errorf("%w: result of rollout %d: %v", ErrRejected, n, err)
	}
	if err := checkRollout(n); err != nil {
		return nil, fmt.Errorf("%w: result: %v", ErrRejected, err)
	}
	c.mu.Lock()
	at := c.arrived[arrivalKey(n, role)]
	c.mu.Unlock()
	var o resultOptions
	for _, opt := range opts {
		opt(&o)
	}
	return c.result(ctx, n, role, at, o)
}

// ResultOption changes what Result reads.
type ResultOption func(*resultOptions)

type resultOptions struct {
	taken map[int]bool // groups whose samples the caller has
}

// WithoutGroups is for a trainer that took groups from Groups: the result
// holds their samples again (a result has every delivered group's, unless
// the rollout's result_samples is undelivered), and they are not read
// twice. Result's Samples then holds only the samples of the other groups,
// and a large result's samples object is not fetched at all when no task
// outside the groups named may have samples in it (none trained, failed
// or aborted there: at thousands of episodes, tens of megabytes). With
// result_samples undelivered the result holds only what the caller lacks,
// so nothing is read that it has. SampleCount still counts every sample
// the result holds.
func WithoutGroups(groups ...int) ResultOption {
	return func(o *resultOptions) {
		if o.taken == nil {
			o.taken = map[int]bool{}
		}
		for _, g := range groups {
			o.taken[g] = true
		}
	}
}

// result waits for the result. A rejection of an arrival other than mine
// (an earlier, corrected one) is passed over, and so is an answer that
// names no arrival: planact's name the arrival they answer, and one that
// does not (from a session-store before that, an earlier rollout of the
// number) is not known to answer mine. With no arrival of mine (this
// client did not arrive) every rejection counts, and every result.
//
// The wait needs no JetStream consumer: it subscribes to the result
// subjects, and reads the last message on each from the stream (a direct
// get) when it starts and every Recheck after, so a result published
// before the wait, or while the connection was down, is found too. It
// rides out server restarts and leader changes until ctx ends.
func (c *Client) result(ctx context.Context, n int64, role string, mine arrival, o resultOptions) (*schema.Result, error) {
	// The rejection first: a refusal of mine wins over a result that names
	// another arrival (the first of the role, whose rollout goes on). A
	// caller that did not arrive reads the result first: a rejection there
	// is of another's arrival, the answer only while no result is out.
	subjects := []string{subject.Rejected(n, role), subject.Result(n, role)}
	if mine.id == "" {
		subjects[0], subjects[1] = subjects[1], subjects[0]
	}
	recheck, err := c.recheck()
	if err != nil {
		return nil, fmt.Errorf("wait for rollout %d: %w", n, err)
	}
	msgs := make(chan *nats.Msg, 16)
	for _, subj := range subjects {
		sub, err := c.nc.ChanSubscribe(subj, msgs)
		if err != nil {
			return nil, fmt.Errorf("wait for rollout %d: %w", n, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	t := time.NewTicker(recheck)
	defer t.Stop()
	for {
		for _, subj := range subjects {
			data, err := c.lastResult(ctx, subj)
			if err != nil || data == nil {
				continue // not there yet, or the server is away: read again later
			}
			if r, err := answer(n, mine, subj, data); err != nil || r != nil {
				c.answered(n, role, mine)
				return c.deliver(ctx, n, r, err, o)
			}
		}
		select {
		case m := <-msgs:
			if r, err := answer(n, mine, m.Subject, m.Data); err != nil || r != nil {
				c.answered(n, role, mine)
				return c.deliver(ctx, n, r, err, o)
			}
		case <-t.C:
		case <-ctx.Done():
		}
		if cause := expired(ctx); cause != nil {
			return nil, fmt.Errorf("%w: no %s result for rollout %d: %w", ErrTimeout, role, n, cause)
		}
		if c.nc.IsClosed() {
			return nil, fmt.Errorf("wait for rollout %d: %w", n, nats.ErrConnectionClosed)
		}
	}
}

// answer reads data, a message on subj (rollout n's result or rejection
// subject), as the answer to mine: nil, nil when it is not known to
// answer it (see result).
func answer(n int64, mine arrival, subj string, data []byte) (*schema.Result, error) {
	var r schema.Result
	if err := schema.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", subj, err)
	}
	if mine.id != "" && r.ArrivalID == "" {
		return nil, nil // answers no arrival known: not known to be mine
	}
	if r.Rejected && mine.id != "" && r.ArrivalID != mine.id {
		return nil, nil // the rejection of an earlier arrival
	}
	if !r.Rejected && mine.id != "" && r.ArrivalID != "" && r.ArrivalID != mine.id && r.Stats.FinishedMs > 0 && r.Stats.FinishedMs <= mine.atMs {
		// The result of the rollout that ended before this arrival: a
		// rollout id names one rollout (the session-store refuses the
		// arrival too, on the rejection subject).
		return &r, fmt.Errorf("%w: rollout %d already ended (%s at %s), before this arrival: a rollout id names one rollout; Result reads its result",
			ErrRejected, n, r.Status, time.UnixMilli(r.Stats.FinishedMs).UTC().Format(time.RFC3339))
	}
	return &r, nil
}

// lastResult reads the last message on subj from the ROLLOUT stream, or nil.
func (c *Client) lastResult(ctx context.Context, subj string) ([]byte, error) {
	return c.lastOn(ctx, bus.StreamRollout, subj)
}

// lastOn reads the last message on subj from stream with a direct get (no
// consumer; a trainer's permissions can allow it subject by subject), or nil.
func (c *Client) lastOn(ctx context.Context, stream, subj string) ([]byte, error) {
	rctx, cancel := context.WithTimeout(ctx, bus.PublishTimeout)
	defer cancel()
	get := c.get
	if get == nil {
		get = func(ctx context.Context, subj string) (*nats.Msg, error) {
			return c.nc.RequestWithContext(ctx, subj, nil)
		}
	}
	m, err := get(rctx, "$JS.API.DIRECT.GET."+stream+"."+subj)
	if err != nil {
		return nil, err
	}
	// The server's answer, not what the message's own headers say: a
	// Status there does not make it nothing.
	sm, err := bus.DirectMsg(stream, m)
	if err != nil || sm == nil {
		return nil, err // nil, nil: nothing on the subject yet
	}
	if sm.Data == nil {
		return []byte{}, nil // a message with no body, which reads as none of planact's
	}
	return sm.Data, nil
}

// deliver fetches r's samples from the object store when they are there,
// and turns its status into the documented error.
func (c *Client) deliver(ctx context.Context, n int64, r *schema.Result, err error, o resultOptions) (*schema.Result, error) {
	if err != nil {
		return r, err
	}
	read := r.SamplesObject == "" || o.needs(r) // its own samples are here: inline, or fetched now
	if r.SamplesObject != "" && read {
		if err := c.fetchSamples(ctx, r.Role, r.SamplesObject, &r.Samples); err != nil {
			return r, stopped(ctx, n, err)
		}
	}
	if read && len(r.Samples) != r.SampleCount {
		// A status is a claim, and so is a count: checked before the
		// groups taken are left out, which count in it.
		return r, fmt.Errorf("rollout %d: its %s result holds %d samples and counts %d (sample_count)", n, r.Role, len(r.Samples), r.SampleCount)
	}
	if len(o.taken) > 0 {
		r.Samples = slices.DeleteFunc(r.Samples, func(s schema.Sample) bool { return o.taken[s.GroupIndex] })
	}
	// A result that leaves the delivered groups out (result_samples
	// undelivered) is made whole from the groups' own messages, but for
	// those the caller took.
	inGroups := 0
	for _, g := range r.DeliveredGroups {
		if o.taken[g] {
			continue
		}
		samples, err := c.groupSamples(ctx, n, r.Role, g)
		if err != nil {
			return r, stopped(ctx, n, err)
		}
		r.Samples, inGroups = append(r.Samples, samples...), inGroups+len(samples)
	}
	if len(o.taken) == 0 && inGroups != r.GroupSamples {
		// A status is a claim: groups that hold other than the result
		// counts in them lost or doubled samples on the way.
		return r, fmt.Errorf("rollout %d: the %d groups its %s result names delivered hold %d samples, the result counts %d (group_samples)",
			n, len(r.DeliveredGroups), r.Role, inGroups, r.GroupSamples)
	}
	if inGroups > 0 {
		// Grouped as the result groups them: a group's samples come from
		// its message or the result, never both, each in its order.
		sort.SliceStable(r.Samples, func(i, j int) bool { return r.Samples[i].GroupIndex < r.Samples[j].GroupIndex })
	}
	switch r.Status {
	case schema.ResultTimeout:
		return r, fmt.Errorf("%w: rollout %d: %s", ErrTimeout, n, r.Reason)
	case schema.ResultInvalid:
		return r, fmt.Errorf("%w: rollout %d: %s", ErrRejected, n, r.Reason)
	case schema.ResultFailed:
		return r, fmt.Errorf("%w: rollout %d: %s", ErrFailed, n, r.Reason)
	}
	return r, nil
}

// stopped is err, from reading samples that a message of rollout n names
// (they are there, so the read went on until ctx ended), with ErrTimeout
// too when ctx ended: the caller stopped waiting, and falls back.
func stopped(ctx context.Context, n int64, err error) error {
	if expired(ctx) != nil && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%w: rollout %d: %w", ErrTimeout, n, err)
	}
	return err
}

// needs says whether r's own samples may hold some the caller does not
// have. A result that leaves the delivered groups out holds none of
// theirs: all it holds is needed. Otherwise, samples of a task outside the
// groups taken may be there when the task was trained, or when its episode
// ended failed or aborted (a rollout cut short keeps the samples of the
// episodes that ended, whatever their status).
func (o resultOptions) needs(r *schema.Result) bool {
	if len(o.taken) == 0 || len(r.DeliveredGroups) > 0 {
		return true
	}
	return slices.ContainsFunc(r.Tasks, func(t schema.TaskOutcome) bool {
		return !o.taken[t.GroupIndex] && mayHaveSamples(t.State)
	})
}

// mayHaveSamples says whether a task in state may have samples in a
// result: trained ones do; failed and aborted ones may (an episode that
// ended failed or aborted leaves its samples when the rollout keeps those
// of the other groups).
func mayHaveSamples(state string) bool {
	return state == schema.TaskTrained || state == schema.TaskFailed || state == schema.TaskAborted
}

// groupSamples reads the samples of group g of rollout n that the role's
// result names as delivered: it is there, so a read that finds nothing (a
// server away, a follower behind) is tried again until ctx ends.
func (c *Client) groupSamples(ctx context.Context, n int64, role string, g int) ([]schema.Sample, error) {
	grp, err := c.namedGroup(ctx, n, role, g, "its result")
	if err != nil {
		return nil, err
	}
	if err := c.groupFetched(ctx, n, role, grp); err != nil {
		return nil, err
	}
	return grp.Samples, nil
}

// namedGroup reads group g of rollout n, which a message of planact's (by)
// names delivered: it is there, so a read that gets no answer (a server
// away) or finds nothing (a follower behind, which any replica may be) is
// tried again until ctx ends.
func (c *Client) namedGroup(ctx context.Context, n int64, role string, g int, by string) (*schema.Group, error) {
	var grp *schema.Group
	var bad error // a message that does not decode: no read mends it
	err := untilRead(ctx, fmt.Sprintf("group %d of rollout %d, named delivered by %s", g, n, by), func(ctx context.Context) (err error) {
		grp, err = c.lastGroup(ctx, n, role, g)
		switch {
		case errors.Is(err, errUnread):
			return err
		case err != nil:
			bad = err
		case grp == nil:
			return fmt.Errorf("%s holds nothing", subject.Group(n, role, g))
		}
		return nil
	})
	if bad != nil {
		return nil, fmt.Errorf("%s: %w", subject.Group(n, role, g), bad)
	}
	return grp, err
}

// groupFetched fetches grp's samples when they are in the object store,
// and checks they are what it counts.
func (c *Client) groupFetched(ctx context.Context, n int64, role string, grp *schema.Group) error {
	if grp.SamplesObject != "" {
		if err := c.fetchSamples(ctx, role, grp.SamplesObject, &grp.Samples); err != nil {
			return err
		}
	}
	if len(grp.Samples) != grp.SampleCount {
		// A status is a claim, and so is a count.
		return fmt.Errorf("rollout %d: its %s group %d holds %d samples and counts %d (sample_count)", n, role, grp.GroupIndex, len(grp.Samples), grp.SampleCount)
	}
	return nil
}

// errUnread marks a read that got no answer (the server away): one to try
// again, unlike a message that does not decode.
var errUnread = errors.New("no answer")

// lastGroup reads group g of rollout n from its subject, or nil when the
// subject holds none.
func (c *Client) lastGroup(ctx context.Context, n int64, role string, g int) (*schema.Group, error) {
	data, err := c.lastResult(ctx, subject.Group(n, role, g))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnread, err)
	}
	if data == nil {
		return nil, nil
	}
	var grp schema.Group
	if err := schema.Unmarshal(data, &grp); err != nil {
		return nil, &badMessage{data: data, err: err}
	}
	return &grp, nil
}

// badMessage is a message that does not decode, with its data: a reader
// of the groups tells each once, however often it reads it.
type badMessage struct {
	data []byte
	err  error
}

func (e *badMessage) Error() string { return e.err.Error() }
func (e *badMessage) Unwrap() error { return e.err }

// Rollout arrives and waits for the result, at most timeout (0 = until ctx
// ends). A negative timeout (a deadline already past, say) is an error
// before anything is sent, not a wait without bound.
func (c *Client) Rollout(ctx context.Context, a *schema.Arrive, timeout time.Duration) (*schema.Result, error) {
	if timeout < 0 {
		return nil, fmt.Errorf("rollout %d as %s: timeout %v: want a positive time-out, or 0 to wait until ctx ends", a.Rollout, a.Role, timeout)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	at, err := c.arrive(ctx, a)
	if err != nil {
		return nil, err
	}
	return c.result(ctx, a.Rollout, a.Role, at, resultOptions{})
}

// fetchSamples reads samples from role's object store. The message that
// names the object says it is there, so a failure (a server restarting, a
// leader moving) is tried again, with back-off, until ctx ends; but not
// one no read mends (data that is not its digest), which is an error now.
func (c *Client) fetchSamples(ctx context.Context, role, object string, samples *[]schema.Sample) error {
	var data []byte
	var bad error
	err := untilRead(ctx, "samples "+object, func(ctx context.Context) (err error) {
		data, err = bus.ReadObject(ctx, c.nc, bus.ObjectResults(role), object, 0)
		if !fail.IsRetryable(err) {
			bad, err = err, nil
		}
		return err
	})
	if bad != nil {
		return fmt.Errorf("samples %s: %w", object, bad)
	}
	if err != nil {
		return err
	}
	return schema.Unmarshal(data, samples)
}

// untilRead reads what a message planact published says is there: any
// failure (a server restarting, a leader moving, a follower behind) is
// tried again, with back-off, each try bounded, until ctx ends.
func untilRead(ctx context.Context, what string, read func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := read(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (%w)", what, err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// expired returns why ctx is over, also when its deadline has passed but
// ctx.Err() is not set yet (a call made right at the deadline fails first).
func expired(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// PauseOptions say how a pause treats the generations that run.
type PauseOptions struct {
	// Abort aborts the generations that run (they are sent again after
	// Resume); otherwise Pause waits for them to finish.
	Abort bool
	// Timeout bounds the pause: not resumed by then, the pause ends (once,
	// said on control.<role>.expired): the work that waited for the role
	// fails, saying why, and the role works again. Default 10 minutes.
	Timeout time.Duration
	Reason  string
}

// Pause stops planact sending new generations of role to its engine, so
// that its trainer can swap the weights. It returns once no generation of
// the role runs on any gateway (those that did not say so in time are in
// the answer's Missing). Call Resume with the new weight version after.
// planact answers by the pause's time-out at the latest: Pause waits for
// that and 30 s more (or less, as ctx says), then fails with ErrTimeout.
// A pause planact would refuse (a time-out under a second, a reason over
// schema.MaxReason bytes) is an error before anything is sent; one planact
// refuses all the same (a rule of a newer planact) fails with ErrRefused
// and planact's reason.
func (c *Client) Pause(ctx context.Context, role string, o PauseOptions) (*schema.Paused, error) {
	if err := schema.CheckRole(role); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	p := &schema.Pause{Role: role, Mode: schema.PauseWait, TimeoutS: o.Timeout.Seconds(), Reason: o.Reason, AtMs: now().UnixMilli(), Nonce: nonce()}
	if o.Abort {
		p.Mode = schema.PauseAbort
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("pause %s: timeout %v: want a positive time-out, or 0 for the default", role, o.Timeout)
	}
	*p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("pause: %w", err)
	}
	if len(p.Reason) > schema.MaxReason {
		return nil, fmt.Errorf("pause of %s: reason of %d bytes: want at most %d (planact repeats it when the pause expires)",
			role, len(p.Reason), schema.MaxReason)
	}
	ctx, cancel := context.WithTimeout(ctx, schema.Seconds(p.TimeoutS)+pauseAnswerMargin)
	defer cancel()
	var ans *schema.Paused
	err := c.control(ctx, p, "paused", func(data []byte) bool {
		var a schema.Paused
		if schema.Unmarshal(data, &a) != nil || a.PauseID != p.MsgID() {
			return false
		}
		ans = &a
		return true
	})
	if err != nil {
		return nil, err
	}
	return ans, nil
}

// now stamps arrivals, cancels, pauses and resumes (a variable for tests:
// two in one millisecond).
var now = time.Now

// nonce tells an arrival, cancel, pause or resume from another of its role
// (and an arrival's or cancel's rollout) stamped in the same millisecond,
// in its message id: 8 random bytes in hex, as the Python and Node clients
// make it.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails: it crashes the program first
	return hex.EncodeToString(b[:])
}

// pauseAnswerMargin is how long after a pause's time-out Pause still waits
// for planact's answer.
var pauseAnswerMargin = 30 * time.Second

// Resume lets planact send the generations of role again, from the weights
// of weightVersion (what samples record from now on). It returns once
// planact took the resume (control.<role>.resumed); one planact refuses
// fails with ErrRefused and planact's reason; one it would refuse (a
// weight_version over schema.MaxWeightVersion bytes) is an error before
// anything is sent. Without an answer it waits
// at most 2 minutes (or less, as ctx says), then fails with ErrTimeout:
// the resume is stored all the same, and taken once the session-store
// runs.
func (c *Client) Resume(ctx context.Context, role, weightVersion string) error {
	if err := schema.CheckRole(role); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	r := &schema.Resume{Role: role, WeightVersion: weightVersion, AtMs: now().UnixMilli(), Nonce: nonce()}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, resumeAnswerWait)
	defer cancel()
	return c.control(ctx, r, "resumed", func(data []byte) bool {
		var ans schema.Resumed
		return schema.Unmarshal(data, &ans) == nil && ans.ResumeID == r.MsgID()
	})
}

// resumeAnswerWait is how long Resume waits for planact's answer.
var resumeAnswerWait = 2 * time.Minute

// control publishes a pause or a resume m and waits until planact answers
// it: on control.<role>.<answer>, where mine says whether a message there
// answers m (and keeps it), or with a refusal of m on
// control.<role>.refused. Both subjects are followed, and read again every
// Recheck, so that an answer published while the connection was down is
// found too. ctx bounds the wait.
func (c *Client) control(ctx context.Context, m schema.Message, answer string, mine func([]byte) bool) error {
	role, verb, _ := subject.ParseControl(m.Subject())
	recheck, err := c.recheck()
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, role, err)
	}
	id := m.MsgID()
	answered, refused := subject.Control(role, answer), subject.Control(role, "refused")
	msgs := make(chan *nats.Msg, 8)
	for _, subj := range []string{answered, refused} {
		sub, err := c.nc.ChanSubscribe(subj, msgs)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	msg, err := bus.NewMsg(ctx, m)
	if err != nil {
		return err
	}
	if err := untilUp(ctx, trainerStream(role), func(ctx context.Context) error { return c.publish(ctx, msg) }); err != nil {
		return fmt.Errorf("%s %s: %w", verb, role, err)
	}
	// answers says whether data, on subj, answers m, and with what error.
	answers := func(subj string, data []byte) (bool, error) {
		if subj == answered {
			return mine(data), nil
		}
		var r schema.Refused
		if schema.Unmarshal(data, &r) != nil || r.ID != id || r.Verb != verb {
			return false, nil
		}
		return true, fmt.Errorf("%w: %s %s (%s): %s", ErrRefused, verb, role, id, r.Reason)
	}
	t := time.NewTicker(recheck)
	defer t.Stop()
	for {
		for _, subj := range []string{refused, answered} {
			if data, err := c.lastOn(ctx, bus.StreamControl, subj); err == nil && data != nil {
				if ok, err := answers(subj, data); ok {
					return err
				}
			}
		}
		select {
		case a := <-msgs:
			if ok, err := answers(a.Subject, a.Data); ok {
				return err
			}
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("%w: %s %s: no answer: %w", ErrTimeout, verb, role, ctx.Err())
		}
	}
}

// recheck is c.Recheck, or its default.
func (c *Client) recheck() (time.Duration, error) {
	switch {
	case c.Recheck < 0:
		return 0, fmt.Errorf("Recheck %v: want a positive interval, or 0 for the default (2s)", c.Recheck)
	case c.Recheck > 0:
		return c.Recheck, nil
	}
	return 2 * time.Second, nil
}

// settings refuses a setting of c's that nothing can go by: a negative
// InlineTasksLimit or Recheck (0 takes the default).
func (c *Client) settings() error {
	if c.InlineTasksLimit < 0 {
		return fmt.Errorf("InlineTasksLimit %d: want a size in bytes, or 0 for the default (%d)", c.InlineTasksLimit, DefaultInlineTasksLimit)
	}
	_, err := c.recheck()
	return err
}

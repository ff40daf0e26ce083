package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/fail"
)

// Batch is what ReadBatch read: messages in stream order, and how many
// more match after them.
type Batch struct {
	Msgs []StoredMsg
	// Pending is how many messages on the filter the stream held after
	// the last one read, when the read ended.
	Pending uint64
	// Ended: the replica said where the batch ended (its end of batch, or
	// nothing from there on), so Pending holds. A batch whose end did not
	// come in time holds what came and says nothing of what is left.
	Ended bool
}

// batchTimeout bounds one batch read (a variable for tests).
var batchTimeout = apiTimeout

// batchBytes bounds one batch, so that a reader of a stream of large
// messages gets them a few at a time.
const batchBytes = 1 << 20

// ReadBatch reads up to n (at least 1) messages of stream on subjects
// matching filter (wildcards allowed), from sequence from on, with one
// direct get: no consumer is needed, so a reader (the web view, `planact
// watch`) needs the right to read the stream and nothing else. Any replica
// may answer; one behind the leader answers fewer messages (never a gap),
// and the next read from after the last one gets the rest. An empty batch
// says there is nothing from from on yet.
func ReadBatch(ctx context.Context, nc *nats.Conn, stream, filter string, from uint64, n int) (Batch, error) {
	if n < 1 {
		// 0 is no batch at all to the server: one message, and no end of
		// batch to say what is left.
		return Batch{}, fail.Permanentf("read %s from %d: a batch of %d messages: want at least 1", stream, from, n)
	}
	req, _ := json.Marshal(map[string]any{"seq": max(from, 1), "next_by_subj": filter, "batch": n, "max_bytes": batchBytes})
	inbox := nc.NewInbox()
	msgs := make(chan *nats.Msg, n+1)
	sub, err := nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return Batch{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
		return Batch{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	var b Batch
	for {
		select {
		case <-rctx.Done():
			if len(b.Msgs) > 0 {
				return b, nil // the end of the batch went missing: read on from what came
			}
			return b, fail.Transientf("read %s from %d: %w (%w)", stream, from, rctx.Err(), ErrNotAnswered)
		case m := <-msgs:
			switch status := replyStatus(m); status {
			case "":
			case "404":
				b.Ended = true
				return b, nil // nothing from there on
			case "204": // the end of the batch
				pending, err := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				if err != nil {
					// What is left is not said: not taken for nothing.
					if len(b.Msgs) > 0 {
						return b, nil
					}
					return b, fail.Transientf("read %s from %d: end of batch with a bad Nats-Num-Pending %q", stream, from, m.Header.Get("Nats-Num-Pending"))
				}
				b.Pending, b.Ended = pending, true
				return b, nil
			case "503": // no responders: no replica answers direct gets now
				return b, fail.Transientf("read %s: no replica answers direct gets (%w)", stream, ErrNotAnswered)
			default:
				return b, fail.Transientf("read %s from %d: %s %s", stream, from, status, m.Header.Get("Description"))
			}
			sm, err := storedOf(stream, m)
			if err != nil {
				return b, err
			}
			b.Msgs = append(b.Msgs, *sm)
		}
	}
}

// LastSeq returns the sequence of the last message stream holds on
// subjects matching filter, or 0, with a direct get.
func LastSeq(ctx context.Context, nc *nats.Conn, stream, filter string) (uint64, error) {
	m, err := getMsg(ctx, nc, stream, map[string]any{"last_by_subj": filter}, true)
	if err != nil || m == nil {
		return 0, err
	}
	return m.Seq, nil
}

// LastSeqUntil is LastSeq asked again while no replica answers within a
// request's time-out (a loaded cluster), until ctx ends: the caller's
// deadline (inspect's --timeout), not one request's, bounds the wait. It
// gave up after one request once (a flake hunt: inspect failed with 25 s
// of its 30 left). No responders (no such stream, or no direct gets) is
// an answer, returned at once.
func LastSeqUntil(ctx context.Context, nc *nats.Conn, stream, filter string) (uint64, error) {
	for {
		last, err := LastSeq(ctx, nc, stream, filter)
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) {
			return last, err
		}
	}
}

// Follow reads stream on filter from sequence from on, calling fn with
// every message in order, until ctx ends: what it has read, then what
// comes, polling every interval when there is nothing new. A read that
// fails (a server restarting, a leader moving) is tried again. caughtUp,
// if not nil, is called after each read that found nothing more: every
// message the replica that answered held is read (a batch whose end did
// not come says nothing of that: the next read does). A stream made anew
// (a server restarted without its store), whose sequences started again
// below what was read, is read again from its start, which Follow logs
// (to zerolog.Ctx(ctx)).
func Follow(ctx context.Context, nc *nats.Conn, stream, filter string, from uint64, interval time.Duration, fn func(StoredMsg), caughtUp func()) error {
	next := max(from, 1)
	var last *StoredMsg // the last message read: what tells a stream made anew
	var checked time.Time
	for {
		b, err := ReadBatch(ctx, nc, stream, filter, next, 256)
		for _, m := range b.Msgs {
			fn(m)
			next = m.Seq + 1
		}
		if n := len(b.Msgs); n > 0 {
			m := b.Msgs[n-1] // not its body: the batch is let go of
			last = &StoredMsg{Subject: m.Subject, Seq: m.Seq, Time: m.Time}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && len(b.Msgs) > 0 && (b.Pending > 0 || !b.Ended) {
			continue // more already there, or maybe: read on
		}
		if err == nil && len(b.Msgs) == 0 && last != nil && time.Since(checked) >= remadeEvery {
			checked = time.Now()
			if again, err := remade(ctx, nc, stream, filter, *last); err == nil && again {
				zerolog.Ctx(ctx).Warn().Str("stream", stream).Str("filter", filter).Uint64("read_to", last.Seq).
					Msg("the stream's sequences started again below what was read (it was made anew: a server restarted without its store?); reading it again from its start")
				next, last = 1, nil
				continue
			}
		}
		if err == nil && caughtUp != nil {
			caughtUp()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// remadeEvery is how often at most Follow, with nothing new to read, asks
// whether its stream was made anew (a variable for tests).
var remadeEvery = time.Second

// remade says whether stream was made anew since last, the last message
// on filter Follow read, was read: another message is at its sequence, or
// none is and the last one on filter is below it (messages leave a stream
// oldest first, by age or by count: last gone with a message on filter
// after it left, which Follow would have read). A message deleted by hand
// (nats stream rmm) with none after it reads so too.
func remade(ctx context.Context, nc *nats.Conn, stream, filter string, last StoredMsg) (bool, error) {
	m, err := getMsg(ctx, nc, stream, map[string]any{"seq": last.Seq}, true)
	if err != nil {
		return false, err
	}
	if m != nil {
		return m.Subject != last.Subject || !m.Time.Equal(last.Time), nil
	}
	now, err := LastSeq(ctx, nc, stream, filter)
	return err == nil && now > 0 && now < last.Seq, err
}

// String is for logs.
func (b Batch) String() string {
	return fmt.Sprintf("%d messages, %d pending, ended %v", len(b.Msgs), b.Pending, b.Ended)
}

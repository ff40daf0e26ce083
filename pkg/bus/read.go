package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// StoredMsg is a message as a stream holds it.
type StoredMsg struct {
	Subject string
	Seq     uint64
	Header  nats.Header
	Data    []byte
	Time    time.Time
}

// Decode decodes the stored message into v. A message that is there but
// cannot be read is an error naming its subject, its sequence and what is
// wrong: never taken for no message, or for one that says something else.
func (m *StoredMsg) Decode(v schema.Message) error {
	if err := schema.Unmarshal(m.Data, v); err != nil {
		return fail.E(fail.Permanent, fmt.Errorf("%s sequence %d: %w", m.Subject, m.Seq, err))
	}
	return nil
}

// The JetStream API's "message not found" and "stream not found" error codes.
const (
	errCodeMsgNotFound    = 10037
	errCodeStreamNotFound = 10059
)

// LastMsg returns the last message stored on subject in stream (a subject
// filter with wildcards names the last message of any matching subject),
// or nil when there is none. The read is answered by the stream's leader,
// never by a follower that may lag behind, so a decision taken on it is
// not based on a stale view: on a cluster, a direct get (what KV reads use
// by default) may be answered by any replica and miss a write acknowledged
// a moment ago.
func (b *Bus) LastMsg(ctx context.Context, stream, subject string) (*StoredMsg, error) {
	return b.msgGet(ctx, stream, map[string]any{"last_by_subj": subject})
}

// MsgAt returns the message at sequence seq of stream, or nil when there is
// none, read from the stream's leader.
func (b *Bus) MsgAt(ctx context.Context, stream string, seq uint64) (*StoredMsg, error) {
	return b.msgGet(ctx, stream, map[string]any{"seq": seq})
}

// NextMsg returns the first message stored on subject in stream at or
// after sequence from, or nil when there is none, read as LastMsg reads:
// a subject's messages one by one, in order.
func (b *Bus) NextMsg(ctx context.Context, stream, subject string, from uint64) (*StoredMsg, error) {
	return b.msgGet(ctx, stream, map[string]any{"seq": max(from, 1), "next_by_subj": subject})
}

// ErrNotAnswered is in the error of a read that JetStream did not answer
// (no leader yet, a node restarting): planact's own state is out of reach
// for a moment, which is no fault of an engine or of the work itself.
var ErrNotAnswered = errors.New("JetStream did not answer")

// apiTimeout bounds one JetStream API request.
const apiTimeout = 5 * time.Second

func (b *Bus) msgGet(ctx context.Context, stream string, req map[string]any) (*StoredMsg, error) {
	return getMsg(ctx, b.NC, stream, req, b.single[stream])
}

// getMsg reads one message of stream: from its leader, or with a direct
// get (which any replica may answer) when direct is set.
func getMsg(ctx context.Context, nc *nats.Conn, stream string, req map[string]any, direct bool) (*StoredMsg, error) {
	body, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if direct {
		return directGet(rctx, nc, stream, body, req)
	}
	reply, err := requestLeader(rctx, nc, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			err = fmt.Errorf("stream %s has no leader: %w", stream, err)
		}
		return nil, fail.Transientf("read %s %v: %w (%w)", stream, req, err, ErrNotAnswered)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fail.Transientf("read %s: bad reply: %w", stream, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == errCodeMsgNotFound {
			return nil, nil
		}
		if resp.Error.ErrCode == errCodeStreamNotFound {
			return nil, fail.Transientf("read %s %v: %s (%w)", stream, req, resp.Error.Description, jetstream.ErrStreamNotFound)
		}
		return nil, fail.Transientf("read %s %v: %s (%d)", stream, req, resp.Error.Description, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return nil, fail.Transientf("read %s: empty reply", stream)
	}
	m := &StoredMsg{Subject: resp.Message.Subject, Seq: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Hdrs) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fail.Transientf("read %s %s sequence %d: headers: %w", stream, m.Subject, m.Seq, err)
		}
	}
	return m, nil
}

// requestLeader sends a request that only a stream's leader answers, again
// while none does (no responders: a leader being elected, 4–9 s after its
// node's crash) and every readAttempt while the answer does not come (a
// request sent to the old leader, or lost with a connection), until ctx
// ends: the answer comes within a fraction of a second of the new leader.
func requestLeader(ctx context.Context, nc *nats.Conn, subj string, body []byte) (*nats.Msg, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, readAttempt)
		reply, err := nc.RequestWithContext(actx, subj, body)
		cancel()
		if err == nil || ctx.Err() != nil || !leaderless(err) {
			if err != nil && ctx.Err() != nil {
				err = fmt.Errorf("%w (%w)", err, ctx.Err())
			}
			return reply, err
		}
		if errors.Is(err, nats.ErrNoResponders) {
			select {
			case <-ctx.Done():
			case <-time.After(leaderPoll):
			}
		}
	}
}

// readAttempt bounds one request to a stream's leader within apiTimeout.
const readAttempt = time.Second

// directGet is msgGet for a stream with one replica, where the one server
// that answers holds every acknowledged write: the reply is the message
// itself, without the JSON and base64 of the leader's API.
func directGet(ctx context.Context, nc *nats.Conn, stream string, body []byte, req map[string]any) (*StoredMsg, error) {
	reply, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, body)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			err = fmt.Errorf("stream %s does not answer direct gets: %w", stream, err)
		}
		return nil, fail.Transientf("read %s %v: %w (%w)", stream, req, err, ErrNotAnswered)
	}
	return DirectMsg(stream, reply)
}

// DirectMsg reads reply, the answer to a direct get of one message of
// stream: the message, or nil when the server says there is none (404).
// What the stored message's own headers say (a trainer's message holds
// what the trainer wrote) is never taken for the server's word: not a
// Status, nor its subject, sequence or time.
func DirectMsg(stream string, reply *nats.Msg) (*StoredMsg, error) {
	switch status := replyStatus(reply); status {
	case "":
		return storedOf(stream, reply)
	case "404":
		return nil, nil
	default:
		return nil, fail.Transientf("read %s: %s %s", stream, status, reply.Header.Get("Description"))
	}
}

// storedOf reads a direct get's answer: the message, its subject, sequence
// and time in the headers the server appends to the message's own. Those
// may hold lines of the same names (a trainer's message holds what the
// trainer wrote): the server's are the last.
func storedOf(stream string, reply *nats.Msg) (*StoredMsg, error) {
	m := &StoredMsg{Subject: lastHeader(reply.Header, "Nats-Subject"), Header: reply.Header, Data: reply.Data}
	seq, stamp := lastHeader(reply.Header, "Nats-Sequence"), lastHeader(reply.Header, "Nats-Time-Stamp")
	var err error
	if m.Seq, err = strconv.ParseUint(seq, 10, 64); err != nil {
		return nil, fail.Transientf("read %s: bad Nats-Sequence %q", stream, seq)
	}
	if m.Time, err = time.Parse(time.RFC3339Nano, stamp); err != nil {
		return nil, fail.Transientf("read %s: bad Nats-Time-Stamp %q", stream, stamp)
	}
	return m, nil
}

// replyStatus is the status of a direct get's answer, "" for a message.
// The server's answer with a message carries its stream (Nats-Stream) and
// no status of its own; a Status there is one of the message's headers,
// which a writer may set to make its message read as missing, or as the
// end of a batch.
func replyStatus(reply *nats.Msg) string {
	if reply.Header.Get("Nats-Stream") != "" {
		return ""
	}
	return reply.Header.Get("Status")
}

// lastHeader is the last value of key in h, "" when it has none.
func lastHeader(h nats.Header, key string) string {
	v := h.Values(key)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// LastMsgsOnce returns the message stored on each of subjects in stream,
// keyed by subject (absent where none is), for subjects that are written
// once (PublishOnce: a message there is the only one it will ever hold).
// Every subject (no wildcards) must match filter, a subject filter of the
// stream. They are read in one request, a direct get of the last message of
// every subject matching filter (a batch: the messages, then an end of
// batch), not one request each. On a stream with replicas that answer may
// come from a follower a moment behind; a message it holds is still the one
// (the subject is written once), and a subject it lacks is read again from
// the leader, as is every subject the batch did not cover (more than one
// answer holds), so an absence is never a follower's.
func (b *Bus) LastMsgsOnce(ctx context.Context, stream, filter string, subjects []string) (map[string]*StoredMsg, error) {
	got := make(map[string]*StoredMsg, len(subjects))
	if len(subjects) == 0 {
		return got, nil
	}
	for _, subj := range subjects {
		if strings.ContainsAny(subj, "*>") {
			// Read by subject it would name one message of many, under
			// a key no message is stored on.
			return nil, fail.Permanentf("read %s: %s is a filter, not a subject", stream, subj)
		}
		if !subject.Matches(filter, subj) {
			return nil, fail.Permanentf("read %s: subject %s does not match the filter %s", stream, subj, filter)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	msgs, whole, err := b.directBatch(rctx, stream, map[string]any{"multi_last": []string{filter}})
	if err != nil {
		return nil, err
	}
	batch := make(map[string]*StoredMsg, len(msgs)) // every subject matching filter, asked for or not
	for _, m := range msgs {
		batch[m.Subject] = m
	}
	authoritative := whole && b.single[stream] // the one server holds every acknowledged write
	for _, subj := range subjects {
		m := batch[subj]
		if m == nil && !authoritative {
			if m, err = b.LastMsg(ctx, stream, subj); err != nil {
				return nil, err
			}
		}
		if m != nil {
			got[subj] = m
		}
	}
	return got, nil
}

// directBatch sends a direct get that answers with several messages (a
// batch, or the last message of many subjects) and collects them until the
// end of the batch. whole is false when the answer stopped before every
// message the request matched (the server's limit on one answer: 1,024
// subjects, or its bytes): the caller reads the rest another way.
func (b *Bus) directBatch(ctx context.Context, stream string, req map[string]any) (msgs []*StoredMsg, whole bool, err error) {
	body, _ := json.Marshal(req)
	w := &batchWait{more: make(chan struct{}, 1)}
	inbox, end, err := b.replies.Open(b.NC, w.route)
	if err != nil {
		return nil, false, fail.Transientf("read %s %v: %w (%w)", stream, req, err, ErrNotAnswered)
	}
	defer end()
	if err := b.NC.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, false, fail.Transientf("read %s %v: %w (%w)", stream, req, err, ErrNotAnswered)
	}
	for {
		replies, err := w.next(ctx)
		if err != nil {
			return nil, false, fail.Transientf("read %s %v: %w (%w)", stream, req, err, ErrNotAnswered)
		}
		for _, reply := range replies {
			switch status := replyStatus(reply); status {
			case "":
				m, err := storedOf(stream, reply)
				if err != nil {
					return nil, false, err
				}
				msgs = append(msgs, m)
			case "204": // end of batch
				return msgs, reply.Header.Get("Nats-Num-Pending") == "0", nil
			case "404":
				// "No Results": nothing matched. The server folds a message it
				// failed to load into a 404 too: then nothing is known.
				return nil, reply.Header.Get("Description") == "No Results", nil
			case "413": // too many subjects for one answer
				return nil, false, nil
			case "503":
				return nil, false, fail.Transientf("read %s %v: stream %s does not answer direct gets: no responders (%w)", stream, req, stream, ErrNotAnswered)
			default:
				return nil, false, fail.Transientf("read %s %v: %s %s", stream, req, status, reply.Header.Get("Description"))
			}
		}
	}
}

// batchWait is one batch read's answers as they come.
type batchWait struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	more chan struct{} // signalled when msgs grew
}

func (w *batchWait) route(m *nats.Msg) {
	w.mu.Lock()
	w.msgs = append(w.msgs, m)
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default: // signalled already
	}
}

// next waits for answers and returns those that came since it was last
// called.
func (w *batchWait) next(ctx context.Context) ([]*nats.Msg, error) {
	for {
		w.mu.Lock()
		msgs := w.msgs
		w.msgs = nil
		w.mu.Unlock()
		if len(msgs) > 0 {
			return msgs, nil
		}
		select {
		case <-w.more:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// kvEntry is a KV value as read from the bucket's stream.
type kvEntry struct {
	Value    []byte
	Revision uint64
	Time     time.Time
}

// KVDeleted says whether a KV stream message marks its key gone: a delete
// or purge (KV-Operation), or a marker the server wrote when the key's
// value aged out or was removed (Nats-Marker-Reason, on buckets with limit
// markers), which has an empty body — as nats.go's own Get reads them.
func KVDeleted(h nats.Header) bool {
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge", "Remove":
		return true
	}
	return false
}

// kvGetFresh reads key of bucket from the leader of the bucket's stream;
// nil when the key does not exist or was deleted.
func (b *Bus) kvGetFresh(ctx context.Context, bucket, key string) (*kvEntry, error) {
	m, err := b.LastMsg(ctx, "KV_"+bucket, "$KV."+bucket+"."+key)
	if err != nil || m == nil {
		return nil, err
	}
	if KVDeleted(m.Header) {
		return nil, nil
	}
	return &kvEntry{Value: m.Data, Revision: m.Seq, Time: m.Time}, nil
}

// Purge removes every message of stream on subject (wildcards allowed):
// what planact no longer needs once a rollout has ended.
func (b *Bus) Purge(ctx context.Context, stream, subject string) error {
	body, _ := json.Marshal(map[string]any{"filter": subject})
	rctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	reply, err := b.NC.RequestWithContext(rctx, "$JS.API.STREAM.PURGE."+stream, body)
	if err != nil {
		return fail.Transientf("purge %s %s: %w", stream, subject, err)
	}
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return fail.Transientf("purge %s: bad reply: %w", stream, err)
	}
	if resp.Error != nil {
		return fail.Transientf("purge %s %s: %s", stream, subject, resp.Error.Description)
	}
	return nil
}

// Republish publishes again a message the stream holds, under a new message
// id (its old one with suffix), so that the duplicate window does not drop
// it: how stuck work is handed out once more. extra headers are set on the
// copy (pairs of name, value).
func (b *Bus) Republish(ctx context.Context, m *StoredMsg, suffix string, extra ...string) error {
	msg := nats.NewMsg(m.Subject)
	msg.Data = m.Data
	for k, v := range m.Header {
		if strings.HasPrefix(k, "Nats-") && k != "Nats-Msg-Id" {
			continue // stream metadata of the stored copy
		}
		msg.Header[k] = append([]string(nil), v...)
	}
	msg.Header.Set("Nats-Msg-Id", m.Header.Get("Nats-Msg-Id")+"."+suffix)
	for i := 0; i+1 < len(extra); i += 2 {
		msg.Header.Set(extra[i], extra[i+1])
	}
	return b.publishMsg(ctx, msg)
}

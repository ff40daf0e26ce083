package sessionstore

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/planact/planact/pkg/schema"
)

// A result's samples are most of what a rollout's end moves: tens of
// megabytes at 2,048 episodes. Those of the delivered groups were encoded
// once, when their group was published; a result carries them as they were
// encoded, reading of each only what the result's stats and order need,
// rather than decoding every token and log-prob to encode them again.

// heldSample is one sample of a result: built by assembly (sample), or as
// a delivered group holds it (raw: its encoding; sample holds its
// group_index, index and rollout_id, read from it).
type heldSample struct {
	sample schema.Sample
	tokens int    // len(tokens)
	raw    []byte // nil: built by assembly
}

// built holds a sample assembly built.
func built(s schema.Sample) heldSample { return heldSample{sample: s, tokens: len(s.Tokens)} }

// splitSamples reads an encoded array of samples (a group's, as delivered)
// into held samples: each one's encoding as it is, and what assembly reads
// of it.
func splitSamples(data []byte) ([]heldSample, error) {
	if len(data) == 0 {
		return nil, nil
	}
	r := bytes.NewReader(data)
	d := msgpack.NewDecoder(r)
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("samples: %w", err)
	}
	// Each sample takes a byte at least: a length the data cannot hold
	// (corrupt, or written by another than planact) is not allocated.
	held := make([]heldSample, 0, min(max(n, 0), r.Len()))
	for i := range n {
		start := len(data) - r.Len()
		h, err := readHead(d)
		if err != nil {
			return nil, fmt.Errorf("samples[%d]: %w", i, err)
		}
		h.raw = data[start : len(data)-r.Len()]
		held = append(held, h)
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("samples: %d bytes after the array", r.Len())
	}
	return held, nil
}

// readHead reads one encoded sample (a map by json names), keeping its
// group_index, index and rollout_id and counting its tokens; the rest is
// skipped unread.
func readHead(d *msgpack.Decoder) (heldSample, error) {
	var h heldSample
	n, err := d.DecodeMapLen()
	if err != nil {
		return h, err
	}
	if n < 0 {
		return h, fmt.Errorf("a sample is nil")
	}
	for range n {
		key, err := d.DecodeString()
		if err != nil {
			return h, err
		}
		switch key {
		case "group_index":
			h.sample.GroupIndex, err = d.DecodeInt()
		case "index":
			h.sample.Index, err = d.DecodeInt()
		case "rollout_id":
			h.sample.RolloutID, err = d.DecodeString()
		case "tokens":
			var k int
			if k, err = d.DecodeArrayLen(); err == nil {
				h.tokens = max(k, 0)
				for i := 0; i < k && err == nil; i++ {
					err = d.Skip()
				}
			}
		default:
			err = d.Skip()
		}
		if err != nil {
			return h, fmt.Errorf("%s: %w", key, err)
		}
	}
	return h, nil
}

// encodeSamples encodes held samples as schema.Marshal encodes a
// []schema.Sample of them (none: nil): those delivered as they were
// encoded, those built encoded now.
func encodeSamples(held []heldSample) ([]byte, error) {
	if len(held) == 0 {
		return []byte{msgpcode.Nil}, nil
	}
	size := 5
	for i := range held {
		size += len(held[i].raw)
	}
	out := schema.AppendArrayLen(make([]byte, 0, size), len(held))
	for i := range held {
		if held[i].raw != nil {
			out = append(out, held[i].raw...)
			continue
		}
		data, err := schema.Marshal(&held[i].sample)
		if err != nil {
			return nil, err
		}
		out = append(out, data...)
	}
	return out, nil
}

// samplesOf decodes held samples in full: a result small enough to carry
// its samples in its body.
func samplesOf(held []heldSample) ([]schema.Sample, error) {
	if len(held) == 0 {
		return nil, nil
	}
	out := make([]schema.Sample, len(held))
	for i := range held {
		if held[i].raw == nil {
			out[i] = held[i].sample
			continue
		}
		if err := schema.Unmarshal(held[i].raw, &out[i]); err != nil {
			return nil, fmt.Errorf("samples[%d]: %w", i, err)
		}
	}
	return out, nil
}

// groupCounts is what a delivered group's message holds for one role: its
// samples as they were encoded (held, when assembly puts them in the
// result), how many, their tokens, and the episodes (rollout ids) they
// are of.
type groupCounts struct {
	held            []heldSample
	samples, tokens int
	sampled         map[string]bool
}

// countHeld counts held samples.
func countHeld(held []heldSample) groupCounts {
	c := groupCounts{samples: len(held), sampled: map[string]bool{}}
	for _, h := range held {
		c.tokens += h.tokens
		c.sampled[h.sample.RolloutID] = true
	}
	return c
}

// deliveredCounts keeps what the groups this process delivered count, so
// that results which leave the groups out (result_samples undelivered)
// need not read them back; a group delivered by another replica, or
// before a restart, is read back instead. Bounded as taskCache is.
type deliveredCounts struct {
	mu sync.Mutex
	m  map[rolloutID]map[string]map[int]groupCounts // rollout → role → group
}

// rolloutID names one rollout for good: its number and when its session
// was created. Numbers start again when a training run does, once the
// earlier run's sessions are gone; what a process kept of an earlier
// rollout of the number is not this one's.
type rolloutID struct {
	n         int64
	createdMs int64
}

func identify(sess *schema.Session) rolloutID { return rolloutID{sess.Rollout, sess.CreatedMs} }

func (d *deliveredCounts) put(n rolloutID, role string, g int, c groupCounts) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[rolloutID]map[string]map[int]groupCounts{}
	}
	if d.m[n] == nil {
		if len(d.m) >= maxCachedRollouts {
			for k := range d.m {
				delete(d.m, k)
				break
			}
		}
		d.m[n] = map[string]map[int]groupCounts{}
	}
	if d.m[n][role] == nil {
		d.m[n][role] = map[int]groupCounts{}
	}
	d.m[n][role][g] = c
}

func (d *deliveredCounts) get(n rolloutID, role string, g int) (groupCounts, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.m[n][role][g]
	return c, ok
}

// forget drops what every rollout numbered n counts.
func (d *deliveredCounts) forget(n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.m {
		if id.n == n {
			delete(d.m, id)
		}
	}
}

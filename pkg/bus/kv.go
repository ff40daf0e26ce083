package bus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/telemetry"
)

// Bucket is a KV bucket of planact. Its plain reads are direct gets, which
// on a replicated bucket any replica may answer, possibly a moment behind;
// GetFresh and Mutate's decisions not to write read from the leader.
type Bucket struct {
	jetstream.KeyValue
	bus *Bus
	// replicated is true when followers may answer direct gets.
	replicated bool
}

func (kv *Bucket) count(op string) { telemetry.KVOps.WithLabelValues(kv.Bucket(), op).Inc() }

// maxCASAttempts bounds how often Mutate retries after losing a race.
const maxCASAttempts = 50

// Get reads key into v and returns its revision; found is false if absent.
// On a replicated bucket the value may be a moment old: use it to read, not
// to decide to drop or skip work (GetFresh).
func Get[T any](ctx context.Context, kv *Bucket, key string) (v T, rev uint64, found bool, err error) {
	kv.count("get")
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, false, nil
	}
	if err != nil {
		return v, 0, false, fail.Transientf("kv get %s: %w", key, err)
	}
	if err := decodeValue(kv.Bucket(), key, e.Revision(), e.Value(), &v); err != nil {
		var zero T
		return zero, 0, false, err
	}
	return v, e.Revision(), true, nil
}

// GetFresh reads key into v from the bucket's leader: a read that cannot
// miss a write acknowledged before it, for decisions.
func GetFresh[T any](ctx context.Context, kv *Bucket, key string) (v T, rev uint64, found bool, err error) {
	if !kv.replicated {
		return Get[T](ctx, kv, key)
	}
	kv.count("get_fresh")
	e, err := kv.bus.kvGetFresh(ctx, kv.Bucket(), key)
	if err != nil || e == nil {
		return v, 0, false, err
	}
	if err := decodeValue(kv.Bucket(), key, e.Revision, e.Value, &v); err != nil {
		var zero T
		return zero, 0, false, err
	}
	return v, e.Revision, true, nil
}

// decodeValue decodes the value of key at revision rev of bucket into v. A
// value that is there but cannot be read (schema.Unmarshal refuses a nil or
// an array where a map of fields is wanted, too) is an error naming the key,
// its revision and what is wrong, never a key absent or holding nothing: a
// caller would create, skip or redo work as if it were.
func decodeValue[T any](bucket, key string, rev uint64, data []byte, v *T) error {
	if err := schema.Unmarshal(data, v); err != nil {
		return fail.E(fail.Permanent, fmt.Errorf("kv %s/%s revision %d: %w", bucket, key, rev, err))
	}
	return nil
}

// Create writes v under key only if the key does not exist. created is false
// when it already did (not an error: that is how idempotent writes look).
func Create(ctx context.Context, kv *Bucket, key string, v any) (created bool, err error) {
	data, err := schema.Marshal(v)
	if err != nil {
		return false, fail.E(fail.Permanent, err)
	}
	kv.count("create")
	if _, err := kv.Create(ctx, key, data); err != nil {
		if isConflict(err) {
			return false, nil
		}
		return false, fail.Transientf("kv create %s: %w", key, err)
	}
	return true, nil
}

// Mutate applies fn to the value under key by compare-and-set, retrying when
// another writer won the race. fn sees the current value (zero and
// exists=false if absent) and returns whether it changed it; returning an
// error aborts without writing. Mutate returns the value as last seen or
// written, and whether this call wrote it; with an error, the zero value
// (what fn left before its error was neither).
//
// A write is checked by the server against the revision read, so a stale
// read only costs a retry. A decision not to write rests on a read: when
// the first read may have been stale, it is confirmed against the leader
// before Mutate returns without writing.
func Mutate[T any](ctx context.Context, kv *Bucket, key string, fn func(v *T, exists bool) (bool, error)) (T, bool, error) {
	v, _, wrote, err := MutateRev(ctx, kv, key, fn)
	return v, wrote, err
}

// MutateRev is Mutate that also returns the revision of the value returned
// (0 when the key does not exist), for a writer that goes on with Update.
func MutateRev[T any](ctx context.Context, kv *Bucket, key string, fn func(v *T, exists bool) (bool, error)) (T, uint64, bool, error) {
	var zero T
	fresh := false
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		read := Get[T]
		if fresh {
			read = GetFresh[T]
		}
		v, rev, found, err := read(ctx, kv, key)
		if err != nil {
			return zero, 0, false, err
		}
		changed, err := fn(&v, found)
		if err != nil {
			return zero, 0, false, err // v is what fn made of it: neither seen nor written
		}
		if !changed {
			if fresh || !kv.replicated {
				return v, rev, false, nil
			}
			fresh = true // confirm the decision on the leader's value
			continue
		}
		data, err := schema.Marshal(&v)
		if err != nil {
			return zero, 0, false, fail.E(fail.Permanent, err)
		}
		if found {
			kv.count("update")
			rev, err = kv.Update(ctx, key, data, rev)
		} else {
			kv.count("create")
			rev, err = kv.Create(ctx, key, data)
		}
		if err == nil {
			return v, rev, true, nil
		}
		if !isConflict(err) {
			return zero, 0, false, fail.Transientf("kv write %s: %w", key, err)
		}
		telemetry.KVConflicts.WithLabelValues(kv.Bucket()).Inc()
		// Lost the race (or read a stale value): read from the leader next,
		// after a little random back-off, so that writers contending for
		// one key spread out instead of colliding again.
		fresh = true
		wait := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return zero, 0, false, fail.Transientf("kv write %s: %w", key, ctx.Err())
		}
	}
	return zero, 0, false, fail.Transientf("kv write %s: still contended after %d attempts", key, maxCASAttempts)
}

// MutateFrom is MutateRev for a caller that holds the value at revision rev
// (it read or wrote it): fn is applied to a copy of v and the result
// written at once, without a read; only when another writer came in
// between is the key read again, as MutateRev does. rev 0 means unknown.
func MutateFrom[T any](ctx context.Context, kv *Bucket, key string, v T, rev uint64, fn func(v *T, exists bool) (bool, error)) (T, uint64, bool, error) {
	if rev == 0 {
		return MutateRev(ctx, kv, key, fn)
	}
	// fn may change what v shares (slices, maps): it works on a copy.
	data, err := schema.Marshal(&v)
	if err != nil {
		return v, 0, false, fail.E(fail.Permanent, err)
	}
	var cur T
	if err := schema.Unmarshal(data, &cur); err != nil {
		return v, 0, false, fail.E(fail.Permanent, err)
	}
	changed, err := fn(&cur, true)
	if err != nil {
		var zero T
		return zero, 0, false, err
	}
	if !changed {
		// A decision not to write rests on a read, not on what the
		// caller held (another writer may have come since).
		return MutateRev(ctx, kv, key, fn)
	}
	newRev, conflict, err := Update(ctx, kv, key, &cur, rev)
	if err != nil {
		var zero T
		return zero, 0, false, err
	}
	if conflict {
		return MutateRev(ctx, kv, key, fn)
	}
	return cur, newRev, true, nil
}

// MutateNew is MutateRev for a key that is most likely absent (the first
// write of a turn's state, say): fn is applied to the zero value, as to an
// absent key, and the result created without reading first. Only when the
// key exists after all (the create is refused), or fn writes nothing, does
// it go on as MutateRev, with a read: a decision not to write rests on a
// read, never on the guess.
func MutateNew[T any](ctx context.Context, kv *Bucket, key string, fn func(v *T, exists bool) (bool, error)) (T, uint64, bool, error) {
	var v T
	changed, err := fn(&v, false)
	if err != nil || !changed {
		return MutateRev(ctx, kv, key, fn)
	}
	data, err := schema.Marshal(&v)
	if err != nil {
		return v, 0, false, fail.E(fail.Permanent, err)
	}
	kv.count("create")
	rev, err := kv.Create(ctx, key, data)
	switch {
	case err == nil:
		return v, rev, true, nil
	case isConflict(err):
		return MutateRev(ctx, kv, key, fn) // a wrong guess, not a race: no conflict counted
	default:
		var zero T
		return zero, 0, false, fail.Transientf("kv write %s: %w", key, err)
	}
}

// Update writes v under key if the key is still at revision rev (0: if it
// does not exist), and returns the new revision. conflict is true, with no
// error, when another writer changed the key since rev: the caller reads it
// again (GetFresh) and decides anew.
func Update(ctx context.Context, kv *Bucket, key string, v any, rev uint64) (newRev uint64, conflict bool, err error) {
	data, err := schema.Marshal(v)
	if err != nil {
		return 0, false, fail.E(fail.Permanent, err)
	}
	if rev == 0 {
		kv.count("create")
		newRev, err = kv.Create(ctx, key, data)
	} else {
		kv.count("update")
		newRev, err = kv.Update(ctx, key, data, rev)
	}
	if isConflict(err) {
		telemetry.KVConflicts.WithLabelValues(kv.Bucket()).Inc()
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fail.Transientf("kv write %s: %w", key, err)
	}
	return newRev, false, nil
}

// isConflict says whether a write was refused because the key was not at
// the revision it expected. nats.go wraps most such refusals in
// ErrKeyRevisionMismatch or ErrKeyExists, but not all: Create over a
// deleted key returns the stream's own error, whose code on a replicated
// stream (10164, a write on the key in flight) matches neither.
func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
		errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Follow watches every key of kv until ctx ends, watching again when a
// watch cannot start or ends, as a NATS restart ends it: a second later,
// twice as long each time up to 30 s while every watch fails or ends
// within 30 s of its start (one that keeps ending at once does not spin),
// and a second again after a watch that ran longer. Each entry goes to
// update, in order. A watch begins with the last value of every key; once
// those are read, replayed gets the keys they held: a key gone while no
// watch ran (purged, or its delete marker expired) is among none of them,
// and no update will ever say it is gone. A key written during the
// restart is among them, or comes after them.
func (kv *Bucket) Follow(ctx context.Context, log zerolog.Logger, update func(jetstream.KeyValueEntry), replayed func(keys map[string]bool)) {
	wait := followWait
	for {
		began := time.Now()
		w, err := kv.WatchAll(ctx)
		if err == nil {
			keys := map[string]bool{}
			for e := range w.Updates() {
				if e == nil {
					if keys != nil {
						replayed(keys)
						keys = nil
					}
					continue
				}
				if keys != nil {
					keys[e.Key()] = true
				}
				update(e)
			}
			_ = w.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) >= maxFollowWait {
			wait = followWait // the watch ran a good while: its end is news, not a habit
		}
		if err != nil {
			log.Warn().Err(err).Str("bucket", kv.Bucket()).Dur("retry_in", wait).Msg("watch; trying again")
		} else {
			log.Debug().Str("bucket", kv.Bucket()).Dur("retry_in", wait).Msg("watch ended; watching again")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxFollowWait)
	}
}

// followWait is Follow's first wait before watching again, and
// maxFollowWait its longest.
const (
	followWait    = time.Second
	maxFollowWait = 30 * time.Second
)

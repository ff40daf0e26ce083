package bus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// maxCASAttempts bounds how often Mutate retries after losing a race.
const maxCASAttempts = 50

// Get reads key into v and returns its revision; found is false if absent.
func Get[T any](ctx context.Context, kv jetstream.KeyValue, key string) (v T, rev uint64, found bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, false, nil
	}
	if err != nil {
		return v, 0, false, fail.Transientf("kv get %s: %w", key, err)
	}
	if err := schema.Unmarshal(e.Value(), &v); err != nil {
		return v, 0, false, fmt.Errorf("kv %s: %w", key, err)
	}
	return v, e.Revision(), true, nil
}

// Create writes v under key only if the key does not exist. created is false
// when it already did (not an error: that is how idempotent writes look).
func Create(ctx context.Context, kv jetstream.KeyValue, key string, v any) (created bool, err error) {
	data, err := schema.Marshal(v)
	if err != nil {
		return false, fail.E(fail.Permanent, err)
	}
	if _, err := kv.Create(ctx, key, data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
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
// written, and whether this call wrote it.
func Mutate[T any](ctx context.Context, kv jetstream.KeyValue, key string, fn func(v *T, exists bool) (bool, error)) (T, bool, error) {
	var zero T
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		v, rev, found, err := Get[T](ctx, kv, key)
		if err != nil {
			return zero, false, err
		}
		changed, err := fn(&v, found)
		if err != nil || !changed {
			return v, false, err
		}
		data, err := schema.Marshal(&v)
		if err != nil {
			return zero, false, fail.E(fail.Permanent, err)
		}
		if found {
			_, err = kv.Update(ctx, key, data, rev)
		} else {
			_, err = kv.Create(ctx, key, data)
		}
		if err == nil {
			return v, true, nil
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			// Lost the race: back off a little, at random, so that writers
			// contending for one key spread out instead of colliding again.
			wait := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return zero, false, fail.Transientf("kv write %s: %w", key, ctx.Err())
			}
			continue
		}
		return zero, false, fail.Transientf("kv write %s: %w", key, err)
	}
	return zero, false, fail.Transientf("kv write %s: still contended after %d attempts", key, maxCASAttempts)
}

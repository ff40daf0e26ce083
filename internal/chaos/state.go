package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
)

// BusState is what JetStream holds at one moment. Streams, buckets and
// object stores are found, not named, so that a planact that adds or
// renames one is still counted whole.
type BusState struct {
	Consumers map[string]int    `json:"consumers"` // per stream (buckets' and object stores' too)
	Messages  map[string]uint64 `json:"messages"`  // per stream
	Keys      map[string]int    `json:"keys"`      // per KV bucket: live keys
	Objects   map[string]int    `json:"objects"`   // per object store
}

// ObjectCount is the number of objects in every store.
func (s BusState) ObjectCount() int {
	n := 0
	for _, v := range s.Objects {
		n += v
	}
	return n
}

// ReadBusState reads consumers and messages per stream (stream info),
// live keys per bucket and objects per store. What cannot be read is left
// out and its error returned, joined.
func ReadBusState(ctx context.Context, js jetstream.JetStream) (BusState, error) {
	s := BusState{Consumers: map[string]int{}, Messages: map[string]uint64{}, Keys: map[string]int{}, Objects: map[string]int{}}
	var errs []error
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lister := js.ListStreams(lctx)
	for info := range lister.Info() {
		name := info.Config.Name
		s.Consumers[name] = info.State.Consumers
		s.Messages[name] = info.State.Msgs
		switch {
		case strings.HasPrefix(name, "KV_"):
			bucket := strings.TrimPrefix(name, "KV_")
			n, err := countKeys(ctx, js, bucket)
			if err != nil {
				errs = append(errs, fmt.Errorf("kv %s: %w", bucket, err))
				continue
			}
			s.Keys[bucket] = n
		case strings.HasPrefix(name, "OBJ_"):
			store := strings.TrimPrefix(name, "OBJ_")
			n, err := countObjects(ctx, js, store)
			if err != nil {
				errs = append(errs, fmt.Errorf("object store %s: %w", store, err))
				continue
			}
			s.Objects[store] = n
		}
	}
	if err := lister.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list streams: %w", err))
	}
	return s, errors.Join(errs...)
}

func countKeys(ctx context.Context, js jetstream.JetStream, bucket string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return 0, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for range lister.Keys() {
		n++
	}
	_ = lister.Stop() // already stopped once the keys are listed
	return n, ctx.Err()
}

func countObjects(ctx context.Context, js jetstream.JetStream, store string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	obs, err := js.ObjectStore(ctx, store)
	if err != nil {
		return 0, err
	}
	objs, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	return len(objs), err
}

// Leftovers is what planact left in JetStream after its retention.
type Leftovers struct {
	Sessions int               `json:"sessions"`  // keys in KV sessions
	Runs     int               `json:"runs"`      // keys in KV runs
	Keys     map[string]int    `json:"keys"`      // per bucket, these two and any other
	Objects  int               `json:"objects"`   // in every object store
	PerStore map[string]int    `json:"per_store"` // objects per store
	Messages map[string]uint64 `json:"stream_messages,omitempty"`
	// Retention says what was waited for: the flags given to the services,
	// or why none could be.
	Retention string        `json:"retention"`
	Waited    time.Duration `json:"waited_ns"` // after the last rollout's result
	Err       string        `json:"err,omitempty"`
}

// Total is the number of keys (in every bucket) and objects left.
func (l Leftovers) Total() int {
	n := l.Objects
	for _, k := range l.Keys {
		n += k
	}
	return n
}

func leftoversOf(s BusState) Leftovers {
	return Leftovers{
		Sessions: s.Keys[bus.BucketSession], Runs: s.Keys[bus.BucketRuns], Keys: s.Keys,
		Objects: s.ObjectCount(), PerStore: s.Objects, Messages: s.Messages,
	}
}

// WaitLeftovers polls the bus until no key or object is left or until
// deadline, and returns the last count. every, if set, sees each reading.
func WaitLeftovers(ctx context.Context, js jetstream.JetStream, deadline time.Time, every func(BusState)) (Leftovers, error) {
	for {
		s, err := ReadBusState(ctx, js)
		if every != nil {
			every(s)
		}
		l := leftoversOf(s)
		if err == nil && l.Total() == 0 || !time.Now().Before(deadline) || ctx.Err() != nil {
			if err != nil {
				l.Err = err.Error()
			}
			return l, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(2*time.Second, time.Until(deadline))):
		}
	}
}

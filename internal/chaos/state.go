package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
)

// Streams are the streams whose consumers and messages are counted: the
// three of planact and those behind the buckets and the object store.
var Streams = []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, "KV_" + bus.BucketSession, "KV_" + bus.BucketRuns, "OBJ_" + bus.ObjectResults}

// BusState is what JetStream holds for planact at one moment.
type BusState struct {
	Consumers map[string]int    `json:"consumers"` // per stream
	Messages  map[string]uint64 `json:"messages"`  // per stream
	Keys      map[string]int    `json:"keys"`      // per KV bucket: live keys
	Objects   int               `json:"objects"`   // in the object store
}

// ReadBusState reads consumers and messages per stream (stream info),
// live keys per bucket and objects in the store. What cannot be read is
// left out and its error returned, joined.
func ReadBusState(ctx context.Context, js jetstream.JetStream) (BusState, error) {
	s := BusState{Consumers: map[string]int{}, Messages: map[string]uint64{}, Keys: map[string]int{}}
	var errs []error
	for _, name := range Streams {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := js.Stream(ictx, name)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("stream %s: %w", name, err))
			continue
		}
		info := st.CachedInfo()
		s.Consumers[name] = info.State.Consumers
		s.Messages[name] = info.State.Msgs
	}
	for _, bucket := range []string{bus.BucketSession, bus.BucketRuns} {
		n, err := countKeys(ctx, js, bucket)
		if err != nil {
			errs = append(errs, fmt.Errorf("kv %s: %w", bucket, err))
			continue
		}
		s.Keys[bucket] = n
	}
	n, err := countObjects(ctx, js)
	if err != nil {
		errs = append(errs, fmt.Errorf("object store %s: %w", bus.ObjectResults, err))
	} else {
		s.Objects = n
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

func countObjects(ctx context.Context, js jetstream.JetStream) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, err := js.ObjectStore(ctx, bus.ObjectResults)
	if err != nil {
		return 0, err
	}
	objs, err := store.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	return len(objs), err
}

// Leftovers is what planact left in JetStream after its retention.
type Leftovers struct {
	Sessions int               `json:"sessions"` // keys in KV sessions
	Runs     int               `json:"runs"`     // keys in KV runs
	Objects  int               `json:"objects"`  // objects in the results store
	Messages map[string]uint64 `json:"stream_messages,omitempty"`
	// Retention says what was waited for: the flags given to the services,
	// or why none could be.
	Retention string        `json:"retention"`
	Waited    time.Duration `json:"waited_ns"` // after the last rollout's result
	Err       string        `json:"err,omitempty"`
}

// Total is the number of keys and objects left.
func (l Leftovers) Total() int { return l.Sessions + l.Runs + l.Objects }

func leftoversOf(s BusState) Leftovers {
	return Leftovers{Sessions: s.Keys[bus.BucketSession], Runs: s.Keys[bus.BucketRuns], Objects: s.Objects, Messages: s.Messages}
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

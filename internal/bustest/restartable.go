package bustest

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// RestartableKV is a key-value bucket whose watches a test can end, as a
// NATS restart ends them, and hold down before they start again.
type RestartableKV struct {
	jetstream.KeyValue
	// Started gets a value for every watch started.
	Started chan struct{}

	mu      sync.Mutex
	current jetstream.KeyWatcher
	down    chan struct{} // while open, a new watch waits for it to close
}

// Restartable wraps kv.
func Restartable(kv jetstream.KeyValue) *RestartableKV {
	return &RestartableKV{KeyValue: kv, Started: make(chan struct{}, 4)}
}

func (r *RestartableKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	r.mu.Lock()
	down := r.down
	r.mu.Unlock()
	if down != nil {
		select {
		case <-down:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	w, err := r.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.current = w
	r.mu.Unlock()
	r.Started <- struct{}{}
	return w, nil
}

// Stop ends the watch that runs and holds the next one until the returned
// function is called.
func (r *RestartableKV) Stop() (up func()) {
	r.mu.Lock()
	down := make(chan struct{})
	r.down = down
	w := r.current
	r.mu.Unlock()
	_ = w.Stop()
	return func() {
		r.mu.Lock()
		r.down = nil
		r.mu.Unlock()
		close(down)
	}
}

package sessionstore

import (
	"sync"
	"time"
)

// failingSince remembers, per rollout, when this replica first failed to
// settle the rollout's effects, until they settle. A finished rollout
// whose results (or a group before them) keep failing for ResultPatience
// from then goes out failed, saying why; a failure after a long outage of
// NATS is tried again for that long first, not given up at once.
type failingSince struct {
	mu sync.Mutex
	m  map[int64]time.Time
}

// note records a failure of rollout n at now, unless one is recorded.
func (f *failingSince) note(n int64, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[int64]time.Time{}
	}
	if _, ok := f.m[n]; ok {
		return
	}
	if len(f.m) >= maxCachedRollouts {
		// Bounded: one forgotten starts its patience again, which only
		// gives up later.
		for k := range f.m {
			delete(f.m, k)
			break
		}
	}
	f.m[n] = now
}

// since is when rollout n first failed, if it is failing.
func (f *failingSince) since(n int64) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.m[n]
	return t, ok
}

// settled forgets rollout n's failures: its effects settled.
func (f *failingSince) settled(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, n)
}

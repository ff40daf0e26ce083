package sessionstore

import (
	"sync"
	"time"
)

// failingSince remembers, per rollout, when this replica first failed to
// settle the effects of the finished rollout (its results, or a group
// before them), until they settle. A finished rollout whose results keep
// failing for ResultPatience from then goes out failed, saying why; a
// failure after a long outage of NATS is tried again for that long first,
// not given up at once. A failure while the rollout ran is not one of its
// results: another replica may have settled it since, and this one, which
// would not know, would give the results up at their first failure, however
// long after.
type failingSince struct {
	mu sync.Mutex
	m  map[rolloutID]time.Time
}

// note records a failure of rollout n at now, unless one is recorded.
func (f *failingSince) note(n rolloutID, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[rolloutID]time.Time{}
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
func (f *failingSince) since(n rolloutID) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.m[n]
	return t, ok
}

// settled forgets rollout n's failures: its effects settled.
func (f *failingSince) settled(n rolloutID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, n)
}

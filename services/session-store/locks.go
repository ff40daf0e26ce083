package sessionstore

import "sync"

// rolloutLocks serialises the settling of one rollout within this process:
// two handlers that see the same outbox (two episode ends at once) would
// both publish its effects, and ask a group filter twice. Across replicas
// the effects stay idempotent; this only saves the repeated work.
type rolloutLocks struct {
	mu sync.Mutex
	m  map[int64]*rolloutLock
}

type rolloutLock struct {
	sync.Mutex
	users int
}

// lock locks rollout n; waited says whether another holder had it (its
// work may have changed the session since the caller read it).
func (l *rolloutLocks) lock(n int64) (unlock func(), waited bool) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[int64]*rolloutLock{}
	}
	e := l.m[n]
	if e == nil {
		e = &rolloutLock{}
		l.m[n] = e
	}
	e.users++
	l.mu.Unlock()
	if !e.TryLock() {
		e.Lock()
		waited = true
	}
	return func() {
		e.Unlock()
		l.mu.Lock()
		if e.users--; e.users == 0 {
			delete(l.m, n)
		}
		l.mu.Unlock()
	}, waited
}

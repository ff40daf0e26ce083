package telemetry

import (
	"sync"
	"sync/atomic"
	"time"
)

// The clock live spans are stamped with (spanNow): the wall time of an
// anchor reading plus the monotonic time since, compared with the wall
// clock now and then and moved when the wall clock was stepped.
//
// time.Now reads the wall clock and then the monotonic clock; a thread
// preempted between the two reads (on a loaded machine, for milliseconds)
// gets a wall time behind its monotonic one, and a span stamped with it is
// shifted against the spans around it: a child seemed to end after its
// parent. On one anchored timeline a process's spans nest exactly. But the
// wall clock is what every other stamp is read from (the times the server
// stores messages at, the turn, episode and rollout spans recorded from
// them, other processes' spans), and it can be stepped: a CI machine's
// clock once jumped 0.9 s ahead while a test process ran, and every act
// span, anchored at start-up, then began before its turn. So the anchor is
// checked against the wall clock every checkEvery, and moved when the two
// are more than maxDrift apart: at once when the wall clock is ahead (a
// preempted reading is only ever behind, so that is a step), and when it is
// behind only if the next check finds it behind too (one preempted check
// is not a step).
const (
	checkEvery = 50 * time.Millisecond
	maxDrift   = time.Millisecond
)

// reading is one look at both clocks: the wall time (no monotonic part) and
// the monotonic time since the process's origin.
type reading struct {
	wall time.Time
	mono time.Duration
}

var origin = time.Now()

// readClocks is time.Now taken apart; tests step the wall clock here.
var readClocks = func() reading {
	t := time.Now()
	return reading{t.Round(0), t.Sub(origin)}
}

// spanClock is the anchored timeline.
type spanClock struct {
	base      atomic.Pointer[reading] // the anchor
	nextCheck atomic.Int64            // monotonic time of the next comparison
	mu        sync.Mutex              // one comparison at a time
	behind    bool                    // the last comparison found the wall clock behind
}

var clock = newSpanClock()

func newSpanClock() *spanClock {
	c := &spanClock{}
	base := anchor()
	c.base.Store(&base)
	c.nextCheck.Store(int64(base.mono + checkEvery))
	return c
}

// spanNow is the time a live span starts or ends at.
func spanNow() time.Time { return clock.now() }

func (c *spanClock) now() time.Time {
	r := readClocks()
	if int64(r.mono) >= c.nextCheck.Load() && c.mu.TryLock() {
		c.check(r.mono)
		c.mu.Unlock()
	}
	base := c.base.Load()
	return base.wall.Add(r.mono - base.mono)
}

// check compares the anchor with a fresh one and moves it if the wall clock
// was stepped (see the comment at the top of this file). mu is held.
func (c *spanClock) check(mono time.Duration) {
	c.nextCheck.Store(int64(mono + checkEvery))
	base := c.base.Load()
	fresh := anchor()
	drift := fresh.wall.Sub(base.wall) - (fresh.mono - base.mono)
	switch {
	case drift > maxDrift || drift < -maxDrift && c.behind:
		c.base.Store(&fresh)
		c.behind = false
	default:
		c.behind = drift < -maxDrift
	}
}

// anchor is the reading, of a few, whose wall part is least behind its
// monotonic part: a reading preempted between its two reads is only ever
// behind.
func anchor() reading {
	best := readClocks()
	for range 8 {
		if r := readClocks(); r.wall.Sub(best.wall) > r.mono-best.mono {
			best = r
		}
	}
	return best
}

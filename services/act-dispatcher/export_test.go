package actdispatcher

import (
	"context"
	"sync/atomic"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// FailOutcomePublishes makes the next n publishes of an act's outcome fail
// as a stream that does not answer does; it returns how many failed so far
// and a function that restores the real publish.
func FailOutcomePublishes(n int64) (failed func() int64, undo func()) {
	was := publishOutcome
	var count atomic.Int64
	publishOutcome = func(ctx context.Context, b *bus.Bus, done *schema.ActDone) (bool, error) {
		if count.Add(1) <= n {
			return false, fail.Transientf("publish %s: nats: no response from stream", done.Subject())
		}
		return was(ctx, b, done)
	}
	return func() int64 { return min(count.Load(), n) }, func() { publishOutcome = was }
}

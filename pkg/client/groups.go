package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// Groups streams role's groups of rollout n as planact delivers them: each
// group (the samples of the copies of one task) as soon as all its tasks
// ended and it passed the rollout's group filter, so that an asynchronous
// trainer can train on it before the rollout ends. Each delivered group is
// yielded once, samples fetched; the stream ends when the rollout's result
// is out (Result then returns it at once) or with an error when ctx ends.
// Groups delivered before the call are yielded too.
//
//	for g, err := range c.Groups(ctx, n, schema.RolePlanner) {
//		if err != nil { … }
//		train(g.Samples)
//	}
//
// Like Result, it needs no JetStream consumer and rides out server restarts.
func (c *Client) Groups(ctx context.Context, n int64, role string) iter.Seq2[*schema.Group, error] {
	return func(yield func(*schema.Group, error) bool) {
		if err := schema.CheckRole(role); err != nil {
			yield(nil, fmt.Errorf("%w: groups of rollout %d: %v", ErrRejected, n, err))
			return
		}
		msgs := make(chan *nats.Msg, 64)
		for _, subj := range []string{subject.Groups(n, role), subject.Result(n, role)} {
			sub, err := c.nc.ChanSubscribe(subj, msgs)
			if err != nil {
				yield(nil, fmt.Errorf("groups of rollout %d: %w", n, err))
				return
			}
			defer func() { _ = sub.Unsubscribe() }()
		}
		seen := map[int]bool{}
		// give yields g unless it was; false: the caller stopped.
		give := func(g *schema.Group) bool {
			if seen[g.GroupIndex] {
				return true
			}
			seen[g.GroupIndex] = true
			if g.SamplesObject != "" {
				if err := c.fetchSamples(ctx, role, g.SamplesObject, &g.Samples); err != nil {
					return yield(nil, err)
				}
			}
			return yield(g, nil)
		}
		// catchUp yields, from the stream, the delivered groups not yet
		// seen: those the last group message lists, or those named.
		catchUp := func(named []int) (bool, error) {
			if named == nil {
				data, err := c.lastResult(ctx, subject.Groups(n, role))
				if err != nil || data == nil {
					return true, nil // none yet, or the server is away: later
				}
				var last schema.Group
				if err := schema.Unmarshal(data, &last); err != nil {
					return true, err
				}
				named = last.Delivered
			}
			for _, gi := range named {
				if seen[gi] {
					continue
				}
				g, err := c.lastGroup(ctx, n, role, gi)
				switch {
				case errors.Is(err, errUnread):
					return true, nil // the server is away: later
				case err != nil:
					return true, err
				case g == nil:
					continue // not delivered
				}
				if !give(g) {
					return false, nil
				}
			}
			return true, nil
		}
		// finish yields what the result says was delivered and not seen.
		finish := func(data []byte) {
			var r schema.Result
			if err := schema.Unmarshal(data, &r); err != nil {
				yield(nil, err)
				return
			}
			var named []int
			for _, t := range r.Tasks {
				if !slices.Contains(named, t.GroupIndex) {
					named = append(named, t.GroupIndex)
				}
			}
			if _, err := catchUp(named); err != nil {
				yield(nil, err)
			}
		}
		t := time.NewTicker(c.recheck())
		defer t.Stop()
		for {
			if more, err := catchUp(nil); !more {
				return
			} else if err != nil && !yield(nil, err) {
				return
			}
			if data, err := c.lastResult(ctx, subject.Result(n, role)); err == nil && data != nil {
				finish(data)
				return
			}
			for waiting := true; waiting; {
				select {
				case m := <-msgs:
					if m.Subject == subject.Result(n, role) {
						finish(m.Data)
						return
					}
					var g schema.Group
					if err := schema.Unmarshal(m.Data, &g); err != nil {
						if !yield(nil, fmt.Errorf("%s: %w", m.Subject, err)) {
							return
						}
						continue
					}
					if !give(&g) {
						return
					}
				case <-t.C:
					waiting = false
				case <-ctx.Done():
					waiting = false
				}
				if cause := expired(ctx); cause != nil {
					yield(nil, fmt.Errorf("%w: rollout %d: %s groups: %w", ErrTimeout, n, role, cause))
					return
				}
				if c.nc.IsClosed() {
					yield(nil, fmt.Errorf("groups of rollout %d: %w", n, nats.ErrConnectionClosed))
					return
				}
			}
		}
	}
}

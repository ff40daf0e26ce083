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
// Groups delivered before the call are yielded too. As Result does, it
// goes by this client's arrival for n and role: a rejection of it ends the
// stream with ErrRejected, and so does the result of a rollout that ended
// before it (an earlier one of the number), none of whose groups is
// yielded; without an arrival of this client's, every rejection and result
// counts. A group the result or a group message names delivered is read
// until it is (a follower behind, a server restarting): the stream does
// not end without it but with ErrTimeout naming it, when ctx ends first
// (as it does when a group's samples object is not read by then). A
// group whose samples are other than its sample_count is an error naming
// both counts, in its place; so is a group message that does not decode,
// said once: the stream goes on with the other groups.
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
		if err := checkRollout(n); err != nil {
			yield(nil, fmt.Errorf("%w: groups: %v", ErrRejected, err))
			return
		}
		recheck, err := c.recheck()
		if err != nil {
			yield(nil, fmt.Errorf("groups of rollout %d: %w", n, err))
			return
		}
		c.mu.Lock()
		mine := c.arrived[arrivalKey(n, role)]
		c.mu.Unlock()
		answers := []string{subject.Rejected(n, role), subject.Result(n, role)}
		msgs := make(chan *nats.Msg, 64)
		for _, subj := range append([]string{subject.Groups(n, role)}, answers...) {
			sub, err := c.nc.ChanSubscribe(subj, msgs)
			if err != nil {
				yield(nil, fmt.Errorf("groups of rollout %d: %w", n, err))
				return
			}
			defer func() { _ = sub.Unsubscribe() }()
		}
		seen := map[int]bool{}
		// named are the groups a message names delivered (a group message
		// those delivered up to it, a result that leaves them out every
		// one), in the order delivered; namedBy says which.
		var named []int
		namedBy := map[int]string{}
		name := func(by string, groups ...int) {
			for _, g := range groups {
				if namedBy[g] == "" {
					named, namedBy[g] = append(named, g), by
				}
			}
		}
		// give yields g unless it was; false: the caller stopped.
		give := func(g *schema.Group) bool {
			name(fmt.Sprintf("group %d's message", g.GroupIndex), g.Delivered...)
			if seen[g.GroupIndex] {
				return true
			}
			seen[g.GroupIndex] = true
			if err := c.groupFetched(ctx, n, role, g); err != nil {
				return yield(nil, groupsEnded(ctx, n, role, err))
			}
			return yield(g, nil)
		}
		// tell yields, once per message however often it is read, that
		// data on subj does not decode: an error in the place of its
		// group, and the stream goes on; false: the caller stopped.
		told := map[string]bool{}
		tell := func(subj string, data []byte, err error) bool {
			if told[string(data)] {
				return true
			}
			told[string(data)] = true
			return yield(nil, fmt.Errorf("%s: %w", subj, err))
		}
		// badGroup tells that group g's message does not decode, when err
		// (a read of it) says so; isBad: it did.
		badGroup := func(g int, err error) (isBad, more bool) {
			var bad *badMessage
			if !errors.As(err, &bad) {
				return false, true
			}
			seen[g] = true
			return true, tell(subject.Group(n, role, g), bad.data, bad.err)
		}
		// catchUp yields, from the stream, the delivered groups not yet
		// seen that the last group message names. While the rollout runs,
		// a group not read now (the server away, a follower behind) is
		// read on a later pass, or by finish. A last message that does
		// not decode names nothing: its group is told when read by its
		// own subject (named, or by finish). false: the caller stopped.
		catchUp := func() bool {
			data, err := c.lastResult(ctx, subject.Groups(n, role))
			if err != nil || data == nil {
				return true // none yet, or the server is away: later
			}
			var last schema.Group
			if schema.Unmarshal(data, &last) == nil {
				name(fmt.Sprintf("group %d's message", last.GroupIndex), last.Delivered...)
			}
			for i := 0; i < len(named); i++ {
				if seen[named[i]] {
					continue
				}
				g, err := c.lastGroup(ctx, n, role, named[i])
				if bad, more := badGroup(named[i], err); bad {
					if !more {
						return false
					}
					continue
				}
				switch {
				case err != nil:
					return true // the server is away: later
				case g == nil:
					continue // a follower behind: later
				}
				if !give(g) {
					return false
				}
			}
			return true
		}
		// finish yields, once the result is out, every delivered group not
		// seen. Those a message names delivered are there: each is read
		// until it is, or the stream ends with an error naming it.
		finish := func(r *schema.Result) {
			name("its result", r.DeliveredGroups...)
			name("its result", r.StreamedGroups...)
			var last []byte
			err := untilRead(ctx, fmt.Sprintf("the last %s group of rollout %d", role, n), func(ctx context.Context) (err error) {
				last, err = c.lastResult(ctx, subject.Groups(n, role))
				return err
			})
			if err != nil {
				yield(nil, groupsEnded(ctx, n, role, err))
				return
			}
			if last != nil {
				var g schema.Group
				if err := schema.Unmarshal(last, &g); err != nil {
					if !tell(subject.Groups(n, role), last, err) {
						return
					}
				} else {
					name(fmt.Sprintf("group %d's message", g.GroupIndex), g.Delivered...)
				}
			}
			for i := 0; i < len(named); i++ {
				if seen[named[i]] {
					continue
				}
				g, err := c.namedGroup(ctx, n, role, named[i], namedBy[named[i]])
				if bad, more := badGroup(named[i], err); bad {
					if !more {
						return
					}
					continue
				}
				if err != nil {
					yield(nil, groupsEnded(ctx, n, role, err))
					return
				}
				if !give(g) {
					return
				}
			}
			if len(r.DeliveredGroups) > 0 || len(r.StreamedGroups) > 0 {
				return // the result names every group delivered
			}
			// A result of a planact before streamed_groups: a group
			// published before one decided earlier than it is named by no
			// message read. Each other group of the result's tasks is
			// looked for once (a follower behind would hide it).
			probed := map[int]bool{}
			for _, t := range r.Tasks {
				gi := t.GroupIndex
				if seen[gi] || namedBy[gi] != "" || probed[gi] {
					continue
				}
				probed[gi] = true
				var g *schema.Group
				var bad error // a message that does not decode: no read mends it
				err := untilRead(ctx, fmt.Sprintf("group %d of rollout %d", gi, n), func(ctx context.Context) (err error) {
					if g, err = c.lastGroup(ctx, n, role, gi); err != nil && !errors.Is(err, errUnread) {
						bad, err = err, nil
					}
					return err
				})
				if isBad, more := badGroup(gi, bad); isBad {
					if !more {
						return
					}
					continue
				}
				switch {
				case err != nil:
					yield(nil, groupsEnded(ctx, n, role, err))
					return
				case g == nil:
					continue // not delivered, as far as any message says
				}
				if !give(g) {
					return
				}
			}
		}
		// over ends the stream when data, on subj, answers this client's
		// arrival: the result (finish), or a refusal. Read before the
		// groups, which a rollout that ended before the arrival (an
		// earlier one of the number) left: not the trainer's.
		over := func(subj string, data []byte) bool {
			r, err := answer(n, mine, subj, data)
			switch {
			case err != nil:
				yield(nil, err)
			case r == nil:
				return false // not known to answer this arrival
			case r.Rejected:
				yield(nil, fmt.Errorf("%w: rollout %d: %s", ErrRejected, n, r.Reason))
			default:
				finish(r)
			}
			return true
		}
		t := time.NewTicker(recheck)
		defer t.Stop()
		for {
			for _, subj := range answers {
				if data, err := c.lastResult(ctx, subj); err == nil && data != nil && over(subj, data) {
					return
				}
			}
			if !catchUp() {
				return
			}
			for waiting := true; waiting; {
				select {
				case m := <-msgs:
					if slices.Contains(answers, m.Subject) {
						if over(m.Subject, m.Data) {
							return
						}
						continue
					}
					var g schema.Group
					if err := schema.Unmarshal(m.Data, &g); err != nil {
						if !tell(m.Subject, m.Data, err) {
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
					yield(nil, groupsEnded(ctx, n, role, cause))
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

// groupsEnded is err, ending a stream of role's groups of rollout n:
// ErrTimeout too when ctx ended.
func groupsEnded(ctx context.Context, n int64, role string, err error) error {
	if expired(ctx) != nil {
		return fmt.Errorf("%w: rollout %d: %s groups: %w", ErrTimeout, n, role, err)
	}
	return err
}

package view

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// A training run keeps a day of history in the streams: thousands of
// rollouts of hundreds of episodes. The view keeps in memory what its lists
// need of every rollout (statuses, counts, rewards), and the texts of the
// turns and acts (prompts, outputs, observations, plans) only for the most
// recent finished rollouts and those still running. An older episode is
// read again from the streams when someone opens it.

// DefaultKeepFull is how many finished rollouts keep their episodes' texts
// in memory.
const DefaultKeepFull = 16

// compact drops the texts of the finished rollouts beyond the keep newest;
// their summaries stay exact.
func (s *state) compact(keep int) {
	var ended []*rolloutState
	for _, r := range s.rollouts {
		if r.result != nil && !r.compacted {
			ended = append(ended, r)
		}
	}
	if len(ended) <= keep {
		return
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].n > ended[j].n })
	for _, r := range ended[keep:] {
		r.compact()
	}
}

// compact keeps of r what its summary and its episodes' summaries need:
// each turn's number and when turn 1 was asked (an episode's wall time),
// each act's status (the counts), the episode ends.
func (r *rolloutState) compact() {
	for _, ep := range r.episodes {
		for t, ts := range ep.turns {
			ep.turns[t] = &turnState{turn: ts.turn, askedAt: ts.askedAt}
		}
		for k, a := range ep.acts {
			ep.acts[k] = &schema.ActDone{Status: a.Status}
		}
	}
	r.compacted = true
}

// episodeMessages are the subjects that hold episode e of rollout n, by
// stream (one filter each).
func episodeMessages(n int64, e int) map[string][]string {
	return map[string][]string{
		bus.StreamRollout: {fmt.Sprintf("rollout.%d.end.%d", n, e)},
		bus.StreamPlan: {
			fmt.Sprintf("plan.%d.req.%d", n, e), fmt.Sprintf("plan.%d.out.%d", n, e), fmt.Sprintf("plan.%d.dag.%d", n, e),
			fmt.Sprintf("plan.%d.answer.%d", n, e), fmt.Sprintf("plan.%d.error.%d", n, e),
		},
		bus.StreamAct: {fmt.Sprintf("act.%d.done.%d.>", n, e)},
	}
}

// reload reads episode e of rollout n again from the streams into a state
// of its own that carries what r knows of the rollout (tasks, config,
// start, result: what the episode's reward and statuses need).
func (r *Reader) reload(ctx context.Context, head *rolloutState, e int) (*rolloutState, error) {
	st := &state{rollouts: map[int64]*rolloutState{}}
	ro := st.rollout(head.n, head.arrivedAt)
	ro.tasks, ro.config, ro.start, ro.startedAt, ro.result, ro.resultAt = head.tasks, head.config, head.start, head.startedAt, head.result, head.resultAt
	for stream, subjects := range episodeMessages(head.n, e) {
		var msgs []bus.StoredMsg
		for _, subj := range subjects {
			if err := readSubject(ctx, r.nc, stream, subj, func(m bus.StoredMsg) { msgs = append(msgs, m) }); err != nil {
				return nil, fmt.Errorf("view: rollout %d episode %d: read %s again: %w", head.n, e, stream, err)
			}
		}
		slices.SortFunc(msgs, func(a, b bus.StoredMsg) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, m := range msgs {
			st.apply(m.Subject, m.Data, m.Time)
		}
	}
	return ro, nil
}

// readSubject hands fn every message of stream on subj (wildcards
// allowed), up to the last one stored when it was called, with direct gets.
func readSubject(ctx context.Context, nc *nats.Conn, stream, subj string, fn func(bus.StoredMsg)) error {
	last, err := bus.LastSeq(ctx, nc, stream, subj)
	if err != nil || last == 0 {
		return err // or the streams hold nothing of it (any more)
	}
	for next := uint64(1); next <= last; {
		b, err := bus.ReadBatch(ctx, nc, stream, subj, next, 256)
		if err != nil {
			return err
		}
		if len(b.Msgs) == 0 {
			// A replica behind the one that said what the last is.
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: the stream answered nothing from %d on, though it holds %d: %w", subj, next, last, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		for _, m := range b.Msgs {
			if m.Seq > last {
				return nil
			}
			fn(m)
			next = m.Seq + 1
		}
	}
	return nil
}

type epKey struct {
	n int64
	e int
}

// episodeCache remembers the last episodes read again, at most size.
type episodeCache struct {
	mu    sync.Mutex
	size  int
	order []epKey
	m     map[epKey]*Episode
}

func newEpisodeCache(size int) *episodeCache {
	return &episodeCache{size: size, m: map[epKey]*Episode{}}
}

func (c *episodeCache) get(k epKey) (*Episode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	return e, ok
}

func (c *episodeCache) put(k epKey, e *Episode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = e
	for len(c.order) > c.size {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}

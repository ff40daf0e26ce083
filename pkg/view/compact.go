package view

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// A training run keeps a day of history in the streams: thousands of
// rollouts of hundreds of episodes. The view keeps in memory its episodes
// (turns, plans, acts) and its task list only for a rollout still running
// and the most recently finished ones; of an older rollout, only its line
// in the list of rollouts. Its episode list, an episode of it and its
// tasks are read again from the streams when someone opens them. A rollout
// whose messages the streams no longer hold (they keep them for the
// ROLLOUT stream's max age) is let go of, and the view keeps at most
// MaxRollouts of them: its memory stays bounded however long it runs.

// DefaultKeepFull is how many finished rollouts keep their episodes in
// memory.
const DefaultKeepFull = 16

// DefaultMaxRollouts is how many rollouts the view keeps at most: a day of
// history at one rollout every nine seconds. Beyond it the oldest finished
// ones are let go of first.
const DefaultMaxRollouts = 10000

// readAgainTimeout bounds reading a rollout's episodes or tasks again for
// the callers that give no context of their own.
const readAgainTimeout = 30 * time.Second

// maintain compacts the finished rollouts that are due and lets go of the
// rollouts the view no longer keeps.
func (s *state) maintain() {
	s.compactDue()
	s.prune()
}

// readTo is the time up to which every stream the view follows has been
// read: a message stored before it has been read. all is true for a state
// that is given every message at once (a rollout read again, a test).
func (s *state) readTo() (to time.Time, all bool) {
	if s.marks == nil {
		return time.Time{}, true
	}
	first := true
	for _, t := range s.marks {
		if first || t.Before(to) {
			to, first = t, false
		}
	}
	return to, false
}

// mark says that stream has been read up to at: the time of the last
// message read, or now when a read found nothing more.
func (s *state) mark(stream string, at time.Time) {
	if s.marks != nil && at.After(s.marks[stream]) {
		s.marks[stream] = at
	}
}

// compactDue compacts the finished rollouts beyond the keepFull most
// recently finished, once every stream has been read past their results:
// the streams are read each on its own, so a rollout's acts, plans and
// arrivals may be read after its result; what comes later still (stored
// after the result) is counted in its line.
func (s *state) compactDue() {
	if s.keepFull <= 0 {
		return
	}
	to, all := s.readTo()
	for len(s.finished) > s.keepFull {
		r := s.finished[0]
		if !r.dropped && !all && r.resultAt.After(to) {
			return
		}
		s.finished[0] = nil
		s.finished = s.finished[1:]
		if !r.dropped {
			r.compact()
		}
	}
}

// compact keeps of r what its line in the list needs: the counts of its
// episodes and acts. Its episodes, and its task list, are read again from
// the streams when asked for.
func (r *rolloutState) compact() {
	r.counts = r.countEpisodes()
	r.episodes, r.tasks = nil, nil
	for _, a := range r.brought {
		a.tasks = nil
	}
	r.compacted = true
}

// prune lets go of rollouts: those whose last message is older than what
// the streams keep (they hold nothing of them any more; looked for at most
// once a second), and beyond maxRollouts the oldest, finished ones first.
func (s *state) prune() {
	if s.maxAge > 0 {
		if now := s.clock(); now.Sub(s.prunedAt) >= time.Second {
			s.prunedAt = now
			cutoff := now.Add(-s.maxAge)
			for _, r := range s.rollouts {
				if r.lastAt.Before(cutoff) {
					s.drop(r)
				}
			}
			for n, at := range s.gone {
				if at.Before(cutoff) {
					delete(s.gone, n)
				}
			}
		}
	}
	if s.maxRollouts <= 0 || len(s.rollouts) <= s.maxRollouts {
		return
	}
	rs := slices.Collect(maps.Values(s.rollouts))
	slices.SortFunc(rs, func(a, b *rolloutState) int {
		if fa, fb := a.result != nil, b.result != nil; fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.n, b.n)
	})
	// An eighth below the bound, so that the sort is not done again for
	// every new rollout.
	if s.gone == nil {
		s.gone = map[int64]time.Time{}
	}
	for _, r := range rs[:len(rs)-s.maxRollouts+s.maxRollouts/8] {
		s.drop(r)
		// What is read of it later (a stream read behind the others) must
		// not bring it back.
		s.gone[r.n] = r.lastAt
	}
	// Those remembered are bounded too (beyond the history's age they are
	// forgotten anyway): the oldest go first.
	if bound := max(4*s.maxRollouts, 4096); len(s.gone) > bound {
		ns := slices.Sorted(maps.Keys(s.gone))
		for _, n := range ns[:len(ns)-bound/2] {
			delete(s.gone, n)
		}
	}
}

func (s *state) drop(r *rolloutState) {
	delete(s.rollouts, r.n)
	r.dropped = true
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

// listMessages are the subjects that hold what rollout n's list of
// episodes needs: their ends, their turns' requests (when each began) and
// their acts' outcomes.
func listMessages(n int64) map[string][]string {
	return map[string][]string{
		bus.StreamRollout: {fmt.Sprintf("rollout.%d.end.*", n)},
		bus.StreamPlan:    {fmt.Sprintf("plan.%d.req.*", n)},
		bus.StreamAct:     {fmt.Sprintf("act.%d.done.>", n)},
	}
}

// head copies, under the lock, what reading rollout r again needs.
func (r *rolloutState) head() *rolloutState {
	h := &rolloutState{n: r.n, arrivedAt: r.arrivedAt, tasks: r.tasks, config: r.config, start: r.start, startedAt: r.startedAt,
		result: r.result, resultAt: r.resultAt, compacted: r.compacted, rev: r.rev}
	if r.tasksFrom != nil {
		a := *r.tasksFrom
		a.tasks = nil
		h.tasksFrom = &a
	}
	return h
}

// reload reads the messages of rollout head.n on subjects again from the
// streams into a state of its own that carries what the view knows of the
// rollout (tasks, config, start, result: what rewards and statuses need).
func (r *Reader) reload(ctx context.Context, head *rolloutState, subjects map[string][]string) (*rolloutState, error) {
	tasks := head.tasks
	if head.compacted {
		var err error
		if tasks, err = r.tasksOf(ctx, head); err != nil {
			return nil, err
		}
	}
	st := &state{rollouts: map[int64]*rolloutState{}}
	ro := st.rollout(head.n, head.arrivedAt)
	ro.tasks, ro.config, ro.start, ro.startedAt, ro.result, ro.resultAt = tasks, head.config, head.start, head.startedAt, head.result, head.resultAt
	for stream, subjs := range subjects {
		var msgs []bus.StoredMsg
		for _, subj := range subjs {
			if err := readSubject(ctx, r.nc, stream, subj, func(m bus.StoredMsg) { msgs = append(msgs, m) }); err != nil {
				return nil, fmt.Errorf("view: rollout %d: read %s again: %w", head.n, stream, err)
			}
		}
		slices.SortFunc(msgs, func(a, b bus.StoredMsg) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, m := range msgs {
			st.apply(m)
		}
	}
	return ro, nil
}

// tasksOf reads the task list of a compacted rollout again: from the
// arrival that brought it, on its trainer's stream (or the object store it
// names). nil when the streams no longer hold it.
func (r *Reader) tasksOf(ctx context.Context, head *rolloutState) ([]schema.Task, error) {
	a := head.tasksFrom
	if a == nil {
		return nil, nil
	}
	key := cacheKey{n: head.n}
	if tasks, ok := r.taskLists.get(key); ok {
		return tasks, nil
	}
	var tasks []schema.Task
	if a.object != "" {
		var err error
		if tasks, err = loadTasks(ctx, r.nc, a.role, a.object, a.sha); err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("view: rollout %d: read its task list again: %w", head.n, err)
		}
	} else {
		b, err := bus.ReadBatch(ctx, r.nc, bus.StreamTrainer(a.role), subject.Arrive(head.n, a.role), a.seq, 1)
		if err != nil {
			return nil, fmt.Errorf("view: rollout %d: read its %s arrival again: %w", head.n, a.role, err)
		}
		var m schema.Arrive
		if len(b.Msgs) == 1 && b.Msgs[0].Seq == a.seq && decodeArrival(b.Msgs[0], &m) == nil {
			tasks = m.Tasks
		}
	}
	r.taskLists.put(key, tasks)
	return tasks, nil
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

// cacheKey names what was read again of a rollout: its episode list (e
// -1), an episode, or its tasks, as of its rev.
type cacheKey struct {
	n   int64
	e   int
	rev int
}

// cache remembers the last values put, at most size.
type cache[V any] struct {
	mu    sync.Mutex
	size  int
	order []cacheKey
	m     map[cacheKey]V
}

func newCache[V any](size int) *cache[V] {
	return &cache[V]{size: size, m: map[cacheKey]V{}}
}

func (c *cache[V]) get(k cacheKey) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *cache[V]) put(k cacheKey, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok {
		c.order = append(c.order, k)
	}
	c.m[k] = v
	for len(c.order) > c.size {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}

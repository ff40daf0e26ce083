package view

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// episodeMessages are the subjects that hold episode e of rollout n, by stream.
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
		err := readSubjects(ctx, r.js, stream, subjects, func(m jetstream.Msg, at time.Time) {
			st.apply(m.Subject(), m.Data(), at)
		})
		if err != nil {
			return nil, fmt.Errorf("view: rollout %d episode %d: read %s again: %w", head.n, e, stream, err)
		}
	}
	return ro, nil
}

// readSubjects hands fn every message of stream on subjects, up to the last
// one stored when it was called, with an ordered consumer that it removes.
func readSubjects(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, fn func(m jetstream.Msg, at time.Time)) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	var last uint64
	for _, subj := range subjects {
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		last = max(last, m.Sequence)
	}
	if last == 0 {
		return nil // the streams hold nothing of it (any more)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: subjects, InactiveThreshold: 30 * time.Second})
	if err != nil {
		return err
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.DeleteConsumer(dctx, info.Name)
		}
	}()
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		fn(m, md.Timestamp)
		if md.Sequence.Stream >= last {
			return nil
		}
	}
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

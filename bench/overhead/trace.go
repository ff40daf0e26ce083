package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// The stored times the latency figures come from are the JetStream
// metadata timestamps of the messages (when the stream stored them), read
// back after a run with ordered consumers.

type epKey struct {
	n int64
	e int
}

type turnTrace struct {
	req, out  time.Time
	plannerMs int64 // the planner engine's latency_ms of the turn's plan.out
	dag       *plan.Plan
	dagAt     time.Time // when the turn's plan.dag was stored: its roots could run from then
}

type actTrace struct {
	turn      int
	done      time.Time // when its act.done was stored
	engineMs  int64
	generated bool // the actor engine ran (not cached, not failed before)
}

type episodeTrace struct {
	turns map[int]*turnTrace
	acts  map[string]*actTrace
	end   time.Time
}

// traces are the episodes of a range of rollouts, as their streams hold them.
type traces struct {
	episodes map[epKey]*episodeTrace
	starts   map[int64]time.Time // rollout.N.start
}

// lastSeqs is the last sequence of every stream.
func lastSeqs(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	out := map[string]uint64{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = info.State.LastSeq
	}
	if err := l.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, err
	}
	return out, nil
}

// readTraces reads what ROLLOUT, PLAN and ACT stored after the sequences
// in before, for rollouts first..last.
func readTraces(ctx context.Context, js jetstream.JetStream, before map[string]uint64, first, last int64) (*traces, error) {
	t := &traces{episodes: map[epKey]*episodeTrace{}, starts: map[int64]time.Time{}}
	ep := func(n int64, e int) *episodeTrace {
		k := epKey{n, e}
		if t.episodes[k] == nil {
			t.episodes[k] = &episodeTrace{turns: map[int]*turnTrace{}, acts: map[string]*actTrace{}}
		}
		return t.episodes[k]
	}
	turn := func(x *episodeTrace, turn int) *turnTrace {
		if x.turns[turn] == nil {
			x.turns[turn] = &turnTrace{}
		}
		return x.turns[turn]
	}
	act := func(x *episodeTrace, key string) *actTrace {
		if x.acts[key] == nil {
			x.acts[key] = &actTrace{}
		}
		return x.acts[key]
	}
	for _, stream := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct} {
		err := readStream(ctx, js, stream, before[stream]+1, func(m jetstream.Msg, at time.Time) error {
			p, err := subject.Parse(m.Subject())
			if err != nil || p.Rollout < first || p.Rollout > last {
				return nil
			}
			tn, _ := strconv.Atoi(m.Headers().Get(schema.HdrTurn))
			switch p.Domain + "." + p.Verb {
			case "rollout.start":
				if _, ok := t.starts[p.Rollout]; !ok {
					t.starts[p.Rollout] = at
				}
			case "rollout.end":
				if x := ep(p.Rollout, p.Episode); x.end.IsZero() {
					x.end = at
				}
			case "plan.req":
				if tt := turn(ep(p.Rollout, p.Episode), tn); tt.req.IsZero() {
					tt.req = at
				}
			case "plan.out":
				tt := turn(ep(p.Rollout, p.Episode), tn)
				if tt.out.IsZero() {
					var out schema.PlanOutput
					if err := schema.Unmarshal(m.Data(), &out); err != nil {
						return fmt.Errorf("%s: %w", m.Subject(), err)
					}
					tt.out, tt.plannerMs = at, out.LatencyMs
				}
			case "plan.dag":
				var d schema.PlanDAG
				if err := schema.Unmarshal(m.Data(), &d); err != nil {
					return fmt.Errorf("%s: %w", m.Subject(), err)
				}
				if tt := turn(ep(p.Rollout, p.Episode), d.Turn); !d.Partial && tt.dag == nil {
					tt.dag, tt.dagAt = &d.Plan, at
				}
			case "act.done":
				a := act(ep(p.Rollout, p.Episode), p.Node)
				if a.done.IsZero() {
					var d schema.ActDone
					if err := schema.Unmarshal(m.Data(), &d); err != nil {
						return fmt.Errorf("%s: %w", m.Subject(), err)
					}
					a.done, a.turn = at, d.Turn
					if d.Generation != nil {
						a.generated, a.engineMs = true, d.Generation.LatencyMs
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", stream, err)
		}
	}
	return t, nil
}

// readStream hands every message of stream from sequence from on to fn,
// with its stored time, up to the stream's last sequence when called.
// (Not NumPending == 0: on a cluster the first message an ordered consumer
// delivers may say so while the stream holds many more.)
func readStream(ctx context.Context, js jetstream.JetStream, stream string, from uint64, fn func(m jetstream.Msg, at time.Time) error) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	to := info.State.LastSeq
	if to < from {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return err
	}
	it, err := c.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextMaxWait(5 * time.Second))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			// The messages up to to were deleted since (time-out
			// schedules are purged when a rollout ends): nothing more.
			return nil
		}
		if err != nil {
			return err
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if md.Sequence.Stream > to {
			return nil
		}
		if err := fn(m, md.Timestamp); err != nil {
			return err
		}
		if md.Sequence.Stream == to {
			return nil
		}
	}
}

// addedPerAct is, for every act the actor engine ran, the time from the
// moment it could run (its turn's plan.dag stored, for a root; its last
// dependency's act.done stored, otherwise) to its own act.done being
// stored, less the engine's latency: everything planact did for it —
// delivery to a dispatcher, release, the gateway, the record of its end.
func (t *traces) addedPerAct() []float64 {
	var out []float64
	for _, x := range t.episodes {
		for n, tt := range x.turns {
			if tt.dag == nil {
				continue
			}
			for _, node := range tt.dag.Nodes {
				a := x.acts[subject.NodeKey(n, node.ID)]
				if a == nil || !a.generated || a.done.IsZero() {
					continue
				}
				ready, known := tt.dagAt, true
				for _, d := range node.Deps {
					da := x.acts[subject.NodeKey(n, d)]
					if da == nil || da.done.IsZero() {
						known = false
						break
					}
					if da.done.After(ready) {
						ready = da.done
					}
				}
				if known {
					out = append(out, ms(a.done.Sub(ready))-float64(a.engineMs))
				}
			}
		}
	}
	return out
}

// meanActEngineMs is the mean latency_ms of the acts the actor engine ran.
func (t *traces) meanActEngineMs() float64 {
	var v []float64
	for _, x := range t.episodes {
		for _, a := range x.acts {
			if a.generated {
				v = append(v, float64(a.engineMs))
			}
		}
	}
	return mean(v)
}

// addedPerTurn is, for every turn, the time from its plan.out to the next
// turn's plan.req (or the episode's end) being stored, less the longest
// engine latency of its acts; split into turns whose plan ran acts (the
// next plan.req) and turns that ended the episode (its end).
func (t *traces) addedPerTurn() (all, acting, final []float64) {
	for _, x := range t.episodes {
		longest := map[int]int64{}
		for _, a := range x.acts {
			if a.generated {
				longest[a.turn] = max(longest[a.turn], a.engineMs)
			}
		}
		for n, tt := range x.turns {
			if tt.out.IsZero() {
				continue
			}
			if nt := x.turns[n+1]; nt != nil && !nt.req.IsZero() {
				v := ms(nt.req.Sub(tt.out)) - float64(longest[n])
				all, acting = append(all, v), append(acting, v)
			} else if !x.end.IsZero() {
				v := ms(x.end.Sub(tt.out)) - float64(longest[n])
				all, final = append(all, v), append(final, v)
			}
		}
	}
	return all, acting, final
}

// barriers is, for every rollout, the time from the second arrival's
// acknowledgement at the client to its rollout.N.start being stored.
func (t *traces) barriers(acks map[int64]time.Time) []float64 {
	var out []float64
	for n, ack := range acks {
		if st, ok := t.starts[n]; ok {
			out = append(out, ms(st.Sub(ack)))
		}
	}
	return out
}

// eager is, for every episode, its makespan (first plan.req to its end)
// over its critical path: the sum over its turns of the planner's latency
// and the longest path through the turn's plan, each act weighted by its
// engine latency.
func (t *traces) eager() (ratios, makespans, critical []float64) {
	for _, x := range t.episodes {
		first := time.Time{}
		for _, tt := range x.turns {
			if !tt.req.IsZero() && (first.IsZero() || tt.req.Before(first)) {
				first = tt.req
			}
		}
		if first.IsZero() || x.end.IsZero() {
			continue
		}
		var path int64
		for n, tt := range x.turns {
			path += tt.plannerMs
			if tt.dag != nil {
				path += longestPath(tt.dag, func(id string) int64 {
					if a := x.acts[subject.NodeKey(n, id)]; a != nil && a.generated {
						return a.engineMs
					}
					return 0
				})
			}
		}
		if path <= 0 {
			continue
		}
		span := ms(x.end.Sub(first))
		ratios = append(ratios, span/float64(path))
		makespans = append(makespans, span)
		critical = append(critical, float64(path))
	}
	return ratios, makespans, critical
}

// longestPath is the heaviest chain of dependencies through p.
func longestPath(p *plan.Plan, weight func(id string) int64) int64 {
	deps := map[string][]string{}
	for _, n := range p.Nodes {
		deps[n.ID] = n.Deps
	}
	memo := map[string]int64{}
	var finish func(id string, depth int) int64
	finish = func(id string, depth int) int64 {
		if v, ok := memo[id]; ok || depth > len(p.Nodes) {
			return v // a validated plan has no cycle; the depth guard only stops a bad one
		}
		var before int64
		for _, d := range deps[id] {
			before = max(before, finish(d, depth+1))
		}
		memo[id] = before + weight(id)
		return memo[id]
	}
	var longest int64
	for _, n := range p.Nodes {
		longest = max(longest, finish(n.ID, 0))
	}
	return longest
}

// dumpRollout writes what the streams and the KV buckets hold of rollout
// n, for a rollout that failed or hung: where it stopped.
func dumpRollout(ctx context.Context, js jetstream.JetStream, w io.Writer, n int64) error {
	fmt.Fprintf(w, "rollout %d failed; what the streams hold of it (stored time, stream, sequence, subject, turn):\n", n)
	for stream, filter := range map[string]string{bus.StreamRollout: "rollout.%d.>", bus.StreamPlan: "plan.%d.>", bus.StreamAct: "act.%d.>"} {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{fmt.Sprintf(filter, n)}})
		if err != nil {
			return err
		}
		it, err := c.Messages()
		if err != nil {
			return err
		}
		for {
			m, err := it.Next(jetstream.NextMaxWait(2 * time.Second))
			if err != nil {
				break
			}
			md, err := m.Metadata()
			if err != nil {
				break
			}
			fmt.Fprintf(w, "  %s  %-7s %8d  %s  turn %s\n", md.Timestamp.Format("15:04:05.000000"), stream, md.Sequence.Stream, m.Subject(), m.Headers().Get(schema.HdrTurn))
			if md.NumPending == 0 {
				break
			}
		}
		it.Stop()
	}
	for _, bucket := range []string{bus.BucketSession, bus.BucketRuns} {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		keys, err := kv.ListKeysFiltered(ctx, fmt.Sprint(n), fmt.Sprintf("%d.>", n))
		if err != nil {
			return err
		}
		for k := range keys.Keys() {
			if strings.HasSuffix(k, ".tasks") {
				continue
			}
			e, err := kv.Get(ctx, k)
			if err != nil {
				fmt.Fprintf(w, "  kv %s/%s: %v\n", bucket, k, err)
				continue
			}
			var v any
			if err := schema.Unmarshal(e.Value(), &v); err != nil {
				fmt.Fprintf(w, "  kv %s/%s (revision %d): %d bytes, %v\n", bucket, k, e.Revision(), len(e.Value()), err)
				continue
			}
			data, _ := json.Marshal(v)
			fmt.Fprintf(w, "  kv %s/%s (revision %d): %s\n", bucket, k, e.Revision(), data)
		}
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// Baselines are raw NATS/JetStream on the same server(s), no planact code.
type Baselines struct {
	PubSub   PubSub   `json:"publish_consume"`
	CAS      CAS      `json:"kv_cas"`
	Requests Requests `json:"request_reply"`
}

// PubSub is baseline 1: an async publisher with a bounded number in
// flight and a pull consumer (Consume, explicit ack) running at once on a
// file stream of their own.
type PubSub struct {
	MessageBytes int       `json:"message_bytes"` // the msgpack size of a realistic act.done
	Messages     int       `json:"messages"`      // per repeat
	InFlight     int       `json:"in_flight"`
	Replicas     int       `json:"replicas"`
	Values       []float64 `json:"msgs_per_s"` // one per repeat: messages / (first publish → last message consumed)
	Median       float64   `json:"median_msgs_per_s"`
	Stalls       []string  `json:"stalls,omitempty"` // repeats run again because they stalled
}

// errStalled is a publish+consume repeat that made no progress for a while.
var errStalled = errors.New("stalled")

// CAS is baseline 2: sequential Update(key, value, lastRevision) on one key.
type CAS struct {
	Ops        int     `json:"ops"`
	ValueBytes int     `json:"value_bytes"`
	Replicas   int     `json:"replicas"`
	OpsPerS    float64 `json:"ops_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
}

// Requests is baseline 3: a core NATS round trip to a trivial responder on
// another connection.
type Requests struct {
	Requests int     `json:"requests"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
}

// realisticAct is an act's stored message as the act-dispatcher publishes
// it: the act.done of a search that the actor model ran (a few dozen
// tokens with their log-probs).
func realisticAct() ([]byte, error) {
	prompt, ids := make([]int, 96), make([]int, 48)
	lps := make([]float64, 48)
	for i := range prompt {
		prompt[i] = 500 + i*11
	}
	for i := range ids {
		ids[i], lps[i] = 1000+i*37, -0.05*float64(i%7)
	}
	now := time.Now().UnixMilli()
	return schema.Marshal(&schema.ActDone{
		Rollout: 1234, Episode: 37, Turn: 2, Key: "t2-s2", NodeID: "s2", Tool: "search",
		Input: "population of Addis Ababa", Status: schema.ActDoneOK, Output: "Addis Ababa has about 3.9 million inhabitants.",
		Attempts: 1, Generation: &schema.Generation{Prompt: "Search: population of Addis Ababa", PromptIDs: prompt, Text: "Addis Ababa has about 3.9 million inhabitants.", OutputIDs: ids, LogProbs: lps, FinishReason: "stop", LatencyMs: 12, WeightVersion: "7"},
		ReleasedMs: now, StartedMs: now, EndedMs: now + 12, Replica: "act-dispatcher-0",
	})
}

func dial(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := bus.ConnOptions{URL: url}.Dial(name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func runBaselines(ctx context.Context, o options, s *servers, p *progress) (*Baselines, error) {
	var b Baselines
	act, err := realisticAct()
	if err != nil {
		return nil, err
	}
	b.PubSub = PubSub{MessageBytes: len(act), Messages: o.PubMessages, InFlight: o.PubInFlight, Replicas: s.replicas}
	for i := range o.PubRepeats {
		// A repeat that stalls (on a cluster just started, a consumer
		// whose pulls go unanswered) is run again, on a fresh stream, and
		// said; three stalls in a row fail the run.
		var v float64
		for attempt := 0; ; attempt++ {
			v, err = pubSubOnce(ctx, s, act, o.PubMessages, o.PubInFlight, fmt.Sprintf("%d_%d", i, attempt))
			if err == nil || !errors.Is(err, errStalled) || attempt == 2 {
				break
			}
			b.PubSub.Stalls = append(b.PubSub.Stalls, err.Error())
			p.say("baseline 1: repeat %d: %v; again, on a fresh stream", i+1, err)
		}
		if err != nil {
			return nil, fmt.Errorf("baseline publish+consume: %w", err)
		}
		b.PubSub.Values = append(b.PubSub.Values, v)
		p.say("baseline 1: publish+consume %d × %d B: %.0f msg/s", o.PubMessages, len(act), v)
	}
	b.PubSub.Median = median(b.PubSub.Values)
	if b.CAS, err = casBaseline(ctx, s, act, o.KVOps); err != nil {
		return nil, fmt.Errorf("baseline kv compare-and-set: %w", err)
	}
	p.say("baseline 2: kv compare-and-set: %.0f ops/s, p50 %.3f ms, p99 %.3f ms", b.CAS.OpsPerS, b.CAS.P50Ms, b.CAS.P99Ms)
	if b.Requests, err = requestBaseline(ctx, s, o.Requests); err != nil {
		return nil, fmt.Errorf("baseline request/reply: %w", err)
	}
	p.say("baseline 3: request/reply: p50 %.3f ms, p99 %.3f ms", b.Requests.P50Ms, b.Requests.P99Ms)
	return &b, nil
}

// pubSubOnce publishes n messages asynchronously (at most inFlight
// unacknowledged) while a pull consumer on another connection consumes and
// acks them, and returns messages per second from the first publish to the
// last message consumed. Each repeat has a fresh stream.
func pubSubOnce(ctx context.Context, s *servers, data []byte, n, inFlight int, round string) (float64, error) {
	pnc, _, err := dial(s.clientURL, "overhead-baseline-publisher")
	if err != nil {
		return 0, err
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc, jetstream.WithPublishAsyncMaxPending(inFlight))
	if err != nil {
		return 0, err
	}
	cnc, cjs, err := dial(s.serviceURL, "overhead-baseline-consumer")
	if err != nil {
		return 0, err
	}
	defer cnc.Close()
	name := "BENCH_PUBSUB_" + round
	subj := "bench.pubsub." + round
	stream, err := cjs.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subj}, Storage: jetstream.FileStorage, Replicas: s.replicas,
	})
	if err != nil {
		return 0, err
	}
	defer cjs.DeleteStream(context.WithoutCancel(ctx), name)
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return 0, err
	}
	var got atomic.Int64
	var lastErr atomic.Value
	done := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := m.Ack(); err != nil {
			return
		}
		if got.Add(1) == int64(n) {
			close(done)
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { lastErr.Store(err.Error()) }))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	start := time.Now()
	for range n {
		if _, err := pjs.PublishAsync(subj, data, jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, err
		}
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, errors.New("publishes not acknowledged after 5 minutes")
	}
	// Wait while the consumer makes progress.
	seen := int64(0)
	for {
		select {
		case <-done:
			return float64(n) / time.Since(start).Seconds(), nil
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Second):
		}
		if now := got.Load(); now > seen {
			seen = now
			continue
		}
		return 0, fmt.Errorf("%w: consumed %d of %d messages, none in 10s (last consume error: %v)", errStalled, seen, n, lastErr.Load())
	}
}

// casBaseline updates one key of a bucket like planact's (file storage,
// history 1) by compare-and-set, one update after the other.
func casBaseline(ctx context.Context, s *servers, value []byte, ops int) (CAS, error) {
	r := CAS{Ops: ops, ValueBytes: len(value), Replicas: s.replicas}
	nc, js, err := dial(s.serviceURL, "overhead-baseline-kv")
	if err != nil {
		return r, err
	}
	defer nc.Close()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BENCH_CAS", History: 1, Storage: jetstream.FileStorage, Replicas: s.replicas})
	if err != nil {
		return r, err
	}
	defer js.DeleteKeyValue(context.WithoutCancel(ctx), "BENCH_CAS")
	rev, err := kv.Create(ctx, "run", value)
	if err != nil {
		return r, err
	}
	for range min(100, ops) { // warm up
		if rev, err = kv.Update(ctx, "run", value, rev); err != nil {
			return r, err
		}
	}
	lat := make([]float64, 0, ops)
	start := time.Now()
	for range ops {
		t := time.Now()
		if rev, err = kv.Update(ctx, "run", value, rev); err != nil {
			return r, err
		}
		lat = append(lat, ms(time.Since(t)))
	}
	r.OpsPerS = float64(ops) / time.Since(start).Seconds()
	r.P50Ms, r.P99Ms = percentile(lat, 50), percentile(lat, 99)
	return r, nil
}

// requestBaseline times core NATS requests to a responder that answers at
// once, on another connection (on a cluster, another node).
func requestBaseline(ctx context.Context, s *servers, n int) (Requests, error) {
	r := Requests{Requests: n}
	rnc, _, err := dial(s.serviceURL, "overhead-baseline-responder")
	if err != nil {
		return r, err
	}
	defer rnc.Close()
	sub, err := rnc.Subscribe("bench.rr", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		return r, err
	}
	defer sub.Unsubscribe()
	if err := rnc.Flush(); err != nil {
		return r, err
	}
	qnc, _, err := dial(s.clientURL, "overhead-baseline-requester")
	if err != nil {
		return r, err
	}
	defer qnc.Close()
	payload := []byte("ping")
	// On a cluster the interest takes a moment to cross the routes.
	for i := 0; ; i++ {
		if _, err := qnc.RequestWithContext(ctx, "bench.rr", payload); err == nil {
			break
		} else if i > 500 {
			return r, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range min(200, n) {
		if _, err := qnc.RequestWithContext(ctx, "bench.rr", payload); err != nil {
			return r, err
		}
	}
	lat := make([]float64, 0, n)
	for range n {
		t := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := qnc.RequestWithContext(rctx, "bench.rr", payload)
		cancel()
		if err != nil {
			return r, err
		}
		lat = append(lat, ms(time.Since(t)))
	}
	r.P50Ms, r.P99Ms = percentile(lat, 50), percentile(lat, 99)
	return r, nil
}

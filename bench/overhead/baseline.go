package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/bench/internal/rawjs"
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
func realisticAct() ([]byte, error) { return rawjs.Act(96, 48) }

func dial(url, name string) (*nats.Conn, jetstream.JetStream, error) { return rawjs.Dial(url, name) }

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
			if err == nil || !errors.Is(err, rawjs.ErrStalled) || attempt == 2 {
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

// pubSubOnce is one publish+consume repeat on a fresh stream: messages
// per second from the first publish to the last message consumed.
func pubSubOnce(ctx context.Context, s *servers, data []byte, n, inFlight int, round string) (float64, error) {
	return rawjs.PublishConsume(ctx, rawjs.PubSub{PublishURL: s.clientURL, ConsumeURL: s.serviceURL, Data: data,
		Messages: n, InFlight: inFlight, Replicas: s.replicas, Round: round})
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

// Package rawjs measures raw JetStream on a server, with no planact code in
// the path: the baseline that the benchmarks divide planact's figures by,
// measured in the same run because the machines they run on are shared.
package rawjs

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

// ErrStalled is a publish+consume run that made no progress for a while.
var ErrStalled = errors.New("stalled")

// Act is an act's stored message as the act-dispatcher publishes it: the
// act.done of a search that the actor model ran, with promptTokens prompt
// ids and outputTokens output ids and their log-probs.
func Act(promptTokens, outputTokens int) ([]byte, error) {
	prompt, ids := make([]int, promptTokens), make([]int, outputTokens)
	lps := make([]float64, outputTokens)
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

// Dial connects to url as name, with a JetStream context.
func Dial(url, name string) (*nats.Conn, jetstream.JetStream, error) {
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

// PubSub says what one publish+consume run does.
type PubSub struct {
	PublishURL string // the publisher's server
	ConsumeURL string // the consumer's server (on a cluster, another node)
	Data       []byte // each message
	Messages   int
	InFlight   int // unacknowledged publishes at most
	Replicas   int // of the run's stream
	// Round names the run's stream (BENCH_PUBSUB_<round>), fresh each run.
	Round string
}

// PublishConsume publishes o.Messages messages asynchronously (at most
// o.InFlight unacknowledged) while a pull consumer on another connection
// consumes and acks them, on a file stream of its own that it deletes after,
// and returns messages per second from the first publish to the last message
// consumed. A run that makes no progress for 10 s fails with ErrStalled.
func PublishConsume(ctx context.Context, o PubSub) (float64, error) {
	pnc, _, err := Dial(o.PublishURL, "bench-raw-publisher")
	if err != nil {
		return 0, err
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc, jetstream.WithPublishAsyncMaxPending(o.InFlight))
	if err != nil {
		return 0, err
	}
	cnc, cjs, err := Dial(o.ConsumeURL, "bench-raw-consumer")
	if err != nil {
		return 0, err
	}
	defer cnc.Close()
	name := "BENCH_PUBSUB_" + o.Round
	subj := "bench.pubsub." + o.Round
	stream, err := cjs.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subj}, Storage: jetstream.FileStorage, Replicas: max(o.Replicas, 1),
	})
	if err != nil {
		return 0, err
	}
	defer cjs.DeleteStream(context.WithoutCancel(ctx), name)
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return 0, err
	}
	n := o.Messages
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
		if _, err := pjs.PublishAsync(subj, o.Data, jetstream.WithStallWait(30*time.Second)); err != nil {
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
		return 0, fmt.Errorf("%w: consumed %d of %d messages, none in 10s (last consume error: %v)", ErrStalled, seen, n, lastErr.Load())
	}
}

package bus

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// answersLate is JetStream that answers no consumer lookup before at: a
// JetStream away, from this service, until then.
type answersLate struct {
	jetstream.JetStream
	at   time.Time
	cons jetstream.Consumer
}

func (a *answersLate) Consumer(context.Context, string, string) (jetstream.Consumer, error) {
	if time.Now().Before(a.at) {
		return nil, fmt.Errorf("consumer info: %w", nats.ErrTimeout)
	}
	return a.cons, nil
}

// TestConsumeOutwaitsJetStreamAway: a service opening its consumer while
// JetStream does not answer keeps asking until it does, however long that
// is, or until it is stopped. It gave up after provisioning's patience (a
// minute): Consume failed and the service stopped, for an outage it would
// have outlived.
func TestConsumeOutwaitsJetStreamAway(t *testing.T) {
	b, _ := provisionedBus(t)
	c := Consumer{Stream: StreamRollout, Durable: "patient", Filters: []string{"rollout.*.status"}}
	if err := b.EnsureConsumer(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	cons, err := b.JS.Consumer(context.Background(), c.Stream, c.Durable)
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		away := 3 * provisionPatience
		js := &answersLate{at: time.Now().Add(away), cons: cons}
		late := &Bus{JS: js, Log: zerolog.Nop()}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		if _, err := late.openConsumer(ctx, c); err != nil {
			t.Fatalf("JetStream away for %v: %v", away, err)
		}
		if time.Now().Before(js.at) {
			t.Fatal("opened a consumer JetStream did not answer for")
		}
		// Stopped, it stops waiting.
		js.at = time.Now().Add(24 * time.Hour)
		stopped, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		began := time.Now()
		if _, err := late.openConsumer(stopped, c); err == nil {
			t.Fatal("opened a consumer JetStream never answered for")
		}
		if waited := time.Since(began); waited != 10*time.Minute {
			t.Errorf("waited %v for JetStream, want until stopped (10m)", waited)
		}
	})
}

// endsAtOnce is a bucket whose every watch ends as soon as it began.
type endsAtOnce struct {
	jetstream.KeyValue
	watches []time.Time
	enough  func()
}

func (e *endsAtOnce) Bucket() string { return "ends" }

func (e *endsAtOnce) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	e.watches = append(e.watches, time.Now())
	if len(e.watches) == 100 {
		e.enough() // a Follow that spins
	}
	ch := make(chan jetstream.KeyValueEntry, 1)
	ch <- nil // replayed: no keys
	close(ch)
	return endedWatch(ch), nil
}

type endedWatch <-chan jetstream.KeyValueEntry

func (w endedWatch) Updates() <-chan jetstream.KeyValueEntry { return w }
func (endedWatch) Stop() error                               { return nil }

// TestFollowBacksOffAWatchThatKeepsEnding: a watch that ends is started
// again a second later, and later each time it ends again at once, up to
// 30 s. It was started again at once: a watch that kept ending spun.
func TestFollowBacksOffAWatchThatKeepsEnding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		kv := &endsAtOnce{enough: cancel}
		replays := 0
		(&Bucket{KeyValue: kv}).Follow(ctx, zerolog.Nop(), func(jetstream.KeyValueEntry) {}, func(map[string]bool) { replays++ })
		var gaps []time.Duration
		for i := 1; i < len(kv.watches); i++ {
			gaps = append(gaps, kv.watches[i].Sub(kv.watches[i-1]))
		}
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
		if fmt.Sprint(gaps) != fmt.Sprint(want) {
			t.Errorf("%d watches in 2 minutes, apart by %v; want apart by %v", len(kv.watches), gaps, want)
		}
		if replays != len(kv.watches) {
			t.Errorf("%d replays for %d watches", replays, len(kv.watches))
		}
	})
}

// pullerOn is a puller of a consumer that JetStream holds, with slots
// slots, whose handler hands each message to handled and waits for
// release.
func pullerOn(t *testing.T, b *Bus, durable string, slots int, handled chan<- *nats.Msg, release <-chan struct{}) *puller {
	t.Helper()
	c := Consumer{Stream: "PULLED", Durable: durable, AckWait: 30 * time.Second, Slots: NewSlots(slots)}
	if err := b.EnsureConsumer(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return newPuller(b, c.withDefaults(), func(m *nats.Msg) {
		handled <- m
		<-release
		_ = ack(b.NC, m, ackAck)
	})
}

func pulledStream(t *testing.T, b *Bus, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := b.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "PULLED", Subjects: []string{"pulled.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := b.JS.Publish(ctx, fmt.Sprintf("pulled.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestALateMessageTakesNoSlotAskedFor: a message of a request forgotten
// (at a reconnect) that arrives on its way out is handled only in a slot
// the open requests may not fill. It counted the handlers alone: with
// the one slot asked for again, the late message took it, the message
// asked for came too, and two handlers ran in one slot.
func TestALateMessageTakesNoSlotAskedFor(t *testing.T) {
	b, _ := provisionedBus(t)
	pulledStream(t, b, 0)
	handled := make(chan *nats.Msg, 4)
	release := make(chan struct{})
	p := pullerOn(t, b, "late", 1, handled, release)
	p.mu.Lock()
	if err := p.listen(); err != nil {
		p.mu.Unlock()
		t.Fatal(err)
	}
	old := p.sub
	p.forget()
	// The slot is asked for again, on the new inbox.
	p.reqs["1"] = time.Now().Add(time.Hour)
	p.asked = 1
	p.mu.Unlock()

	p.receive(&nats.Msg{Subject: "pulled.late", Sub: old, Data: []byte("late")})
	p.receive(&nats.Msg{Subject: "pulled.asked", Sub: p.sub, Data: []byte("asked")})
	p.mu.Lock()
	running := p.running
	p.mu.Unlock()
	close(release)
	p.wg.Wait()
	close(handled)
	var got []string
	for m := range handled {
		got = append(got, string(m.Data))
	}
	if running > 1 || fmt.Sprint(got) != "[asked]" {
		t.Errorf("%d handlers ran in 1 slot, handling %v; want only the message asked for", running, got)
	}
}

// TestMessagesOnTheirWayAreNotLostWithTheRequests: forgetting the open
// requests (a reconnect, an end that did not say what it left) ends their
// inbox; a message JetStream already sent to it is still handled (or
// handed back). The inbox's subscription was dropped, and the client
// discarded what it had received and not yet handed on: those messages
// waited out their ack wait, a delivery spent.
func TestMessagesOnTheirWayAreNotLostWithTheRequests(t *testing.T) {
	b, _ := provisionedBus(t)
	pulledStream(t, b, 3)
	handled := make(chan *nats.Msg, 4)
	release := make(chan struct{})
	close(release)
	p := pullerOn(t, b, "onitsway", 3, handled, release)
	p.mu.Lock()
	err := p.listen()
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	p.ask(3)
	// Holding p.mu keeps the subscription from handing the messages on:
	// they wait in the client, as messages on their way do.
	p.mu.Lock()
	deadline := time.Now().Add(time.Minute)
	for {
		n, _, err := p.sub.Pending()
		if err != nil || n == 3 {
			break
		}
		if time.Now().After(deadline) {
			p.mu.Unlock()
			t.Fatalf("%d of 3 messages came", n)
		}
		time.Sleep(time.Millisecond)
	}
	p.forget()
	p.mu.Unlock()
	for i := range 3 {
		select {
		case <-handled:
		case <-time.After(10 * time.Second): // the ack wait is 30 s: a message dropped does not come back within this
			t.Fatalf("%d of 3 messages on their way handled", i)
		}
	}
	p.wg.Wait()
}

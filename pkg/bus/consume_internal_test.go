package bus

import (
	"context"
	"testing"
	"time"
)

// TestConsumeIsPacedByTheConsumersAckWait: a consumer that exists is used
// as provisioning made it, even when the service asks for another ack
// wait. Its handlers' signs of life (every third of the ack wait) and its
// pull requests' expiry followed the ack wait the service asked for: one
// of 6 s on a consumer made with 1 s signalled every 2 s, and JetStream
// handed every message still at work to another replica after 1 s. So
// with its most deliveries: past the consumer's, JetStream drops a
// message in silence before the consume loop gives it up aloud.
func TestConsumeIsPacedByTheConsumersAckWait(t *testing.T) {
	b, _ := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	made := Consumer{Stream: StreamRollout, Durable: "paced", Filters: []string{"rollout.*.status"}, AckWait: time.Second, MaxDeliver: 3}
	if err := b.EnsureConsumer(ctx, made); err != nil {
		t.Fatal(err)
	}
	asked := made
	asked.AckWait, asked.MaxDeliver = 6*time.Second, 10
	c, err := b.openConsumer(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	if c.AckWait != made.AckWait {
		t.Errorf("consuming at the pace of a %v ack wait; the consumer's is %v", c.AckWait, made.AckWait)
	}
	if c.MaxDeliver != made.MaxDeliver {
		t.Errorf("giving up after %d deliveries; JetStream drops the message after %d", c.MaxDeliver, made.MaxDeliver+1)
	}
	// A longer ack wait than asked for leaves the pace asked for: faster.
	asked.AckWait = time.Second / 2
	if c, err = b.openConsumer(ctx, asked); err != nil || c.AckWait != asked.AckWait {
		t.Errorf("asked for %v with the consumer's %v: %v, %v", asked.AckWait, made.AckWait, c.AckWait, err)
	}
}

package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
)

// TestReadBatchOfNoMessagesIsAnError: a batch of fewer than one message is
// the caller's mistake. 0 asked the server for no batch at all (one
// message, no end of batch): the read waited out its time-out and returned
// that message as a batch whose end never came; -1 got an end of batch
// before any message, which said every message was still to come.
func TestReadBatchOfNoMessagesIsAnError(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	if err := b.Publish(ctx, &schema.Status{Rollout: 1, Event: "x", Episode: -1}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1} {
		if got, err := bus.ReadBatch(ctx, b.NC, bus.StreamRollout, "rollout.>", 1, n); err == nil {
			t.Errorf("a batch of %d messages: %v, no error", n, got)
		}
	}
}

// TestReadBatchWithoutWhatIsLeft: an end of batch that does not say how
// many messages are left (Nats-Num-Pending) does not make the batch one
// that ended with nothing left: Follow would count itself caught up with
// messages still to read.
func TestReadBatchWithoutWhatIsLeft(t *testing.T) {
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	server := bustest.Conn(t, url)
	_, err := server.Subscribe("$JS.API.DIRECT.GET.FAKE", func(req *nats.Msg) {
		m := nats.NewMsg(req.Reply)
		m.Header.Set("Nats-Subject", "fake.1")
		m.Header.Set("Nats-Sequence", "1")
		m.Header.Set("Nats-Time-Stamp", time.Now().UTC().Format(time.RFC3339Nano))
		m.Data = []byte("x")
		_ = server.PublishMsg(m)
		end := nats.NewMsg(req.Reply)
		end.Header.Set("Status", "204")
		end.Header.Set("Description", "EOB")
		_ = server.PublishMsg(end)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := bus.ReadBatch(context.Background(), nc, "FAKE", "fake.>", 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Msgs) != 1 || got.Ended {
		t.Fatalf("read %v; want the one message, and the batch not taken as ended", got)
	}
}

package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
)

// TestCreateOverADeletedKeyThatLostTheRace: a key deleted (or aged out,
// with a marker) is created by writing after its marker's revision; a
// replicated stream refuses a writer that lost that race to another with
// its own code (10164), which nats.go passes on as it is. Create took that
// refusal for a failed write, not for a key that exists now. The stream
// here is played by a responder: the one server of a test answers 10071.
func TestCreateOverADeletedKeyThatLostTheRace(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	if err := b.JS.DeleteStream(ctx, "KV_"+bus.BucketSession); err != nil {
		t.Fatal(err)
	}
	nc := bustest.Conn(t, url)
	subj := "$KV." + bus.BucketSession + ".k"
	if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
		if m.Header.Get("Nats-Expected-Last-Subject-Sequence") == "0" {
			_ = m.Respond([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"}}`))
			return
		}
		// Another writer created the key after its delete marker first.
		_ = m.Respond([]byte(`{"error":{"code":400,"err_code":10164,"description":"wrong last sequence"}}`))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Subscribe("$JS.API.DIRECT.GET.KV_"+bus.BucketSession+"."+subj, func(m *nats.Msg) {
		marker := nats.NewMsg(m.Reply)
		marker.Header.Set("Nats-Stream", "KV_"+bus.BucketSession)
		marker.Header.Set("Nats-Subject", subj)
		marker.Header.Set("Nats-Sequence", "5")
		marker.Header.Set("Nats-Time-Stamp", time.Now().UTC().Format(time.RFC3339Nano))
		marker.Header.Set("KV-Operation", "DEL")
		_ = nc.PublishMsg(marker)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	created, err := bus.Create(ctx, b.Sessions, "k", map[string]string{"v": "1"})
	if err != nil || created {
		t.Fatalf("created %v, %v; want not created (the key exists), no error", created, err)
	}
}

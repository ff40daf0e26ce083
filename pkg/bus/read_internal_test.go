package bus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/embedded"
)

// A key whose value aged out leaves a marker (empty body, header
// Nats-Marker-Reason: MaxAge) on buckets with limit markers; a read from the
// leader must see the key gone, not hand the empty body to a decoder (a
// chaos run failed with "decode *schema.RoleState: EOF").
func TestFreshReadSeesAgedOutKeyGone(t *testing.T) {
	b, _ := provisionedBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := b.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "aging", TTL: time.Second, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	put := time.Now()
	if _, err := kv.Put(ctx, "k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	// Held only while the second is not over (a loaded machine may take
	// longer for the put and the read).
	if e, err := b.kvGetFresh(ctx, "aging", "k"); err != nil || (time.Since(put) < time.Second && (e == nil || string(e.Value) != "value")) {
		t.Fatalf("before it ages out: %v, %v", e, err)
	}
	for {
		m, err := b.LastMsg(ctx, "KV_aging", "$KV.aging.k")
		if err != nil {
			t.Fatal(err)
		}
		if m != nil && m.Header.Get(jetstream.MarkerReasonHeader) != "" {
			break // the server wrote its marker
		}
		select {
		case <-ctx.Done():
			t.Fatal("the server never wrote a marker for the aged-out key")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if e, err := b.kvGetFresh(ctx, "aging", "k"); err != nil || e != nil {
		t.Fatalf("after it aged out: entry %+v, error %v; want none", e, err)
	}
}

// startEmbedded starts an embedded server for the test and connects to it.
func startEmbedded(t *testing.T) (url string, nc *nats.Conn) {
	t.Helper()
	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1, Name: "planact-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	nc, err = nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return s.ClientURL(), nc
}

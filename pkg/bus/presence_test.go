package bus_test

import (
	"context"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestPresentWaitsUntilItsNoticeIsStored: Present returns once the first
// notice is stored, trying until ctx ends. It gave up with the first
// publish that failed (or after a publish's patience, 15 s, while PRESENCE
// had no leader), and the gateway that called it stopped: one starting
// while JetStream was not ready, or during a long election, never served.
func TestPresentWaitsUntilItsNoticeIsStored(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "gateway")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.JS.DeleteStream(ctx, bus.StreamPresence); err != nil {
		t.Fatal(err)
	}
	// Until PRESENCE is back, a notice is answered as a server that
	// cannot take it answers.
	nc := bustest.Conn(t, url)
	refused := make(chan struct{}, 64)
	sub, err := nc.Subscribe("presence.>", func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}`))
		select {
		case refused <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		gone func()
		err  error
	}
	res := make(chan result, 1)
	go func() {
		gone, err := b.Present(ctx, schema.RolePlanner, "g1")
		res <- result{gone, err}
	}()
	for range 3 {
		select {
		case r := <-res:
			t.Fatalf("Present returned while its notice could not be stored: %v", r.err)
		case <-refused:
		}
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	bustest.Provision(t, url)
	r := <-res
	if r.err != nil {
		t.Fatalf("Present: %v", r.err)
	}
	defer r.gone()
	m, err := b.LastMsg(ctx, bus.StreamPresence, subject.Presence(schema.RolePlanner, "g1"))
	if err != nil || m == nil {
		t.Fatalf("the notice Present returned after is not stored: %v, %v", m, err)
	}
	ids, err := b.PresentGateways(ctx, schema.RolePlanner)
	if err != nil || !slices.Equal(ids, []string{"g1"}) {
		t.Fatalf("present gateways %v, %v; want [g1]", ids, err)
	}
}

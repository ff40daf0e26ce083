package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/subject"
)

// TestPeersShareAndGiveBack: replicas of a service count each other as soon
// as one starts (its ping names it), and a replica that stops answering is
// counted no more after its lease: the share it held goes back to the
// others, nothing waits on it.
func TestPeersShareAndGiveBack(t *testing.T) {
	_, url := bustest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replica := func(ctx context.Context, name string) (*bus.Bus, *bus.Peers) {
		b := bustest.Bus(t, url, name)
		if _, err := b.AddService(bus.ServiceConfig{Name: "actor-gateway", Version: "0.1.0"}); err != nil {
			t.Fatal(err)
		}
		return b, b.Peers(ctx)
	}
	_, first := replica(ctx, "first")
	if n := first.N(); n != 1 {
		t.Fatalf("alone: %d replicas", n)
	}
	changes := make(chan int, 16)
	first.OnChange(func(n int) { changes <- n })
	secondCtx, die := context.WithCancel(ctx)
	second, secondPeers := replica(secondCtx, "second")
	// Counted by both: usually before the newcomer's Peers returns (the
	// first heard its ping before it answered), at the latest at the next
	// round when a loaded first answers after the ping's window.
	for deadline := time.Now().Add(time.Minute); first.N() != 2 || secondPeers.N() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the second started: first counts %d, second %d; want 2 and 2", first.N(), secondPeers.N())
		}
	}
	if n := <-changes; n != 2 {
		t.Fatalf("OnChange said %d, want 2", n)
	}
	// It dies: it answers no ping and asks none any more.
	die()
	second.Service().Stop()
	deadline := time.Now().Add(time.Minute)
	for first.N() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a replica that stopped answering is still counted: %d", first.N())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := <-changes; n != 1 {
		t.Fatalf("OnChange said %d, want 1", n)
	}
}

// TestPeersAskOverTheBusInbox: a round's answers come over the bus's one
// reply subscription, not a subscription of their own: once a batch read
// has opened that subscription, the connection holds no more while a
// ping is out (its answers awaited) than before the rounds began. (A
// synchronous subscription per round would also cost nats.go a channel of
// 64k slots, 512 KB, every second.)
func TestPeersAskOverTheBusInbox(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "replica")
	if _, err := b.AddService(bus.ServiceConfig{Name: "actor-gateway", Version: "0.1.0"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A batch read (of an episode with no acts) opens the bus's reply
	// subscription.
	if _, err := b.LastMsgsOnce(ctx, bus.StreamAct, subject.ActDones(1, 0), []string{subject.ActDone(1, 0, "t1-n1")}); err != nil {
		t.Fatal(err)
	}
	before := b.NC.NumSubscriptions()
	listener := bustest.Conn(t, url)
	during := make(chan int, 16)
	// The ping is sent after its answers are awaited and before the wait
	// ends: what the replica's connection holds when it arrives is what it
	// holds during a round.
	if _, err := listener.Subscribe("$SRV.PING.actor-gateway", func(m *nats.Msg) {
		if m.Header.Get(bus.HdrPeer) != "" {
			during <- b.NC.NumSubscriptions()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := listener.Flush(); err != nil {
		t.Fatal(err)
	}
	b.Peers(ctx)
	for round := 1; round <= 3; round++ {
		select {
		case n := <-during:
			if n != before {
				t.Errorf("round %d: %d subscriptions while its ping was out, %d before the rounds; want the same", round, n, before)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: no ping came", round)
		}
	}
}

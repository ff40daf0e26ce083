package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
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

package bus_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
)

// Replies reach the request whose subject they come to, over one
// subscription; a reply after the request ended is dropped.
func TestInboxRoutesEachReplyToItsRequest(t *testing.T) {
	_, url := bustest.Server(t)
	nc := bustest.Conn(t, url)
	other := bustest.Conn(t, url)
	var in bus.Inbox
	got := [2]chan string{make(chan string, 4), make(chan string, 4)}
	var subjects [2]string
	var ends [2]func()
	for i := range 2 {
		var err error
		subjects[i], ends[i], err = in.Open(nc, func(m *nats.Msg) { got[i] <- string(m.Data) })
		if err != nil {
			t.Fatal(err)
		}
	}
	if subjects[0] == subjects[1] {
		t.Fatalf("two requests share the reply subject %s", subjects[0])
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, data := range []string{"to 0", "to 1"} {
		if err := other.Publish(subjects[i], []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []string{"to 0", "to 1"} {
		select {
		case g := <-got[i]:
			if g != want {
				t.Errorf("request %d got %q, want %q", i, g, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d got nothing", i)
		}
	}
	ends[0]()
	if err := other.Publish(subjects[0], []byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := other.Publish(subjects[1], []byte("still")); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got[1]:
		if g != "still" {
			t.Errorf("request 1 got %q, want still", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("request 1 got nothing after request 0 ended")
	}
	// The late reply came before "still" on the same subscription: routed
	// (dropped) by now.
	select {
	case g := <-got[0]:
		t.Errorf("an ended request got %q", g)
	default:
	}
	ends[1]()
}

package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// TestAnAttemptTooLongForTheMsgIDIsRefusedBeforeSending: an arrival's
// Nats-Msg-Id holds its attempt, and planact refuses an id over
// schema.MaxControlID bytes (naming the arrival seq:<n>, not by the id
// this client waits on); such an arrival is an error at once, naming the
// attempt, and nothing is sent. A short attempt is sent.
func TestAnAttemptTooLongForTheMsgIDIsRefusedBeforeSending(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "provision") // the streams exist, planact does not run
	c, err := client.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, role = 13, schema.RoleActor
	sent := func() *bus.StoredMsg {
		t.Helper()
		m, err := b.LastMsg(ctx, bus.StreamTrainer(role), subject.Arrive(n, role))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := &schema.Arrive{Rollout: n, Role: role, Engine: schema.Engine{URL: "http://e"}, Attempt: strings.Repeat("a", schema.MaxControlID)}
	if err := c.Arrive(ctx, a); !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "an attempt of 256 bytes") {
		t.Errorf("an arrival with an attempt of %d bytes: %v; want ErrRejected naming the attempt", len(a.Attempt), err)
	}
	if m := sent(); m != nil {
		t.Fatalf("the arrival was sent, as %.60q", m.Header.Get("Nats-Msg-Id"))
	}
	a.Attempt = "retry-2"
	if err := c.Arrive(ctx, a); err != nil {
		t.Fatalf("an arrival with attempt %q: %v", a.Attempt, err)
	}
	if m := sent(); m == nil || len(m.Header.Get("Nats-Msg-Id")) > schema.MaxControlID {
		t.Errorf("the arrival with a short attempt was not sent within the limit: %v", m)
	}
}

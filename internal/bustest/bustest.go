// Package bustest gives tests a real embedded JetStream server, a
// provisioned bus on it, and a certificate authority for TLS tests.
package bustest

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/telemetry"
)

// Server starts an embedded nats-server for the test and returns its URL.
func Server(t testing.TB) (*embedded.Server, string) {
	t.Helper()
	s, err := embedded.Start(embedded.Options{Dir: t.TempDir(), Port: -1, Name: "planact-test"})
	if err != nil {
		t.Fatalf("embedded server: %v", err)
	}
	t.Cleanup(s.Stop)
	return s, s.ClientURL()
}

// Logger returns a logger for tests: silent unless PLANACT_TEST_LOG is set.
func Logger() zerolog.Logger {
	if lvl := os.Getenv("PLANACT_TEST_LOG"); lvl != "" {
		return telemetry.NewLogger(os.Stderr, telemetry.LogOptions{Level: lvl, Pretty: true})
	}
	return zerolog.New(io.Discard)
}

// Bus provisions planact on url (as `planact provision` does) and connects
// a new bus to it, closed at the end of the test.
func Bus(t testing.TB, url, name string) *bus.Bus {
	t.Helper()
	Provision(t, url)
	b, err := bus.Connect(context.Background(), bus.ConnOptions{URL: url}, name, Logger(), bus.Provisioning{})
	if err != nil {
		t.Fatalf("bus: %v", err)
	}
	t.Cleanup(func() { b.NC.Close() })
	return b
}

// Provision creates planact's streams, buckets and object stores on url
// with the default provisioning.
func Provision(t testing.TB, url string) {
	t.Helper()
	nc := Conn(t, url)
	if err := bus.Provision(context.Background(), nc, Logger(), bus.Provisioning{}); err != nil {
		t.Fatalf("provision: %v", err)
	}
}

// Conn is a plain NATS connection, as a trainer would have: with the inbox
// prefix of the user url names, if any (compose/nats/accounts.conf lets a
// user read its own inboxes only).
func Conn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.Name(fmt.Sprintf("test-%s", t.Name()))}
	if p := (bus.ConnOptions{URL: url}).Inbox(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Package bus is planact's door to NATS JetStream: connecting, provisioning
// the streams and buckets, publishing messages with their headers, and one
// consume loop that turns a handler's error into ack, delayed nak or term.
package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Stream, bucket and object-store names (DESIGN §2).
const (
	StreamRollout = "ROLLOUT"
	StreamPlan    = "PLAN"
	StreamAct     = "ACT"
	StreamControl = "CONTROL"
	BucketSession = "sessions"
	BucketRuns    = "runs"
	// ObjectTasks holds task lists too large for an arrival message.
	ObjectTasks = "tasks"
)

// ObjectResults is the object store that holds role's samples when a
// result is too large for its message. Each role has its own, so that a
// trainer may be allowed to read its own samples only.
func ObjectResults(role string) string { return "results_" + role }

// Bus is a connection with the JetStream handles every service uses.
type Bus struct {
	NC       *nats.Conn
	JS       jetstream.JetStream
	Sessions *Bucket
	Runs     *Bucket
	Tasks    jetstream.ObjectStore
	// Results are the per-role object stores of large results, by role.
	Results map[string]jetstream.ObjectStore
	// Provisioning is what this bus provisioned with (defaults filled in).
	Provisioning Provisioning
	Log          zerolog.Logger

	service *Service // what `nats micro` sees of this connection, if added
	// single names the streams with one replica: no follower can lag
	// behind, so their reads by subject are direct gets.
	single map[string]bool
}

// Connect dials the servers c names, provisions the streams and buckets
// (idempotently) and returns a Bus. name shows up in `nats server report
// connections`. The connection reconnects for ever.
func Connect(ctx context.Context, c ConnOptions, name string, log zerolog.Logger, p Provisioning) (*Bus, error) {
	nc, err := dialForever(c, name, log)
	if err != nil {
		return nil, err
	}
	b, err := Open(ctx, nc, log, p)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return b, nil
}

// ConnectReader dials like Connect but provisions nothing, for a process
// that only reads what planact wrote (the web view): it needs no right to
// create or change a stream, so it can run as a read-only user. Its Bus
// has the connection, JetStream and service registration; the buckets and
// stores are nil.
func ConnectReader(c ConnOptions, name string, log zerolog.Logger) (*Bus, error) {
	nc, err := dialForever(c, name, log)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Bus{NC: nc, JS: js, Log: log}, nil
}

// dialForever dials the servers c names with a connection that reconnects
// for ever, logging when it loses and regains the server.
func dialForever(c ConnOptions, name string, log zerolog.Logger) (*nats.Conn, error) {
	return c.Dial(name,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("nats disconnected")
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info().Str("url", c.ConnectedUrlRedacted()).Msg("nats reconnected")
			if err := CheckServerVersion(c); err != nil {
				// A cluster's member older than the one first dialled.
				log.Error().Err(err).Msg("nats reconnected to a server too old for planact")
			}
		}),
	)
}

// Open provisions over an existing connection and returns a Bus. A server
// older than MinServerVersion is refused before anything is provisioned.
func Open(ctx context.Context, nc *nats.Conn, log zerolog.Logger, p Provisioning) (*Bus, error) {
	if err := CheckServerVersion(nc); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{NC: nc, JS: js, Log: log, Provisioning: p.withDefaults()}
	if err := b.Provisioning.Validate(); err != nil {
		return nil, err
	}
	if err := b.provision(ctx, b.Provisioning); err != nil {
		return nil, err
	}
	return b, nil
}

// Close drains the connection.
func (b *Bus) Close() {
	if b != nil && b.NC != nil {
		_ = b.NC.Drain()
	}
}

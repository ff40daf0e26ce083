// Package bus is planact's door to NATS JetStream: connecting, provisioning
// the streams and buckets, publishing messages with their headers, and one
// consume loop that turns a handler's error into ack, delayed nak or term.
package bus

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Stream, bucket and object-store names (DESIGN §2). Subjects do not name
// their stream: what a trainer writes and what planact writes live in
// different streams, split by subject filters that do not overlap, so that
// no JetStream feature a trainer may use on its own messages (message ids,
// roll-ups, schedules) reaches planact's (docs/security.md).
const (
	// StreamRollout holds what planact says of a rollout: starts,
	// statuses, episode ends, results. Only planact's services write it.
	StreamRollout = "ROLLOUT"
	StreamPlan    = "PLAN"
	StreamAct     = "ACT"
	// StreamControl holds planact's answers to pauses, the gateways'
	// drained notices, expired pauses and rollbacks; the pauses and
	// resumes are in the trainers' streams.
	StreamControl = "CONTROL"
	// StreamTimeout holds the session-store's scheduled time-outs and
	// their firings: the one stream that allows message schedules, and only
	// the session-store writes it (a schedule's target must be in its own
	// stream).
	StreamTimeout = "TIMEOUT"
	// StreamPresence holds one notice per running gateway, which the
	// gateway renews every PresenceBeat and which the server drops when
	// PresenceLease passes without one: the gateways a pause waits for.
	StreamPresence = "PRESENCE"
	BucketSession  = "sessions"
	BucketRuns     = "runs"
)

// Roles are the trainer roles, each with its own stream and stores.
var Roles = []string{"planner", "actor"}

// StreamTrainer is the stream of what role's trainer writes: its
// arrivals, cancels, pauses and resumes. Each role has its own, so that a
// flood by one trainer cannot block the other.
func StreamTrainer(role string) string { return "TRAINER_" + strings.ToUpper(role) }

// ObjectTasks is the object store of role's task lists too large for an
// arrival message: only role's trainer writes it, and an arrival names its
// list's SHA-256, which every reader checks.
func ObjectTasks(role string) string { return "tasks_" + role }

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
	// Tasks are the per-role object stores of large task lists, by role.
	Tasks map[string]jetstream.ObjectStore
	// Results are the per-role object stores of large results, by role.
	Results map[string]jetstream.ObjectStore
	// Provisioning is what this bus provisioned with (defaults filled in).
	Provisioning Provisioning
	Log          zerolog.Logger

	service *Service // what `nats micro` sees of this connection, if added
	// single names the streams with one replica: no follower can lag
	// behind, so their reads by subject are direct gets.
	single map[string]bool
	// replies routes the answers of the bus's own requests that may have
	// many (batch reads, the peers' pings) over one subscription.
	replies Inbox
}

// Connect dials the servers c names (waiting, until ctx ends, while none
// can be reached), opens what planact keeps in JetStream (made by
// Provision: `planact provision`) and returns a Bus. name shows up in
// `nats server report connections`. The connection reconnects for ever.
func Connect(ctx context.Context, c ConnOptions, name string, log zerolog.Logger, p Provisioning) (*Bus, error) {
	nc, err := dialForever(ctx, c, name, log)
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

// ConnectReader dials like Connect but opens nothing, for a process that
// only reads what planact wrote (the web view): it needs no right but to
// read, so it can run as a read-only user. Its Bus has the connection,
// JetStream and service registration; the buckets and stores are nil.
func ConnectReader(ctx context.Context, c ConnOptions, name string, log zerolog.Logger) (*Bus, error) {
	nc, err := dialForever(ctx, c, name, log)
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

// dialForever dials the servers c names, until one answers or ctx ends,
// with a connection that reconnects for ever, logging when it loses and
// regains the server.
func dialForever(ctx context.Context, c ConnOptions, name string, log zerolog.Logger) (*nats.Conn, error) {
	return c.DialContext(ctx, name, func(err error) { log.Warn().Err(err).Msg("nats not reachable yet; trying again") },
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

// Open opens, over an existing connection, the streams, buckets and object
// stores that Provision made, waiting a while for them when they are
// missing (services may start before provisioning ends). It creates and
// changes nothing. p gives the retention the services act on. A server
// older than MinServerVersion is refused first.
func Open(ctx context.Context, nc *nats.Conn, log zerolog.Logger, p Provisioning) (*Bus, error) {
	if err := CheckServerVersion(nc); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b := &Bus{NC: nc, JS: js, Log: log, Provisioning: p.WithDefaults()}
	if err := b.Provisioning.Validate(); err != nil {
		return nil, err
	}
	if err := b.open(ctx, b.Provisioning); err != nil {
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

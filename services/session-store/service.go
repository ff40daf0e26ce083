// Package sessionstore is the session-store service: the arrival barrier
// and the bookkeeper of every rollout. It starts a rollout exactly once
// when both roles have arrived, counts episode ends, and when the last one
// ends assembles both roles' samples and publishes their results.
package sessionstore

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/subject"
)

// Name is the service's name on the bus.
const Name = "session-store"

// Deps are what the session-store needs.
type Deps struct {
	Bus *bus.Bus
	Log zerolog.Logger
	// InlineLimit is the size above which a result's samples go to the
	// object store instead of the message; default 1 MiB.
	InlineLimit int
	// Concurrency of message handling; default 32.
	Concurrency int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Service is a running session-store.
type Service struct {
	Deps
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	if d.InlineLimit == 0 {
		d.InlineLimit = 1 << 20
	}
	if d.Concurrency == 0 {
		d.Concurrency = 32
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	s := &Service{Deps: d}
	return d.Bus.Consume(ctx, bus.Consumer{
		Stream:      bus.StreamRollout,
		Durable:     Name,
		Filters:     []string{subject.AllArrive, subject.AllEpisodeEnd, subject.AllTimeout, subject.AllCancel},
		Concurrency: d.Concurrency,
		MaxDeliver:  maxDeliveries,
	}, s.handle)
}

func (s *Service) handle(ctx context.Context, m bus.Msg) error {
	p, err := subject.Parse(m.Subject)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	switch p.Verb {
	case "arrive":
		return s.handleArrive(ctx, m)
	case "end":
		return s.handleEpisodeEnd(ctx, m)
	case "timeout":
		return s.handleTimeout(ctx, m)
	case "cancel":
		return s.handleCancel(ctx, m)
	}
	return fail.Invalidf("session-store: unexpected subject %s", m.Subject)
}

func (s *Service) nowMs() int64 { return s.Now().UnixMilli() }

func rolloutErr(n int64, err error) error { return fmt.Errorf("rollout %d: %w", n, err) }

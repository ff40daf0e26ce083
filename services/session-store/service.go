// Package sessionstore is the session-store service: the arrival barrier
// and the bookkeeper of every rollout. It starts a rollout exactly once
// when both roles have arrived, counts episode ends, and when the last one
// ends assembles both roles' samples and publishes their results.
//
// Every decision is written into the rollout's session (KV sessions) before
// its effects are published, with the effects in the session's outbox;
// whoever reads the session next — a handler, a redelivered message, or the
// sweep that follows every session — publishes them idempotently and clears
// them. The sweep also ends rollouts whose deadline passed without their
// time-out message, and removes results whose retention has passed.
package sessionstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
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
	// SweepEvery is how often the sweep looks at every session; default 2s.
	SweepEvery time.Duration
	// Grace is how long the sweep leaves a decision or a deadline to the
	// message that normally handles it before it steps in; default 5s.
	Grace time.Duration
	// ResultPatience is how long the results of a finished rollout (or a
	// group before them) are tried, from their first failure, before both
	// trainers get a failed result that says why; default 2m.
	ResultPatience time.Duration
}

// Service is a running session-store.
type Service struct {
	Deps
	index     *index
	taskCache *taskCache
	counted   deliveredCounts // what the groups this process delivered count (see assemble)
	failing   failingSince    // rollouts whose effects fail to settle, since when (ResultPatience)
	silent    silentScorers   // rollouts whose reward server spent a whole scoring budget silent
	locks     rolloutLocks
	arrivals  rolloutLocks // one arrival of a rollout at a time (see handleArrive)
	ends      endQueue
	// maxResultBody, when set, is the largest body a result message can
	// have, instead of the server's max_payload less room for headers
	// (maxBody): a test's.
	maxResultBody int
}

func (d Deps) withDefaults() Deps {
	if d.InlineLimit == 0 {
		d.InlineLimit = 1 << 20
	}
	if d.Concurrency == 0 {
		d.Concurrency = 32
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.SweepEvery == 0 {
		d.SweepEvery = 2 * time.Second
	}
	if d.Grace == 0 {
		d.Grace = 5 * time.Second
	}
	if d.ResultPatience == 0 {
		d.ResultPatience = 2 * time.Minute
	}
	return d
}

// Consumers are the session-store's durable consumers: one on each
// trainer's stream (arrivals, cancels, pauses and resumes of that role, so
// that a flood by one trainer does not hold up the other), one on ROLLOUT
// (episode ends) and one on TIMEOUT (its time-outs firing). `planact
// provision` creates them; the session-store only uses them.
func Consumers(d Deps) []bus.Consumer {
	d = d.withDefaults()
	cs := []bus.Consumer{
		{Stream: bus.StreamRollout, Durable: Name, Concurrency: d.Concurrency, MaxDeliver: maxDeliveries,
			Filters: []string{subject.AllEpisodeEnd, subject.LegacyArrive, subject.LegacyCancel}},
		{Stream: bus.StreamTimeout, Durable: Name + "-timeout", Concurrency: d.Concurrency, MaxDeliver: maxDeliveries,
			Filters: []string{subject.AllTimeout}},
	}
	for _, role := range bus.Roles {
		cs = append(cs, bus.Consumer{Stream: bus.StreamTrainer(role), Durable: Name + "-" + role, Concurrency: d.Concurrency, MaxDeliver: maxDeliveries,
			Filters: []string{subject.ArriveOf(role), subject.CancelOf(role), subject.Control(role, "pause"), subject.Control(role, "resume")}})
	}
	return cs
}

// Run serves until ctx ends.
func Run(ctx context.Context, d Deps) error {
	d = d.withDefaults()
	s := &Service{Deps: d, index: newIndex(), taskCache: &taskCache{lists: map[int64]schema.TaskList{}}}
	consumers := Consumers(d)
	// One part that fails stops the others: the service fails as a whole,
	// never half of it in silence.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(consumers)+1)
	part := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	part(s.sweep)
	for _, c := range consumers {
		part(func(ctx context.Context) error { return d.Bus.Consume(ctx, c, s.handle) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) handle(ctx context.Context, m bus.Msg) error {
	if strings.HasPrefix(m.Subject, "control.") {
		return s.handleControl(ctx, m)
	}
	p, err := subject.Parse(m.Subject)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	switch p.Verb {
	case "arrive":
		return s.handleArrive(ctx, m, p)
	case "end":
		return s.handleEpisodeEnd(ctx, m)
	case "timeout":
		return s.handleTimeout(ctx, m)
	case "cancel":
		return s.handleCancel(ctx, m, p)
	}
	return fail.Invalidf("session-store: unexpected subject %s", m.Subject)
}

func (s *Service) nowMs() int64 { return s.Now().UnixMilli() }

func rolloutErr(n int64, err error) error { return fmt.Errorf("rollout %d: %w", n, err) }

// maxDeliveries is how often the session-store's consumer delivers a
// message before giving it up; the sweep finishes what a given-up message
// left undone.
const maxDeliveries = 10

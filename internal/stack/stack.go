// Package stack starts planact's services by name, in one process or a few:
// the code behind `planact up` and `planact serve`, and the harness of the
// end-to-end tests and benchmarks.
package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/telemetry"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
	actorgateway "github.com/planact/planact/services/actor-gateway"
	planparser "github.com/planact/planact/services/plan-parser"
	plannergateway "github.com/planact/planact/services/planner-gateway"
	sessionstore "github.com/planact/planact/services/session-store"
)

// Services lists every service name, in the order `up` starts them.
var Services = []string{
	sessionstore.Name, plannergateway.Name, planparser.Name, actdispatcher.Name, actorgateway.Name,
}

// Targets are what `serve` and `up` can run: the services and the web
// view (web.Name), which only reads.
var Targets = append(slices.Clone(Services), web.Name)

// Options configure which services run and how.
type Options struct {
	// Conn says how every replica connects to NATS.
	Conn         bus.ConnOptions
	Provisioning bus.Provisioning
	Log          zerolog.Logger
	// Replicas per service name; default 1. Each replica has its own connection.
	Replicas map[string]int
	// EngineLimit bounds generations in flight per engine in each gateway; 0 = 64.
	EngineLimit int
	// ActRetryBase is the act-dispatcher's first retry back-off; 0 = its default.
	ActRetryBase time.Duration
	// ActAckWait is the act-dispatcher's ack wait for work items; 0 = its default.
	ActAckWait time.Duration
	// ActTurns bounds the turns each act-dispatcher replica runs at once; 0 = its default.
	ActTurns int
	// PlannerConcurrency bounds the planner turns each planner-gateway
	// replica handles at once; 0 = its default.
	PlannerConcurrency int
	// PlannerAckWait is the planner-gateway's ack wait for plan requests; 0 = its default.
	PlannerAckWait time.Duration
	// InlineLimit is the size above which the session-store moves a result's
	// samples to the object store; 0 = its default.
	InlineLimit int
	// Stall is how long an episode may go without progress before the
	// act-dispatcher's watchdog drives it on; 0 = its default.
	Stall time.Duration
	// PlannerSlack is how much longer than the planner's time-out the
	// watchdog lets a planner turn go without progress; 0 = its default.
	PlannerSlack time.Duration
	// SweepEvery is how often the session-store's sweep runs; 0 = its default.
	SweepEvery time.Duration
	// WebAddr is where the web target listens (host:port).
	WebAddr string
	// Tracing, if set, is flushed and shut down once the services stopped:
	// their last spans are exported before Serve returns.
	Tracing *telemetry.Tracing
	// Provision has Serve provision first, as Conn's user (Provision): what
	// `planact up` does in process. Otherwise the services only open what
	// `planact provision` made.
	Provision bool
}

// Provision creates or updates what planact keeps in JetStream (streams,
// buckets, object stores) and the services' durable consumers, as the user
// o.Conn names: the admin's step of a deployment (`planact provision`).
func Provision(ctx context.Context, o Options) error {
	nc, err := o.Conn.Dial("planact-provision")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := bus.Provision(ctx, nc, o.Log, o.Provisioning); err != nil {
		return err
	}
	b, err := bus.Open(ctx, nc, o.Log, o.Provisioning)
	if err != nil {
		return err
	}
	for _, c := range Consumers(o) {
		if err := b.EnsureConsumer(ctx, c); err != nil {
			return fmt.Errorf("provision: %w", err)
		}
	}
	return b.RemoveObsolete(ctx)
}

// Consumers are the durable consumers of every service, as the services
// run with o.
func Consumers(o Options) []bus.Consumer {
	var cs []bus.Consumer
	cs = append(cs, sessionstore.Consumers(sessionstore.Deps{InlineLimit: o.InlineLimit, SweepEvery: o.SweepEvery})...)
	cs = append(cs, plannergateway.Consumers(plannergateway.Deps{Concurrency: o.PlannerConcurrency, AckWait: o.PlannerAckWait})...)
	cs = append(cs, planparser.Consumers(planparser.Deps{})...)
	cs = append(cs, actdispatcher.Consumers(actdispatcher.Deps{RunAckWait: o.ActAckWait, Turns: o.ActTurns})...)
	return cs
}

// Validate reports an unknown target name.
func Validate(names []string) error {
	for _, n := range names {
		if !slices.Contains(Targets, n) {
			return fmt.Errorf("unknown service %q (services: %s)", n, strings.Join(Targets, ", "))
		}
	}
	return nil
}

// Serve runs the named services until ctx ends or one fails. Every replica
// gets its own NATS connection, as separate processes would.
func Serve(ctx context.Context, names []string, o Options) error {
	if err := Validate(names); err != nil {
		return err
	}
	defer flush(o)
	if o.Provision {
		if err := Provision(ctx, o); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var buses []*bus.Bus
	defer func() {
		for _, b := range buses {
			b.NC.Close()
		}
	}()
	sorted := append([]string(nil), names...)
	sort.SliceStable(sorted, func(i, j int) bool { return slices.Index(Targets, sorted[i]) < slices.Index(Targets, sorted[j]) })
	var webListener net.Listener
	if slices.Contains(names, web.Name) {
		// Before anything starts: an address in use is a mistake to say at once.
		ln, err := web.Listen(o.WebAddr)
		if err != nil {
			return err
		}
		webListener = ln
		defer ln.Close()
	}
	start := func() error {
		for _, name := range sorted {
			replicas := max(o.Replicas[name], 1)
			if name == web.Name {
				replicas = 1 // one listener, one address
			}
			for r := 0; r < replicas; r++ {
				replica := replicaName(r)
				log := o.Log.With().Str("service", name).Str("replica", replica).Logger()
				connect := func() (*bus.Bus, error) {
					return bus.Connect(ctx, o.Conn, fmt.Sprintf("planact-%s-%s", name, replica), log, o.Provisioning)
				}
				if name == web.Name {
					// The web view only reads: it opens nothing, so it can
					// run as a read-only user (compose's viewer).
					connect = func() (*bus.Bus, error) { return bus.ConnectReader(ctx, o.Conn, "planact-web-"+replica, log) }
				}
				b, err := connect()
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				buses = append(buses, b)
				if err := register(b, name, replica); err != nil {
					return err
				}
				run := runner(name, b, log, o, webListener)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
						log.Error().Err(err).Msg("service failed; the others stop too")
						errs <- fmt.Errorf("%s: %w", name, err)
						cancel()
					}
				}()
				log.Info().Msg("service started")
			}
		}
		return nil
	}
	if err := start(); err != nil {
		// The replicas already running stop before their connections close.
		cancel()
		wg.Wait()
		return err
	}
	<-ctx.Done()
	wg.Wait()
	close(errs)
	return errors.Join(drain(errs)...)
}

// flush exports the spans the services left in o.Tracing's buffer.
func flush(o Options) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.Tracing.Shutdown(ctx); err != nil {
		o.Log.Warn().Err(err).Msg("spans not exported")
	}
}

// replicaName names replica r of this process so that replicas of one
// service in different processes (or hosts) do not all call themselves 0:
// "<host>:<pid>/<r>".
func replicaName(r int) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d/%d", host, os.Getpid(), r)
}

// Version is reported by every service to `nats micro info`.
const Version = "0.1.0"

var descriptions = map[string]string{
	sessionstore.Name:   "planact: arrival barrier, rollout lifecycle and result assembly",
	plannergateway.Name: "planact: planner turns through the planner engine",
	planparser.Name:     "planact: plans in, validated DAGs, answers or errors out",
	actdispatcher.Name:  "planact: releases and executes acts, drives turns and episodes",
	actorgateway.Name:   "planact: generations from the actor engines",
	web.Name:            "planact: the web view of rollouts (reads only)",
}

// register makes a replica visible to `nats micro ls|info|stats`: its
// consumers and endpoints, with the statistics of their real work, and a
// status endpoint that says which replica answered and since when.
func register(b *bus.Bus, name string, replica string) error {
	started := time.Now()
	svc, err := b.AddService(bus.ServiceConfig{
		Name: name, Version: Version, Description: descriptions[name], Metadata: map[string]string{"replica": replica},
	})
	if err != nil {
		return fmt.Errorf("%s: register service: %w", name, err)
	}
	subj := "planact." + name + ".status"
	ep := svc.Endpoint("status", subj, "", nil)
	_, err = b.NC.Subscribe(subj, func(m *nats.Msg) {
		began := time.Now()
		data, _ := json.Marshal(map[string]any{
			"service": name, "replica": replica, "started": started.UTC().Format(time.RFC3339),
			"uptime_s": time.Since(started).Seconds(),
		})
		err := m.Respond(data)
		ep.Record(time.Since(began), err)
	})
	if err != nil {
		return fmt.Errorf("%s: status endpoint: %w", name, err)
	}
	return nil
}

func drain(ch chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func runner(name string, b *bus.Bus, log zerolog.Logger, o Options, webListener net.Listener) func(context.Context) error {
	pool := &engine.Pool{Limit: o.EngineLimit}
	switch name {
	case sessionstore.Name:
		return func(ctx context.Context) error {
			return sessionstore.Run(ctx, sessionstore.Deps{Bus: b, Log: log, InlineLimit: o.InlineLimit, SweepEvery: o.SweepEvery})
		}
	case plannergateway.Name:
		return func(ctx context.Context) error {
			return plannergateway.Run(ctx, plannergateway.Deps{Bus: b, Log: log, Engines: pool, Concurrency: o.PlannerConcurrency, AckWait: o.PlannerAckWait})
		}
	case planparser.Name:
		return func(ctx context.Context) error { return planparser.Run(ctx, planparser.Deps{Bus: b, Log: log}) }
	case actdispatcher.Name:
		return func(ctx context.Context) error {
			return actdispatcher.Run(ctx, actdispatcher.Deps{Bus: b, Log: log, RetryBase: o.ActRetryBase, RunAckWait: o.ActAckWait, Turns: o.ActTurns, Stall: o.Stall, PlannerSlack: o.PlannerSlack})
		}
	case actorgateway.Name:
		return func(ctx context.Context) error {
			return actorgateway.Run(ctx, actorgateway.Deps{Bus: b, Log: log, Engines: pool})
		}
	case web.Name:
		return func(ctx context.Context) error { return web.Run(ctx, b.NC, webListener, log) }
	}
	panic("stack: unvalidated service " + name)
}

// WaitReady waits until every named service answers `$SRV.PING.<name>`:
// consumers created, endpoints registered.
func WaitReady(ctx context.Context, conn bus.ConnOptions, names []string) error {
	nc, err := conn.DialContext(ctx, "planact-ready-check", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, name := range names {
		for {
			if _, err := nc.RequestWithContext(ctx, "$SRV.PING."+name, nil); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s is not answering: %w", name, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// engines are the simulated engines, by what they are for.
type engines struct {
	wide        map[int]string // planner with PlanWidth w, zero latency
	actor       string         // actor, zero latency
	slowPlanner string         // eager: fixed latency, whole plans of the world's questions
	slowActor   string         // eager: fixed latency
}

func startEngines(ctx context.Context, o options) (*engines, error) {
	e := &engines{wide: map[int]string{}}
	serve := func(cfg sim.Config) (string, error) { return sim.Serve(ctx, "127.0.0.1:0", cfg) }
	widths := append(append([]int(nil), o.Widths...), o.LightWidths...)
	for _, w := range widths {
		if e.wide[w] != "" {
			continue
		}
		u, err := serve(sim.Config{Role: schema.RolePlanner, Seed: 1, PlanWidth: w, WeightVersion: "planner-v1"})
		if err != nil {
			return nil, err
		}
		e.wide[w] = u
	}
	var err error
	if e.actor, err = serve(sim.Config{Role: schema.RoleActor, Seed: 2, WeightVersion: "actor-v1"}); err != nil {
		return nil, err
	}
	if e.slowPlanner, err = serve(sim.Config{Role: schema.RolePlanner, Seed: 1, TTFT: o.PlannerTTFT, PerToken: o.PlannerPerToken,
		PlannerStepwise: 0, WeightVersion: "planner-v1"}); err != nil {
		return nil, err
	}
	if e.slowActor, err = serve(sim.Config{Role: schema.RoleActor, Seed: 2, TTFT: o.ActorTTFT, WeightVersion: "actor-v1"}); err != nil {
		return nil, err
	}
	return e, nil
}

// trainers play both jobs, each on its own connection, as a trainer would.
type trainers struct {
	planner, actor *client.Client
	conns          []*nats.Conn
	timeout        time.Duration
}

func newTrainers(url string, timeout time.Duration) (*trainers, error) {
	t := &trainers{timeout: timeout}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		nc, err := bus.ConnOptions{URL: url}.Dial("overhead-trainer-" + role)
		if err != nil {
			t.close()
			return nil, err
		}
		t.conns = append(t.conns, nc)
		c, err := client.New(nc)
		if err != nil {
			t.close()
			return nil, err
		}
		if role == schema.RolePlanner {
			t.planner = c
		} else {
			t.actor = c
		}
	}
	return t, nil
}

func (t *trainers) close() {
	for _, nc := range t.conns {
		nc.Close()
	}
}

// rollout has the planner arrive (with the tasks), then the actor, and
// waits for both results. secondAck is when the actor's arrival was
// acknowledged: the second role's arrival. Any result but ok with every
// episode completed is an error.
func (t *trainers) rollout(ctx context.Context, n int64, planner, actor string, tasks []schema.Task, cfg schema.Config) (res *schema.Result, secondAck time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	err = t.planner.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: planner},
		WeightVersion: "planner-v1", Tasks: tasks, Config: &cfg})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("rollout %d: %w", n, err)
	}
	err = t.actor.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: actor}, WeightVersion: "actor-v1"})
	secondAck = time.Now()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("rollout %d: %w", n, err)
	}
	var wg sync.WaitGroup
	var ar *schema.Result
	var perr, aerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		ar, aerr = t.actor.Result(ctx, n, schema.RoleActor)
	}()
	res, perr = t.planner.Result(ctx, n, schema.RolePlanner)
	wg.Wait()
	if err := errors.Join(perr, aerr); err != nil {
		return nil, time.Time{}, fmt.Errorf("rollout %d: %w", n, err)
	}
	for _, r := range []*schema.Result{res, ar} {
		if r.Status != schema.ResultOK {
			return nil, time.Time{}, fmt.Errorf("rollout %d: %s result %s: %s", n, r.Role, r.Status, r.Reason)
		}
	}
	st := res.Stats
	if st.EpisodeStatus[schema.EpisodeCompleted] != len(tasks) {
		return nil, time.Time{}, fmt.Errorf("rollout %d: %d of %d episodes completed (%s; %s)", n, st.EpisodeStatus[schema.EpisodeCompleted], len(tasks), counts(st.EpisodeStatus), res.Reason)
	}
	return res, secondAck, nil
}

func counts(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// planact runs the services on the servers until stop is called.
type planact struct {
	trainers *trainers
	engines  *engines
	next     int64 // the next rollout id
	ctx      context.Context
	stop     func() error
	dump     func(n int64) // says what the streams hold of a rollout that failed
}

func startPlanact(ctx context.Context, o options, s *servers) (*planact, error) {
	ctx, cancel := context.WithCancel(ctx)
	eng, err := startEngines(ctx, o)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("engines: %w", err)
	}
	conn := bus.ConnOptions{URL: s.serviceURL}
	if o.InProcess {
		conn.InProcess = s.nodes[0]
	}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{
			Conn: conn, Provisioning: bus.Provisioning{Replicas: s.replicas}, Log: o.Log, EngineLimit: 512, Provision: true,
		})
		cancel() // a service that failed stops every wait of the run
	}()
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = stack.WaitReady(rctx, conn, stack.Services)
	rcancel()
	if err != nil {
		cancel()
		return nil, errors.Join(fmt.Errorf("services not ready: %w", err), <-served)
	}
	t, err := newTrainers(s.clientURL, o.RolloutTimeout)
	if err != nil {
		cancel()
		return nil, errors.Join(err, <-served)
	}
	p := &planact{trainers: t, engines: eng, next: 1, ctx: ctx}
	p.stop = func() error {
		t.close()
		cancel()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("services: %w", err)
		}
		return nil
	}
	return p, nil
}

// ids reserves k rollout ids.
func (p *planact) ids(k int) int64 {
	n := p.next
	p.next += int64(k)
	return n
}

// batch is what one throughput, light or eager run did.
type batch struct {
	first, last int64 // rollout ids
	results     []*schema.Result
	acks        map[int64]time.Time // the second arrival's acknowledgement, by rollout
	wall        time.Duration
}

func (b *batch) acts() int {
	n := 0
	for _, r := range b.results {
		n += r.Stats.Acts + r.Stats.CachedActs
	}
	return n
}

func (b *batch) episodes() int {
	n := 0
	for _, r := range b.results {
		n += r.Stats.Episodes
	}
	return n
}

// runBatch runs rollouts of tasks(i) for i < rollouts, inFlight at a time,
// and fails at the first rollout that fails.
func (p *planact) runBatch(rollouts, inFlight int, planner, actor string, tasks func(n int64) []schema.Task, cfg schema.Config) (*batch, error) {
	first := p.ids(rollouts)
	b := &batch{first: first, last: first + int64(rollouts) - 1, acks: map[int64]time.Time{}}
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range rollouts {
		n := first + int64(i)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			res, ack, err := p.trainers.rollout(ctx, n, planner, actor, tasks(n), cfg)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if len(errs) == 0 && p.ctx.Err() == nil && p.dump != nil {
					p.dump(n) // what the streams hold of the first rollout that failed
				}
				errs = append(errs, err)
				cancel()
				return
			}
			b.results = append(b.results, res)
			b.acks[n] = ack
		}()
	}
	wg.Wait()
	b.wall = time.Since(start)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	if err := p.ctx.Err(); err != nil {
		return nil, fmt.Errorf("stopped: %w", err)
	}
	return b, nil
}

// worldTasks are k tasks of the simulated world's question mix for rollout
// n: k/copies distinct questions, copies of each (a group).
func worldTasks(k, copies int, n int64) []schema.Task {
	copies = max(1, min(copies, k))
	tasks := demo.Tasks(sim.DefaultWorld(), (k+copies-1)/copies, copies, 1000+n, "")
	return tasks[:k]
}

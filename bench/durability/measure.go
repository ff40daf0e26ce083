package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

type options struct {
	Policies   string
	Rounds     int
	PublishFor time.Duration
	Size       int
	Window     int
	Rollouts   int
	Tasks      int
	Dir        string
	Progress   io.Writer // nil = quiet
}

// policy is a sync policy under test; "default" is the server's.
type policy struct {
	name string
	sync embedded.Sync
}

func parsePolicies(s string) ([]policy, error) {
	var out []policy
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "default" {
			out = append(out, policy{name: name})
			continue
		}
		sy, err := embedded.ParseSync(name)
		if err != nil {
			return nil, fmt.Errorf("--sync: %w", err)
		}
		out = append(out, policy{name: name, sync: sy})
	}
	if len(out) < 2 {
		return nil, errors.New("--sync: name a baseline and at least one policy to compare with it")
	}
	return out, nil
}

// workload is one thing measured, on a fresh server: a rate, higher is better.
type workload struct {
	name, unit string
	run        func(ctx context.Context, o options, srv *embedded.Server) (float64, error)
}

func workloads() []workload {
	return []workload{
		{"publish, 1 in flight", "msg/s", publishSerial},
		{"publish, async window", "msg/s", publishWindow},
		{"rollouts, instant engines", "rollouts/s", rollouts(0, 0, 0, 0)},
		// bench/rollout's engines: a plan turn takes about 0.1s.
		{"rollouts, fast engines", "rollouts/s", rollouts(30*time.Millisecond, 500*time.Microsecond, 80*time.Millisecond, 100*time.Microsecond)},
		// A plan turn takes about 0.5s, an act 0.25s: still faster than a
		// 70B planner and a 7B actor, which take seconds.
		{"rollouts, slower engines", "rollouts/s", rollouts(200*time.Millisecond, 2*time.Millisecond, 200*time.Millisecond, time.Millisecond)},
	}
}

// result is one workload under one policy.
type result struct {
	Workload string    `json:"workload"`
	Unit     string    `json:"unit"`
	Sync     string    `json:"sync"`
	Values   []float64 `json:"values"` // one per round
	Median   float64   `json:"median"`
	// Ratios are this policy's value over the baseline's in each round
	// (measured seconds apart); Ratio is their median.
	Ratios []float64 `json:"ratios"`
	Ratio  float64   `json:"ratio"`
}

type report struct {
	Machine  machine  `json:"machine"`
	Baseline string   `json:"baseline"`
	Policies []string `json:"policies"`
	Rounds   int      `json:"rounds"`
	Options  struct {
		PublishSeconds float64 `json:"publish_seconds"`
		MessageBytes   int     `json:"message_bytes"`
		Window         int     `json:"window"`
		Rollouts       int     `json:"rollouts"`
		Tasks          int     `json:"tasks"`
	} `json:"options"`
	Results []*result `json:"results"`
	// LoadBefore and LoadAfter are /proc/loadavg: how busy the shared
	// machine was.
	LoadBefore string `json:"load_before,omitempty"`
	LoadAfter  string `json:"load_after,omitempty"`
}

func measure(ctx context.Context, o options) (*report, error) {
	pols, err := parsePolicies(o.Policies)
	if err != nil {
		return nil, err
	}
	if o.Rounds < 1 {
		o.Rounds = 1
	}
	if o.Dir == "" {
		o.Dir = os.TempDir()
	}
	rep := &report{Baseline: pols[0].name, Rounds: o.Rounds, LoadBefore: firstLine("/proc/loadavg")}
	rep.Options.PublishSeconds, rep.Options.MessageBytes, rep.Options.Window = o.PublishFor.Seconds(), o.Size, o.Window
	rep.Options.Rollouts, rep.Options.Tasks = o.Rollouts, o.Tasks
	if rep.Machine, err = describeMachine(o.Dir); err != nil {
		return nil, err
	}
	ws := workloads()
	results := map[string]*result{}
	for _, w := range ws {
		for _, p := range pols {
			r := &result{Workload: w.name, Unit: w.unit, Sync: p.name}
			results[w.name+"|"+p.name] = r
			rep.Results = append(rep.Results, r)
		}
	}
	for _, p := range pols {
		rep.Policies = append(rep.Policies, p.name)
	}
	for round := 0; round < o.Rounds; round++ {
		// Each round starts with another policy, so that none always runs
		// first (on a cold machine) or last.
		order := append(slices.Clone(pols[round%len(pols):]), pols[:round%len(pols)]...)
		for _, w := range ws {
			for _, p := range order {
				v, err := once(ctx, o, p, w)
				if err != nil {
					return nil, fmt.Errorf("%s, sync %s: %w", w.name, p.name, err)
				}
				r := results[w.name+"|"+p.name]
				r.Values = append(r.Values, v)
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "round %d/%d  %-26s sync %-8s %10.1f %s\n", round+1, o.Rounds, w.name, p.name, v, w.unit)
				}
			}
		}
	}
	for _, w := range ws {
		base := results[w.name+"|"+pols[0].name]
		for _, p := range pols {
			r := results[w.name+"|"+p.name]
			r.Median = median(r.Values)
			for i, v := range r.Values {
				r.Ratios = append(r.Ratios, v/base.Values[i])
			}
			r.Ratio = median(r.Ratios)
		}
	}
	rep.LoadAfter = firstLine("/proc/loadavg")
	return rep, nil
}

// once measures w under p on a fresh server with a fresh data directory.
func once(ctx context.Context, o options, p policy, w workload) (float64, error) {
	dir, err := os.MkdirTemp(o.Dir, "planact-durability-*")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: -1, Sync: p.sync})
	if err != nil {
		return 0, err
	}
	defer srv.Stop()
	return w.run(ctx, o, srv)
}

func benchStream(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage})
	return err
}

// publishSerial publishes one message at a time, each waiting for its
// acknowledgement, as a handler that publishes and then acks does.
func publishSerial(ctx context.Context, o options, srv *embedded.Server) (float64, error) {
	nc, err := bus.ConnOptions{URL: srv.ClientURL()}.Dial("bench-publish")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	if err := benchStream(ctx, js); err != nil {
		return 0, err
	}
	data := make([]byte, o.Size)
	start := time.Now()
	n := 0
	for time.Since(start) < o.PublishFor {
		if _, err := js.Publish(ctx, "bench.serial", data); err != nil {
			return 0, err
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// publishWindow keeps o.Window publishes in flight and counts the
// acknowledged ones.
func publishWindow(ctx context.Context, o options, srv *embedded.Server) (float64, error) {
	nc, err := bus.ConnOptions{URL: srv.ClientURL()}.Dial("bench-publish")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(o.Window))
	if err != nil {
		return 0, err
	}
	if err := benchStream(ctx, js); err != nil {
		return 0, err
	}
	data := make([]byte, o.Size)
	var acks []jetstream.PubAckFuture
	start := time.Now()
	for time.Since(start) < o.PublishFor {
		// A full window waits for acknowledgements; with every write
		// flushed, a slow fsync can hold it longer than the default 200ms.
		f, err := js.PublishAsync("bench.window", data, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			return 0, err
		}
		acks = append(acks, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	elapsed := time.Since(start)
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, err
		}
	}
	return float64(len(acks)) / elapsed.Seconds(), nil
}

// rollouts runs o.Rollouts whole rollouts at once through every service,
// with simulated engines of the given latencies (no jitter: the engines'
// randomness is not what is measured), and returns rollouts per second.
func rollouts(plannerTTFT, plannerPerToken, actorTTFT, actorPerToken time.Duration) func(context.Context, options, *embedded.Server) (float64, error) {
	return func(ctx context.Context, o options, srv *embedded.Server) (float64, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		conn := bus.ConnOptions{URL: srv.ClientURL()}
		engines := map[string]string{}
		for role, lat := range map[string][2]time.Duration{
			schema.RolePlanner: {plannerTTFT, plannerPerToken}, schema.RoleActor: {actorTTFT, actorPerToken},
		} {
			u, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: role, Seed: 1, TTFT: lat[0], PerToken: lat[1], WeightVersion: role + "-v1"})
			if err != nil {
				return 0, err
			}
			engines[role] = u
		}
		served := make(chan error, 1)
		go func() {
			served <- stack.Serve(ctx, stack.Services, stack.Options{Provision: true, Conn: conn, Log: zerolog.Nop(), EngineLimit: 512})
		}()
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		err := stack.WaitReady(rctx, conn, stack.Services)
		rcancel()
		if err != nil {
			cancel()
			return 0, errors.Join(err, <-served)
		}
		sum, err := demo.Run(ctx, demo.Options{
			Conn:          conn,
			PlannerEngine: schema.Engine{URL: engines[schema.RolePlanner]},
			ActorEngine:   schema.Engine{URL: engines[schema.RoleActor]},
			Rollouts:      o.Rollouts, Tasks: o.Tasks, SamplesPerPrompt: 1, Concurrent: o.Rollouts,
			Seed: 7, Config: schema.DefaultConfig(), FirstRollout: 1,
		})
		cancel()
		if serr := <-served; err == nil && serr != nil {
			err = serr
		}
		if err != nil {
			return 0, err
		}
		if sum.RolloutsFailed > 0 {
			return 0, fmt.Errorf("%d rollouts failed: %s", sum.RolloutsFailed, strings.Join(sum.Errors, "; "))
		}
		return float64(sum.RolloutsCompleted) / sum.WallSeconds, nil
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

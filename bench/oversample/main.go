// Command oversample measures what over-sampling saves when some tasks
// straggle. A batch of G groups (the copies of one task) runs through every
// service on an embedded server with simulated engines, twice per
// scenario: the baseline, in the same run, waits for every group;
// over-sampling asks for target_groups = G − S and ends as soon as that
// many groups were delivered, stopping the rest. Two scenarios:
//
//   - long-tailed: the actor's time to first token is long-tailed per
//     prompt (exponential, mean -actor-ttft, spread -jitter), as on a loaded
//     server: a few acts take many times the mean;
//   - hung: in S groups one copy's act hangs on the engine until its act
//     time-out (every turn: the planner plans again, and it hangs again).
//
// It prints the wall time of each, the ratio to the baseline, how many
// groups were delivered and how the tasks ended.
//
//	go run ./bench/oversample [-groups 16] [-copies 4] [-stragglers 4] [-act-timeout 10s] [-actor-ttft 200ms] [-jitter 3]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

func main() {
	groups := flag.Int("groups", 16, "groups in the batch")
	copies := flag.Int("copies", 4, "copies of each task (samples per prompt)")
	stragglers := flag.Int("stragglers", 4, "groups not waited for (target_groups = groups − stragglers); in the hung scenario, groups with a hung act")
	actTimeout := flag.Duration("act-timeout", 10*time.Second, "act time-out: how long a hung act holds the baseline back, per turn")
	actorTTFT := flag.Duration("actor-ttft", 200*time.Millisecond, "long-tailed scenario: the actor's mean time to first token")
	jitter := flag.Float64("jitter", 3, "long-tailed scenario: spread of the actor's time to first token (see sim.Config.LatencyJitter)")
	flag.Parse()
	o := options{groups: *groups, copies: *copies, stragglers: *stragglers, actTimeout: *actTimeout, actorTTFT: *actorTTFT, jitter: *jitter}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/oversample:", err)
		os.Exit(1)
	}
}

type options struct {
	groups, copies, stragglers int
	actTimeout, actorTTFT      time.Duration
	jitter                     float64
}

type scenario struct {
	name  string
	actor sim.Config // the actor engine's latency
	hang  bool       // one copy of the last stragglers groups hangs
}

type row struct {
	name   string
	target int
	res    *schema.Result
	wall   time.Duration
}

func run(o options, out io.Writer) error {
	if o.groups < 1 || o.copies < 1 || o.stragglers < 1 || o.stragglers >= o.groups {
		return fmt.Errorf("want groups ≥ 1, copies ≥ 1 and 1 ≤ stragglers < groups (got %d, %d, %d)", o.groups, o.copies, o.stragglers)
	}
	fmt.Fprintf(out, "planact over-sampling benchmark: %d groups × %d copies; target_groups %d\n", o.groups, o.copies, o.groups-o.stragglers)
	scenarios := []scenario{
		{name: fmt.Sprintf("long-tailed (actor ttft mean %v, jitter %.1f)", o.actorTTFT, o.jitter),
			actor: sim.Config{TTFT: o.actorTTFT, PerToken: 200 * time.Microsecond, LatencyJitter: o.jitter}},
		{name: fmt.Sprintf("hung (1 act in %d groups, %v act time-out per turn)", o.stragglers, o.actTimeout),
			actor: sim.Config{TTFT: 30 * time.Millisecond, PerToken: 200 * time.Microsecond, LatencyJitter: 1}, hang: true},
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trollout\twall s\tvs baseline\tgroups delivered\tsamples\ttasks by state\t")
	for i, sc := range scenarios {
		rows, err := measure(o, sc, int64(i))
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		for _, r := range rows {
			delivered := map[int]bool{}
			for _, t := range r.res.Tasks {
				if t.State == schema.TaskTrained {
					delivered[t.GroupIndex] = true
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2fx faster\t%d\t%d\t%s\t\n", sc.name, r.name, r.wall.Seconds(), rows[0].wall.Seconds()/r.wall.Seconds(),
				len(delivered), len(r.res.Samples), states(r.res.Stats.TaskStates))
		}
	}
	return tw.Flush()
}

// measure runs a scenario's baseline and over-sampled rollouts on a fresh
// server, on the same tasks.
func measure(o options, sc scenario, seed int64) ([]row, error) {
	dir, err := os.MkdirTemp("", "planact-bench-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	planner := sim.Config{Role: schema.RolePlanner, Seed: 1, TTFT: 30 * time.Millisecond, PerToken: 200 * time.Microsecond, LatencyJitter: 1, WeightVersion: "planner-v1"}
	actor := sc.actor
	actor.Role, actor.Seed, actor.WeightVersion = schema.RoleActor, 2, "actor-v1"
	engines := map[string]string{}
	for _, cfg := range []sim.Config{planner, actor} {
		u, err := sim.Serve(ctx, "127.0.0.1:0", cfg)
		if err != nil {
			return nil, err
		}
		engines[cfg.Role] = u
	}
	conn := bus.ConnOptions{URL: srv.ClientURL()}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{Provision: true, Conn: conn, Log: zerolog.Nop(), EngineLimit: 512})
	}()
	nc, err := conn.Dial("bench-oversample")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	hung := 0
	if sc.hang {
		hung = o.stragglers
	}
	tasks := batch(o.groups, o.copies, hung, seed)
	rows := []row{{name: "every group (baseline)"}, {name: fmt.Sprintf("target_groups %d", o.groups-o.stragglers), target: o.groups - o.stragglers}}
	for i := range rows {
		r := &rows[i]
		cfg := schema.DefaultConfig()
		cfg.ActTimeoutS, cfg.ActRetries, cfg.StreamGroups, cfg.TargetGroups = o.actTimeout.Seconds(), -1, true, r.target
		begin := time.Now()
		if r.res, err = rollout(ctx, c, int64(i+1), engines, tasks, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", r.name, err)
		}
		r.wall = time.Since(begin)
	}
	cancel()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return rows, nil
}

// batch is groups × copies tasks; the first copy of the last hung groups
// carries a marker that makes its act hang on the simulated engine.
func batch(groups, copies, hung int, seed int64) []schema.Task {
	tasks := demo.Tasks(sim.DefaultWorld(), groups, copies, seed, "")
	for i := range tasks {
		if tasks[i].GroupIndex >= groups-hung && tasks[i].Index%copies == 0 {
			tasks[i].Prompt += " " + sim.FaultActorHang
		}
	}
	return tasks
}

// rollout has both roles arrive and returns the planner's result.
func rollout(ctx context.Context, c *client.Client, n int64, engines map[string]string, tasks []schema.Task, cfg *schema.Config) (*schema.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var res *schema.Result
	var errs [2]error
	wg.Add(2)
	go func() {
		defer wg.Done()
		res, errs[0] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: engines[schema.RolePlanner]},
			WeightVersion: "planner-v1", Tasks: tasks, Config: cfg}, 0)
	}()
	go func() {
		defer wg.Done()
		_, errs[1] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: engines[schema.RoleActor]},
			WeightVersion: "actor-v1"}, 0)
	}()
	wg.Wait()
	return res, errors.Join(errs[:]...)
}

func states(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

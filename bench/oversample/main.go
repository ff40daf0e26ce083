// Command oversample measures what over-sampling saves when a few tasks
// straggle. A batch of G groups (the copies of one task) runs through every
// service on an embedded server with simulated engines; in S of the groups
// one copy's act hangs on the engine until its act time-out. The baseline,
// in the same run, waits for every group (it ends when the stragglers time
// out); over-sampling asks for target_groups = G − S and ends as soon as
// that many groups were delivered, stopping the stragglers. It prints the
// wall time of each, the ratio to the baseline, how many groups were
// delivered and how the tasks ended.
//
//	go run ./bench/oversample [-groups 16] [-copies 4] [-stragglers 4] [-act-timeout 10s]
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
	stragglers := flag.Int("stragglers", 4, "groups with one copy whose act hangs")
	actTimeout := flag.Duration("act-timeout", 10*time.Second, "act time-out: how long a straggler holds the baseline back")
	flag.Parse()
	if err := run(*groups, *copies, *stragglers, *actTimeout, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/oversample:", err)
		os.Exit(1)
	}
}

type row struct {
	name   string
	target int
	res    *schema.Result
	wall   time.Duration
}

func run(groups, copies, stragglers int, actTimeout time.Duration, out io.Writer) error {
	if groups < 1 || copies < 1 || stragglers < 0 || stragglers >= groups {
		return fmt.Errorf("want groups ≥ 1, copies ≥ 1 and 0 ≤ stragglers < groups (got %d, %d, %d)", groups, copies, stragglers)
	}
	dir, err := os.MkdirTemp("", "planact-bench-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{Dir: dir, Port: -1})
	if err != nil {
		return err
	}
	defer srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	engines := map[string]string{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		u, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: role, Seed: 1, TTFT: 30 * time.Millisecond, PerToken: 200 * time.Microsecond,
			LatencyJitter: 1, WeightVersion: role + "-v1"})
		if err != nil {
			return err
		}
		engines[role] = u
	}
	conn := bus.ConnOptions{URL: srv.ClientURL()}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{Conn: conn, Log: zerolog.Nop(), EngineLimit: 512})
	}()
	nc, err := conn.Dial("bench-oversample")
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "planact over-sampling benchmark: %d groups × %d copies; in %d groups one copy's act hangs until its %v time-out (every turn: the planner plans again, and it hangs again)\n",
		groups, copies, stragglers, actTimeout)
	rows := []row{{name: "every group (baseline)"}, {name: fmt.Sprintf("target_groups %d", groups-stragglers), target: groups - stragglers}}
	for i := range rows {
		r := &rows[i]
		tasks := batch(groups, copies, stragglers, int64(i))
		cfg := schema.DefaultConfig()
		cfg.ActTimeoutS, cfg.ActRetries, cfg.StreamGroups, cfg.TargetGroups = actTimeout.Seconds(), -1, true, r.target
		begin := time.Now()
		if r.res, err = rollout(ctx, c, int64(i+1), engines, tasks, &cfg); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		r.wall = time.Since(begin)
	}
	cancel()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\twall s\tvs baseline\tgroups delivered\tsamples\ttasks by state\t")
	for _, r := range rows {
		delivered := map[int]bool{}
		for _, t := range r.res.Tasks {
			if t.State == schema.TaskTrained {
				delivered[t.GroupIndex] = true
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2fx faster\t%d\t%d\t%s\t\n", r.name, r.wall.Seconds(), rows[0].wall.Seconds()/r.wall.Seconds(),
			len(delivered), len(r.res.Samples), states(r.res.Stats.TaskStates))
	}
	return tw.Flush()
}

// batch is groups × copies tasks; the first copy of the last stragglers
// groups carries a marker that makes its act hang on the simulated engine.
func batch(groups, copies, stragglers int, seed int64) []schema.Task {
	tasks := demo.Tasks(sim.DefaultWorld(), groups, copies, seed, "")
	for i := range tasks {
		if tasks[i].GroupIndex >= groups-stragglers && tasks[i].Index%copies == 0 {
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

// Command scaleout measures how acts per second grow with act-dispatcher
// and actor-gateway replicas running as separate processes, when acts take
// time (a simulated actor engine with a fixed latency, 20 ms by default)
// and each actor-gateway bounds the generations it keeps in flight
// (--engine-limit), as a real deployment bounds what one gateway sends to
// its engines. The baseline, in the same run, is one replica of each.
//
// The NATS server, the session-store, planner-gateway and plan-parser, the
// simulated engines and the trainers run in this process; every replica
// of the act-dispatcher and the actor-gateway is a `planact serve` process.
// On a machine with few cores the processes share them: the figures say
// what the machine allows, and the report prints its core count.
//
//	go run ./bench/scaleout [-replicas 1,2,4] [-act 20ms] [-engine-limit 8] [-episodes 128] [-width 8]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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

type options struct {
	replicas    []int
	act         time.Duration
	engineLimit int
	episodes    int
	width       int
	rollouts    int
}

func main() {
	o := options{}
	replicas := flag.String("replicas", "1,2,4", "replica counts to measure, comma-separated (act-dispatchers and actor-gateways each)")
	flag.DurationVar(&o.act, "act", 20*time.Millisecond, "how long an act takes on the simulated actor engine")
	flag.IntVar(&o.engineLimit, "engine-limit", 8, "generations each actor-gateway keeps in flight")
	flag.IntVar(&o.episodes, "episodes", 128, "episodes per rollout")
	flag.IntVar(&o.width, "width", 8, "plan width: independent acts per turn")
	flag.IntVar(&o.rollouts, "rollouts", 2, "rollouts at once per measurement")
	flag.Parse()
	for _, f := range strings.Split(*replicas, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench/scaleout: -replicas %q: want positive integers\n", *replicas)
			os.Exit(2)
		}
		o.replicas = append(o.replicas, n)
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/scaleout:", err)
		os.Exit(1)
	}
}

func run(o options, out io.Writer) error {
	dir, err := os.MkdirTemp("", "planact-scaleout-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "planact")
	if b, err := exec.Command("go", "build", "-o", bin, "./cmd/planact").CombinedOutput(); err != nil {
		return fmt.Errorf("build planact: %v\n%s", err, b)
	}
	fmt.Fprintf(out, "planact scale-out benchmark: %d cores; acts take %v; each actor-gateway keeps %d generations in flight; %d rollouts × %d episodes × %d acts per turn\n",
		runtime.NumCPU(), o.act, o.engineLimit, o.rollouts, o.episodes, o.width)
	fmt.Fprintf(out, "one actor-gateway can at most do %.0f acts/s (engine limit / act time)\n", float64(o.engineLimit)/o.act.Seconds())
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replicas (act-dispatcher + actor-gateway)\tacts\twall s\tacts/s\tvs 1 replica\tideal\t")
	var base float64
	for i, k := range o.replicas {
		acts, wall, err := measure(o, bin, filepath.Join(dir, fmt.Sprint(i)), k)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", k, err)
		}
		rate := float64(acts) / wall.Seconds()
		if base == 0 {
			base = rate / float64(k)
		}
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.0f\t%.2fx\t%dx\t\n", k, acts, wall.Seconds(), rate, rate/base, k)
	}
	return tw.Flush()
}

// measure runs o.rollouts rollouts with k replica processes of the
// act-dispatcher and of the actor-gateway, and returns the acts done and
// the wall time.
func measure(o options, bin, dir string, k int) (int, time.Duration, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	srv, err := embedded.Start(embedded.Options{Dir: filepath.Join(dir, "nats"), Port: -1})
	if err != nil {
		return 0, 0, err
	}
	defer srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	planner, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 1, PlanWidth: o.width, TTFT: time.Millisecond, WeightVersion: "planner-v1"})
	if err != nil {
		return 0, 0, err
	}
	actor, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 2, TTFT: o.act, WeightVersion: "actor-v1"})
	if err != nil {
		return 0, 0, err
	}
	conn := bus.ConnOptions{URL: srv.ClientURL()}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, []string{"session-store", "planner-gateway", "plan-parser"}, stack.Options{Provision: true, Conn: conn, Log: zerolog.Nop(), EngineLimit: 512})
	}()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	for i := range k {
		for _, svc := range []string{"act-dispatcher", "actor-gateway"} {
			logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.log", svc, i)))
			if err != nil {
				return 0, 0, err
			}
			defer logf.Close()
			cmd := exec.CommandContext(ctx, bin, "serve", svc, "--nats", srv.ClientURL(), "--engine-limit", strconv.Itoa(o.engineLimit))
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				return 0, 0, err
			}
			procs = append(procs, cmd)
		}
	}
	nc, err := conn.Dial("bench-scaleout")
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return 0, 0, err
	}
	// A warm-up rollout: every process connected and its consumer made.
	if _, err := rollout(ctx, c, 1000, planner, actor, demo.Tasks(sim.DefaultWorld(), 2, 1, 1, "")); err != nil {
		return 0, 0, fmt.Errorf("warm-up: %w", err)
	}
	begin := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	acts := 0
	var errs []error
	for r := range o.rollouts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := rollout(ctx, c, int64(r+1), planner, actor, demo.Tasks(sim.DefaultWorld(), o.episodes, 1, int64(r), ""))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			acts += res.Stats.Acts
		}()
	}
	wg.Wait()
	wall := time.Since(begin)
	cancel()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	if acts == 0 {
		return 0, 0, errors.New("no act ran")
	}
	return acts, wall, nil
}

// rollout has both roles arrive and returns the planner's result.
func rollout(ctx context.Context, c *client.Client, n int64, planner, actor string, tasks []schema.Task) (*schema.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cfg := schema.DefaultConfig()
	cfg.PlannerSampling.MaxNewTokens = 4096
	var wg sync.WaitGroup
	var res *schema.Result
	var errs [2]error
	wg.Add(2)
	go func() {
		defer wg.Done()
		res, errs[0] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: planner},
			WeightVersion: "planner-v1", Tasks: tasks, Config: &cfg}, 0)
	}()
	go func() {
		defer wg.Done()
		_, errs[1] = c.Rollout(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: actor}, WeightVersion: "actor-v1"}, 0)
	}()
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	if res.Status != schema.ResultOK {
		return nil, fmt.Errorf("rollout %d: %s (%s)", n, res.Status, res.Reason)
	}
	return res, nil
}

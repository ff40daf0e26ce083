// Command rollout benchmarks whole rollouts through every service on an
// embedded server with simulated engines that take time like real ones.
// It compares the scheduling modes on the same tasks (sequential, one act at
// a time, is the baseline measured in the same run), and act-dispatcher
// scale-out, and prints a table; --plot writes a PNG chart.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

type scenario struct {
	name       string
	kind       string // question kinds
	schedule   string
	dispatcher int
	stream     bool // stream_plans
}

type row struct {
	scenario
	sum   *demo.Summary
	ratio float64 // wall time of the baseline / wall time of this row
}

func main() {
	rollouts := flag.Int("rollouts", 4, "rollouts per scenario")
	tasks := flag.Int("tasks", 16, "distinct tasks per rollout")
	plannerTTFT := flag.Duration("planner-ttft", 30*time.Millisecond, "simulated planner's mean time to first token")
	actorTTFT := flag.Duration("actor-ttft", 80*time.Millisecond, "simulated actor's mean time to first token")
	plannerPerToken := flag.Duration("planner-per-token", 500*time.Microsecond, "simulated planner's time per token (a byte)")
	actorPerToken := flag.Duration("actor-per-token", 100*time.Microsecond, "simulated actor's time per token")
	jitter := flag.Float64("jitter", 1, "latency jitter of the simulated engines (see sim.Config)")
	plotPath := flag.String("plot", "", "write a PNG chart of the figures here")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/rollout:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	err := run(*rollouts, *tasks, map[string]time.Duration{schema.RolePlanner: *plannerTTFT, schema.RoleActor: *actorTTFT},
		map[string]time.Duration{schema.RolePlanner: *plannerPerToken, schema.RoleActor: *actorPerToken}, *jitter, *plotPath, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/rollout:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(rollouts, tasks int, ttft, perToken map[string]time.Duration, jitter float64, plotPath string, out io.Writer) error {
	scenarios := []scenario{
		{"mixed: sequential (baseline)", "", schema.ScheduleSequential, 1, false},
		{"mixed: levels", "", schema.ScheduleLevels, 1, false},
		{"mixed: eager", "", schema.ScheduleEager, 1, false},
		{"mixed: eager, 2 act-dispatchers", "", schema.ScheduleEager, 2, false},
		{"parallel: sequential (baseline)", "compare", schema.ScheduleSequential, 1, false},
		{"parallel: levels", "compare", schema.ScheduleLevels, 1, false},
		{"parallel: eager", "compare", schema.ScheduleEager, 1, false},
		{"parallel: eager, streamed plans", "compare", schema.ScheduleEager, 1, true},
	}
	fmt.Fprintf(out, "mixed = the world's question mix (mostly chains); parallel = comparison questions (two independent 2-hop branches)\n")
	fmt.Fprintf(out, "planact rollout benchmark: %d rollouts × %d tasks per scenario; engines: planner ttft %v + %v/token, actor ttft %v + %v/token (jitter %.1f)\n",
		rollouts, tasks, ttft[schema.RolePlanner], perToken[schema.RolePlanner], ttft[schema.RoleActor], perToken[schema.RoleActor], jitter)
	var rows []row
	for _, sc := range scenarios {
		sum, err := measure(sc, rollouts, tasks, ttft, perToken, jitter)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		if sum.RolloutsFailed > 0 {
			return fmt.Errorf("%s: %d rollouts failed: %s", sc.name, sum.RolloutsFailed, strings.Join(sum.Errors, "; "))
		}
		rows = append(rows, row{scenario: sc, sum: sum})
	}
	// The figure of merit is the mean episode latency: how long a trainer
	// waits for the typical episode; wall time is set by the slowest one.
	base := map[string]float64{}
	for _, r := range rows {
		if r.schedule == schema.ScheduleSequential {
			base[r.kind] = r.sum.MeanEpisodeSeconds
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tepisodes\tacts\tturns/ep\tepisode mean s\tepisode p95 s\twall s\tacts/s\tspeed-up vs baseline\t")
	for i := range rows {
		r := &rows[i]
		r.ratio = base[r.kind] / r.sum.MeanEpisodeSeconds
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.3f\t%.3f\t%.2f\t%.1f\t%.2fx\t\n", r.name, r.sum.Episodes, r.sum.Acts, r.sum.MeanTurns,
			r.sum.MeanEpisodeSeconds, r.sum.P95EpisodeSeconds, r.sum.WallSeconds, float64(r.sum.Acts)/r.sum.WallSeconds, r.ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if plotPath != "" {
		if err := chart(rows, plotPath); err != nil {
			return err
		}
		fmt.Fprintf(out, "chart: %s\n", plotPath)
	}
	return nil
}

// measure runs one scenario on a fresh server, so scenarios do not share
// history or warm caches.
func measure(sc scenario, rollouts, tasks int, ttft, perToken map[string]time.Duration, jitter float64) (*demo.Summary, error) {
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
	engines := map[string]string{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		u, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{
			Role: role, Seed: 1, TTFT: ttft[role], PerToken: perToken[role], LatencyJitter: jitter, WeightVersion: role + "-v1",
		})
		if err != nil {
			return nil, err
		}
		engines[role] = u
	}
	served := make(chan error, 1)
	go func() {
		served <- stack.Serve(ctx, stack.Services, stack.Options{
			Conn: bus.ConnOptions{URL: srv.ClientURL()}, Log: zerolog.Nop(), Replicas: map[string]int{"act-dispatcher": sc.dispatcher}, EngineLimit: 512,
			Provision: true,
		})
	}()
	cfg := schema.DefaultConfig()
	cfg.Schedule = sc.schedule
	cfg.StreamPlans = sc.stream
	sum, err := demo.Run(ctx, demo.Options{
		Conn:          bus.ConnOptions{URL: srv.ClientURL()},
		PlannerEngine: schema.Engine{URL: engines[schema.RolePlanner]},
		ActorEngine:   schema.Engine{URL: engines[schema.RoleActor]},
		Rollouts:      rollouts, Tasks: tasks, SamplesPerPrompt: 1, Concurrent: rollouts,
		Seed: 7, Config: cfg, FirstRollout: 1, Kind: sc.kind,
	})
	cancel()
	if serr := <-served; err == nil && serr != nil {
		err = serr
	}
	return sum, err
}

func chart(rows []row, path string) error {
	p := plot.New()
	p.Title.Text = "planact: mean episode latency, speed-up over sequential execution"
	p.Y.Label.Text = "speed-up (×)"
	vals := make(plotter.Values, len(rows))
	names := make([]string, len(rows))
	for i, r := range rows {
		vals[i] = r.ratio
		names[i] = strings.Replace(strings.Replace(r.name, ": ", "\n", 1), " (baseline)", "\n(baseline)", 1)
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(40))
	if err != nil {
		return err
	}
	p.Add(bars)
	p.NominalX(names...)
	return p.Save(11*vg.Inch, 4.5*vg.Inch, path)
}

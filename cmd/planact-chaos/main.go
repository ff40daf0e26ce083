// Command planact-chaos proves planact's crash safety by running the real
// topology as processes and breaking it (chaos), or by running it for a
// long time and watching its resources (soak). See internal/chaos.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
)

const usage = `planact-chaos runs planact's real topology as processes and breaks it.

Usage:
  planact-chaos chaos [flags]   kill -9, SIGSTOP, node and leader loss, cluster restart; check the ledger
  planact-chaos soak [flags]    many rollouts for a long time; sample memory, consumers, keys, objects

Run 'planact-chaos <command> -h' for the flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "planact-chaos:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	switch args[0] {
	case "chaos":
		return runChaos(ctx, args[1:], stdout, stderr)
	case "soak":
		return runSoak(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// common are the flags both commands take.
type common struct {
	topology    string
	duration    time.Duration
	rollouts    int
	concurrency int
	tasks       int
	perPrompt   int
	seed        int64
	out         string
	work        string
	keep        bool
	auth        bool
	history     time.Duration
	results     time.Duration
	logLevel    string
	serveFlags  string
}

func (c *common) register(fs *flag.FlagSet, duration time.Duration, rollouts int) {
	fs.StringVar(&c.topology, "topology", "both", "cluster (three nats-server nodes), single (one node) or both")
	fs.DurationVar(&c.duration, "duration", duration, "how long the run lasts, per topology")
	if rollouts > 0 {
		fs.IntVar(&c.rollouts, "rollouts", rollouts, "rollouts to run, at least (more while faults remain)")
	}
	fs.IntVar(&c.concurrency, "concurrency", 8, "rollouts in flight at once")
	fs.IntVar(&c.tasks, "tasks", 2, "distinct tasks per rollout")
	fs.IntVar(&c.perPrompt, "samples-per-prompt", 2, "copies of each task (episodes per rollout = tasks × this)")
	fs.Int64Var(&c.seed, "seed", 0, "seed of the fault schedule and the tasks (0 = from the clock, printed)")
	fs.StringVar(&c.out, "out", "chaos/results", "directory for the reports")
	fs.StringVar(&c.work, "work", "", "parent of the work directories (configs, data, logs; default: the system's temporary directory)")
	fs.BoolVar(&c.keep, "keep", false, "keep the work directories (logs, JetStream stores) after the run")
	fs.BoolVar(&c.auth, "auth", false, "run NATS with the users and permissions of compose/nats/accounts.conf")
	// The watchdog's stall time-out is 5 minutes by default, as long as a
	// chaos rollout's whole deadline: it would never get the chance to
	// drive on an episode that a fault left without progress. A minute
	// lets the self-healing act within the deadline, as it does within a
	// real rollout's hour.
	fs.StringVar(&c.serveFlags, "serve-flags", "--stall-timeout 1m", "flags for every `planact serve`, space-separated")
	fs.StringVar(&c.logLevel, "log-level", "", "PLANACT_LOG_LEVEL of the services (debug shows why a message was dropped)")
}

// check refuses the numbers a run cannot take: the services would
// otherwise run with a default the user did not ask for.
func (c *common) check(fs *flag.FlagSet) error {
	for _, f := range []struct {
		name string
		n    int
	}{{"concurrency", c.concurrency}, {"tasks", c.tasks}, {"samples-per-prompt", c.perPrompt}} {
		if f.n <= 0 {
			return fmt.Errorf("--%s %d: want at least 1", f.name, f.n)
		}
	}
	if fs.Lookup("rollouts") != nil && c.rollouts <= 0 {
		return fmt.Errorf("--rollouts %d: want at least 1", c.rollouts)
	}
	if c.duration <= 0 {
		return fmt.Errorf("--duration %s: want more than 0", c.duration)
	}
	if c.history < 0 || c.results < 0 {
		return fmt.Errorf("--history %s, --result-retention %s: want 0 (the services' defaults) or more", c.history, c.results)
	}
	return nil
}

// positive refuses a duration flag that is not above 0.
func positive(flags map[string]time.Duration) error {
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		if d := flags[name]; d <= 0 {
			return fmt.Errorf("--%s %s: want more than 0", name, d)
		}
	}
	return nil
}

func (c *common) topologies() ([]string, error) {
	switch c.topology {
	case chaos.Cluster, chaos.Single:
		return []string{c.topology}, nil
	case "both":
		return []string{chaos.Single, chaos.Cluster}, nil
	}
	return nil, fmt.Errorf("--topology %q: want cluster, single or both", c.topology)
}

// prepare finds the repository and builds the binaries.
func (c *common) prepare(ctx context.Context, stdout io.Writer) (root string, bin chaos.Binaries, cleanup func(), err error) {
	if c.seed == 0 {
		c.seed = time.Now().UnixNano() % 1_000_000
	}
	root, err = chaos.RepoRoot(".")
	if err != nil {
		return "", bin, nil, err
	}
	if c.work != "" {
		if err := os.MkdirAll(c.work, 0o755); err != nil {
			return "", bin, nil, err
		}
	}
	binDir, err := os.MkdirTemp(c.work, "planact-chaos-bin-")
	if err != nil {
		return "", bin, nil, err
	}
	cleanup = func() { os.RemoveAll(binDir) }
	fmt.Fprintf(stdout, "building planact and nats-server into %s\n", binDir)
	bin, err = chaos.Build(ctx, root, binDir)
	if err != nil {
		cleanup()
		return "", bin, nil, err
	}
	if !bin.RetentionFlags {
		fmt.Fprintln(stdout, "note: planact serve has no --history/--result-retention: leftovers are counted right after the run")
	}
	return root, bin, cleanup, nil
}

func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs, 3*time.Minute, 100)
	faults := fs.Int("faults", 0, "faults per topology (0 = each kind of the topology once)")
	kinds := fs.String("kinds", "", "comma-separated fault kinds to draw from (default: all of the topology)")
	rolloutTimeout := fs.Duration("rollout-timeout", 5*time.Minute, "rollouts' deadline (rollout_timeout_s); trainers wait the barrier time-out and a minute longer")
	barrierTimeout := fs.Duration("barrier-timeout", time.Minute, "how long one role waits for the other (barrier_timeout_s)")
	actTimeout := fs.Duration("act-timeout", 10*time.Second, "per-attempt act time-out (act_timeout_s)")
	mode := fs.String("mode", schema.ModePlanAct, "the rollouts' coordination mode: "+strings.Join(schema.Modes, ", "))
	pick := fs.String("ensemble-pick", "", "with --mode ensemble: who picks among the candidates: "+strings.Join(schema.EnsemblePicks, ", ")+" (default vote)")
	fs.DurationVar(&c.history, "history", 8*time.Minute, "planact serve --history, when it has the flag (must outlast the barrier and rollout time-outs)")
	fs.DurationVar(&c.results, "result-retention", time.Minute, "planact serve --result-retention, when it has the flag")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("chaos: unexpected arguments %q", fs.Args())
	}
	if err := c.check(fs); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := positive(map[string]time.Duration{"rollout-timeout": *rolloutTimeout, "barrier-timeout": *barrierTimeout, "act-timeout": *actTimeout}); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if *faults < 0 {
		return fmt.Errorf("chaos: --faults %d: want 0 (each kind of the topology once) or more", *faults)
	}
	if !slices.Contains(schema.Modes, *mode) {
		return fmt.Errorf("chaos: --mode %q: want one of %s", *mode, strings.Join(schema.Modes, ", "))
	}
	if err := (schema.Config{Mode: *mode, EnsemblePick: *pick}).WithDefaults().Validate(); *pick != "" && err != nil {
		return fmt.Errorf("chaos: --mode %s --ensemble-pick %q: %w", *mode, *pick, err)
	}
	tops, err := c.topologies()
	if err != nil {
		return err
	}
	if *kinds != "" {
		all := append(chaos.FaultKinds(chaos.Cluster), chaos.FaultKinds(chaos.Single)...)
		for _, k := range strings.Split(*kinds, ",") {
			if !slices.Contains(all, k) {
				return fmt.Errorf("--kinds: no fault %q (faults: %s)", k, strings.Join(slices.Compact(slices.Sorted(slices.Values(all))), ", "))
			}
		}
		// A topology none of the kinds applies to would run with no fault
		// at all (or, with --faults, with every kind): a pass that proves
		// nothing asked for.
		for _, top := range tops {
			if len(topologyKinds(top, *kinds)) == 0 {
				return fmt.Errorf("--kinds %s: none is a fault of the %s topology (its faults: %s)", *kinds, top, strings.Join(chaos.FaultKinds(top), ", "))
			}
		}
	}
	root, bin, cleanup, err := c.prepare(ctx, stdout)
	if err != nil {
		return err
	}
	defer cleanup()
	var reports []*chaos.Report
	for _, top := range tops {
		dir, err := chaos.WorkDir(c.work, top)
		if err != nil {
			return err
		}
		o := chaos.Options{
			Topology: top, Root: root, Bin: bin, Dir: dir, Seed: c.seed,
			Rollouts: c.rollouts, Concurrency: c.concurrency, Tasks: c.tasks, PerPrompt: c.perPrompt,
			Faults: *faults, Span: c.duration, RolloutTimeout: *rolloutTimeout, BarrierTimeout: *barrierTimeout, ActTimeout: *actTimeout, Mode: *mode, EnsemblePick: *pick,
			Retention: chaos.Retention{History: c.history, Results: c.results},
			Auth:      c.auth, LogLevel: c.logLevel, ServeFlags: strings.Fields(c.serveFlags), Progress: stdout,
		}
		o.Kinds = chaos.FaultKinds(top)
		if *kinds != "" {
			o.Kinds = topologyKinds(top, *kinds)
		}
		if o.Faults == 0 {
			o.Faults = len(o.Kinds)
		}
		rep, err := chaos.Run(ctx, o)
		if c.keep || (rep != nil && !rep.Pass) {
			fmt.Fprintf(stdout, "%s: logs and stores kept in %s\n", top, dir)
		} else {
			os.RemoveAll(dir)
		}
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil && ctx.Err() != nil {
			break
		}
	}
	if len(reports) == 0 {
		return errors.New("no run completed")
	}
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, chaos.Markdown(reports))
	if err := chaos.WriteReports(c.out, "chaos", reports); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreports: %s/chaos.md, %s/chaos.json\n", c.out, c.out)
	for _, r := range reports {
		if !r.Pass {
			return fmt.Errorf("%s: the ledger does not balance (see the report)", r.Topology)
		}
	}
	return nil
}

// topologyKinds returns the kinds of the comma-separated list that are
// faults of topology.
func topologyKinds(topology, kinds string) []string {
	var out []string
	for _, k := range strings.Split(kinds, ",") {
		if slices.Contains(chaos.FaultKinds(topology), k) {
			out = append(out, k)
		}
	}
	return out
}

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs, 10*time.Minute, 0)
	interval := fs.Duration("interval", 5*time.Second, "time between samples")
	rolloutTimeout := fs.Duration("rollout-timeout", 2*time.Minute, "rollouts' deadline (rollout_timeout_s); trainers wait the barrier time-out and a minute longer")
	barrierTimeout := fs.Duration("barrier-timeout", time.Minute, "how long one role waits for the other (barrier_timeout_s)")
	fs.DurationVar(&c.history, "history", 4*time.Minute, "planact serve --history, when it has the flag (must outlast the barrier and rollout time-outs)")
	fs.DurationVar(&c.results, "result-retention", time.Minute, "planact serve --result-retention, when it has the flag")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("soak: unexpected arguments %q", fs.Args())
	}
	if err := c.check(fs); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if err := positive(map[string]time.Duration{"interval": *interval, "rollout-timeout": *rolloutTimeout, "barrier-timeout": *barrierTimeout}); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	tops, err := c.topologies()
	if err != nil {
		return err
	}
	root, bin, cleanup, err := c.prepare(ctx, stdout)
	if err != nil {
		return err
	}
	defer cleanup()
	var reports []*chaos.SoakReport
	for _, top := range tops {
		dir, err := chaos.WorkDir(c.work, top)
		if err != nil {
			return err
		}
		rep, err := chaos.Soak(ctx, chaos.SoakOptions{
			Topology: top, Root: root, Bin: bin, Dir: dir, Seed: c.seed,
			Duration: c.duration, Interval: *interval, RolloutTimeout: *rolloutTimeout, BarrierTimeout: *barrierTimeout,
			Concurrency: c.concurrency, Tasks: c.tasks, PerPrompt: c.perPrompt,
			Retention: chaos.Retention{History: c.history, Results: c.results},
			Auth:      c.auth, LogLevel: c.logLevel, ServeFlags: strings.Fields(c.serveFlags), Progress: stdout,
		})
		if c.keep || err != nil || rep != nil && rep.Tally.OK != rep.Tally.Rollouts {
			fmt.Fprintf(stdout, "%s: logs and stores kept in %s\n", top, dir)
		} else {
			os.RemoveAll(dir)
		}
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil && ctx.Err() != nil {
			break
		}
	}
	if len(reports) == 0 {
		return errors.New("no run completed")
	}
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, chaos.SoakMarkdown(reports))
	if err := chaos.WriteSoak(c.out, reports); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreports: %s/soak.md, soak.json, soak-<topology>.csv and .png\n", c.out)
	for _, r := range reports {
		if r.Err != "" || r.Tally.OK != r.Tally.Rollouts {
			return fmt.Errorf("%s: %d of %d rollouts not ok %s", r.Topology, r.Tally.Rollouts-r.Tally.OK, r.Tally.Rollouts, r.Err)
		}
	}
	return nil
}

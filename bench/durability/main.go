// Command durability measures what JetStream's sync policy costs planact:
// raw publish throughput with acknowledgements, and whole rollouts per
// second through every service, each under the server's default (flush
// every two minutes, the baseline), a shorter interval and "always"
// (flush before acknowledging). The policies are measured in the same run,
// interleaved round by round, and every figure is printed as a ratio to
// its baseline, because the machine is shared and noisy.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench/durability:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("durability", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.Policies, "sync", "default,1s,always", "sync policies to compare, comma-separated; the first is the baseline")
	fs.IntVar(&o.Rounds, "rounds", 7, "rounds, the policies back to back within each; a ratio is the median of the per-round ratios")
	fs.DurationVar(&o.PublishFor, "publish-for", 2e9, "how long each publish measurement runs")
	fs.IntVar(&o.Size, "size", 1024, "bytes per published message")
	fs.IntVar(&o.Window, "window", 256, "asynchronous publishes in flight")
	fs.IntVar(&o.Rollouts, "rollouts", 8, "rollouts per rollout measurement, all in flight")
	fs.IntVar(&o.Tasks, "tasks", 8, "tasks (episodes) per rollout")
	fs.StringVar(&o.Dir, "dir", "", "where the data directories go (default: the system's temporary directory); put it on the disk to measure")
	asJSON := fs.Bool("json", false, "print the results as one JSON object")
	render := fs.String("render", "", "measure nothing: print the table of results saved by -json in this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *render != "" {
		data, err := os.ReadFile(*render)
		if err != nil {
			return err
		}
		var rep report
		if err := json.Unmarshal(data, &rep); err != nil {
			return fmt.Errorf("%s: %w", *render, err)
		}
		return rep.WriteTable(stdout)
	}
	if !*asJSON {
		o.Progress = stderr
	}
	rep, err := measure(ctx, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteTable(stdout)
}

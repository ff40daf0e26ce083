package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/internal/web"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/telemetry"
)

// runServe runs one or more services against an existing NATS server, as
// one process of a distributed deployment.
func runServe(ctx context.Context, args []string, getenv func(string) string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	replicas := fs.Int("replicas", 1, "checked (1 to 5) and otherwise unused: serve creates no stream or bucket; planact provision --replicas sets their replicas")
	engineLimit := fs.Int("engine-limit", 64, "generations in flight per engine in each gateway")
	metricsAddr := fs.String("metrics", "", "serve Prometheus /metrics on this address, e.g. :9464")
	pprofAddr := fs.String("pprof", "", "serve Go's runtime profiles (/debug/pprof/: CPU, heap, goroutines) on this address, e.g. 127.0.0.1:6060 (keep it on loopback)")
	webAddr := fs.String("web-addr", web.DefaultAddr, "with the web target: serve the web view on this address (host:port)")
	keep := retentionFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact serve [flags] <service...>   services:", stack.Targets)
		fs.PrintDefaults()
	}
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		fs.Usage()
		return fmt.Errorf("serve: name at least one service")
	}
	if err := stack.Validate(names); err != nil {
		return err
	}
	if flagSet(fs, "web-addr") && !slices.Contains(names, web.Name) {
		return fmt.Errorf("serve: --web-addr is for the %s target, which is not among %v", web.Name, names)
	}
	if *replicas < 1 || *replicas > 5 {
		return fmt.Errorf("serve: --replicas %d: want 1 to 5 (3 on a cluster)", *replicas)
	}
	if *engineLimit < 1 {
		return fmt.Errorf("serve: --engine-limit %d: want at least 1 generation in flight per engine", *engineLimit)
	}
	lo, err := telemetry.LogOptionsFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	conn, err = conn.Resolve(getenv)
	if err != nil {
		return err
	}
	log := telemetry.NewLogger(stderr, lo)
	if _, err := telemetry.ServeMetrics(ctx, *metricsAddr); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if _, err := telemetry.ServeProfiles(ctx, *pprofAddr); err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	tracing, err := telemetry.StartTracing(ctx, getenv, "planact-"+strings.Join(names, "+"))
	if err != nil {
		return err
	}
	o := stack.Options{Conn: conn, Log: log, EngineLimit: *engineLimit, Provisioning: bus.Provisioning{Replicas: *replicas}, WebAddr: *webAddr, Tracing: tracing}
	if err := keep.apply(&o); err != nil {
		return err
	}
	return stack.Serve(ctx, names, o)
}

// parseInterspersed parses flags wherever they stand among the positional
// arguments (`serve actor-gateway --metrics :9464` as well as the reverse),
// which the flag package alone stops at the first positional one.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// flagSet reports whether flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

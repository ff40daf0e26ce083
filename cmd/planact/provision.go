package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/stack"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/telemetry"
)

// runProvision creates or updates what planact keeps in JetStream and the
// services' durable consumers: the step of a deployment run once, as a user
// that may create streams (compose's admin), before the services start.
// The services create nothing themselves, so their users need no right to
// create or change a stream or a consumer.
func runProvision(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("provision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	replicas := fs.Int("replicas", 1, "JetStream replicas of every stream, bucket and store (3 on a cluster)")
	d := bus.DefaultProvisioning()
	history := fs.Duration("history", d.History, "how long rollouts are kept: stream history and each rollout's session (its record)")
	results := fs.Duration("result-retention", d.ResultRetention, "how long a finished rollout's large results stay in the object stores")
	storage := storageFlag(fs)
	shrink := fs.Bool("shrink", false, "lower the history and storage of what exists to those given or the defaults (messages past them are removed at once); without it a run keeps larger limits it finds where --history or --storage is not given")
	dryRun := fs.Bool("dry-run", false, "print the streams, buckets and stores with their limits, and change nothing")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact provision [flags]   (run once, as the admin, before planact serve)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("provision: unexpected arguments %q", fs.Args())
	}
	// Every value is checked here, naming its flag: bus.Provisioning takes
	// 0 for "the default", which a person who wrote 0 did not mean.
	if *replicas < 1 || *replicas > 5 {
		return fmt.Errorf("provision: --replicas %d: want 1 to 5 (3 on a cluster)", *replicas)
	}
	if err := checkRetention(*history, *results); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	lo, err := telemetry.LogOptionsFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	// A history or storage not given is left to the defaults, which never
	// lower what exists (a re-run with no flags keeps a longer history set
	// before); one given is set as given.
	raw := bus.Provisioning{Replicas: *replicas, ResultRetention: *results, Storage: storage.n, Shrink: *shrink}
	if given(fs, "history") {
		raw.History = *history
	}
	p := raw.WithDefaults()
	if err := p.Validate(); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	if *dryRun {
		printLayout(stdout, p)
		return nil
	}
	conn, err = conn.Resolve(getenv)
	if err != nil {
		return err
	}
	log := telemetry.NewLogger(stderr, lo)
	if err := stack.Provision(ctx, stack.Options{Conn: conn, Log: log, Provisioning: p}); err != nil {
		return fmt.Errorf("provision: %w", err)
	}
	fmt.Fprintf(stdout, "planact: provisioned on %s (%d replicas, %s of storage per server)\n", bus.Redact(conn.Servers()), p.Replicas, bus.FormatBytes(p.Storage))
	printLayout(stdout, p)
	return nil
}

// printLayout writes what provisioning makes: every stream with its
// subjects and limits, every bucket and store with its limit.
func printLayout(w io.Writer, p bus.Provisioning) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "stream\tmax bytes\tmax message\twhen full\tsubjects")
	for _, c := range p.StreamConfigs() {
		msg := "—"
		if c.MaxMsgSize > 0 {
			msg = bus.FormatBytes(int64(c.MaxMsgSize))
		}
		full := "refuses new"
		if c.Discard == jetstream.DiscardOld {
			full = "drops oldest"
		}
		var extra []string
		if c.AllowMsgSchedules {
			extra = append(extra, "schedules")
		}
		if c.AllowRollup {
			extra = append(extra, "roll-ups")
		}
		if c.DenyPurge && c.DenyDelete {
			extra = append(extra, "no purge or delete")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s)\n", c.Name, bus.FormatBytes(c.MaxBytes), msg, full, strings.Join(c.Subjects, " "), strings.Join(extra, ", "))
	}
	for _, c := range p.KeyValueConfigs() {
		fmt.Fprintf(tw, "KV_%s\t%s\t—\trefuses new\tbucket %s\n", c.Bucket, bus.FormatBytes(c.MaxBytes), c.Bucket)
	}
	for _, c := range p.ObjectStoreConfigs() {
		fmt.Fprintf(tw, "OBJ_%s\t%s\t—\trefuses new\tobject store %s\n", c.Bucket, bus.FormatBytes(c.MaxBytes), c.Bucket)
	}
	_ = tw.Flush()
}

// sizeFlag is a flag holding a size: 16G, 512M, a number of bytes, at
// least min.
type sizeFlag struct {
	n   int64
	min int64
}

func (s *sizeFlag) String() string {
	if s == nil || s.n == 0 {
		return ""
	}
	return bus.FormatBytes(s.n)
}

func (s *sizeFlag) Set(v string) error {
	n, err := bus.ParseBytes(v)
	if err != nil {
		return err
	}
	// 0 (or 0.5, a fraction of a byte) is not "the default" either.
	if n < s.min {
		return fmt.Errorf("size %q: want at least %s", v, bus.FormatBytes(s.min))
	}
	s.n = n
	return nil
}

// storageFlag registers --storage on fs; its value is 0 when not given.
func storageFlag(fs *flag.FlagSet) *sizeFlag {
	s := &sizeFlag{min: bus.MinStorage}
	fs.Var(s, "storage", fmt.Sprintf("JetStream storage planact may fill on each server, shared out among its streams (default %s, at least %s; docs/security.md, Limits)",
		bus.FormatBytes(bus.DefaultStorage), bus.FormatBytes(bus.MinStorage)))
	return s
}

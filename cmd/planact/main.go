// Command planact runs planact: every service in one process (up), one or
// more services against a NATS cluster (serve), the simulated engines (sim),
// and the tools around them (parse, decode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `planact coordinates Plan/Act rollouts over NATS JetStream.

Usage:
  planact up [--demo] [--json] [flags]     embedded nats-server + the five services (+ simulated engines)
  planact provision [flags]                create planact's streams, buckets and consumers (once, as the admin)
  planact serve <service...>               run services against $NATS_URL
  planact sim [flags]                      run the simulated planner and actor engines
  planact parse [--format f] [--dot] [file] parse a plan and print its IR (or DOT)
  planact submit --rollout N [flags]       play one or both trainers for one rollout
  planact watch [-v] [rollout]             follow rollouts live: a progress line per rollout (-v: per message)
  planact inspect [--dot] <rollout> [ep]   a rollout's episodes and plans, or one episode's turns and act timeline
  planact replay <rollout> [ep]            run a recorded rollout again through today's planact, its engines' outputs
                                           as recorded, and report every difference (--from FILE, --record FILE,
                                           --planner URL: another planner's answer to the first prompt, side by side)
  planact decode [file]                    msgpack body (stdin or file) -> JSON; for nats --translate
  planact version

Services: session-store, planner-gateway, plan-parser, act-dispatcher, actor-gateway.
Run 'planact <command> -h' for the flags of a command.
`

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(ctx, err, os.Stderr))
}

// exitCode says how a command ended: 0 when it did its work or printed the
// help it was asked for, 130 (as shells report SIGINT) when it was
// interrupted, saying so once, 1 with the error otherwise.
func exitCode(ctx context.Context, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, errInterrupted)):
		fmt.Fprintln(stderr, "planact: interrupted")
		return 130
	}
	fmt.Fprintln(stderr, "planact:", err)
	return 1
}

// errInterrupted is what a command returns when its context ended before
// its work did (Ctrl-C, SIGTERM).
var errInterrupted = errors.New("interrupted")

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "up":
		return runUp(ctx, rest, getenv, stdout, stderr)
	case "provision":
		return runProvision(ctx, rest, getenv, stdout, stderr)
	case "serve":
		return runServe(ctx, rest, getenv, stdout, stderr)
	case "sim":
		return runSim(ctx, rest, stdout, stderr)
	case "parse":
		return runParse(ctx, rest, stdin, stdout, stderr)
	case "submit":
		return runSubmit(ctx, rest, getenv, stdout, stderr)
	case "watch":
		return runWatch(ctx, rest, getenv, stdout, stderr)
	case "inspect":
		return runInspect(ctx, rest, getenv, stdout, stderr)
	case "replay":
		return runReplay(ctx, rest, getenv, stdout, stderr)
	case "decode":
		return runDecode(ctx, rest, stdin, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "planact", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// Command step runs one realistic RL training step end to end, every part
// a process of its own, and measures what planact costs there: a
// nats-server (built from the module cache, configured as compose's), the
// five services as `planact serve` processes (replicas per service), an
// engine process serving a planner engine and an actor engine with a
// latency model (a limit of generations at once like continuous batching,
// long-tailed times to first token and per token, drawn output lengths,
// plan widths and turn counts, a few stragglers), and two trainer
// processes, the planner's job and the actor's, each with pkg/client,
// training asynchronously: rollout N+1 arrives while N is consumed, groups
// stream as they complete, the rollout ends at its target groups, and each
// job pauses its role, swaps weights and resumes between steps.
//
// It reports, measured in the same run: the makespan against the
// engine-bound lower bound computed from the latencies the engines drew;
// CPU-seconds per act and per engine call of every planact process and of
// nats-server (from /proc; engines and trainers apart); peak RSS per
// process; stored and NATS messages per act; duplicate engine calls per
// planner turn and per act; engine utilisation over time; and raw
// JetStream publish+consume of act-sized messages on the same server, the
// baseline every per-act figure is divided by. See docs/benchmarks.md.
//
//	go run ./bench/step                      # 256 prompts × 8 copies, 2 rollouts: a few minutes
//	go run ./bench/step -quick               # 16 × 4: about a minute, printed only
//	go run ./bench/step -replicas act-dispatcher=2,actor-gateway=2 -planner-limit 256
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
		fmt.Fprintln(os.Stderr, "bench/step:", err)
		os.Exit(1)
	}
}

// run dispatches on -role: the harness (default), or one of the processes
// it starts by running its own binary again.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) >= 2 && args[0] == "-role" {
		return runRole(ctx, args[1], args[2:], stdout)
	}
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	return runHarness(ctx, o, stdout)
}

// runRole runs a process of the run: "engines" or "trainer", from a JSON
// spec the harness wrote.
func runRole(ctx context.Context, role string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	spec := fs.String("spec", "", "the JSON spec the harness wrote")
	out := fs.String("out", "", "where to write what the process did (trainer)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	data, err := os.ReadFile(*spec)
	if err != nil {
		return err
	}
	switch role {
	case "engines":
		var o engineSpec
		if err := json.Unmarshal(data, &o); err != nil {
			return fmt.Errorf("engines spec: %w", err)
		}
		return runEngines(ctx, o, stdout)
	case "trainer":
		var o trainerOptions
		if err := json.Unmarshal(data, &o); err != nil {
			return fmt.Errorf("trainer spec: %w", err)
		}
		return runTrainer(ctx, o, *out)
	}
	return fmt.Errorf("-role %q: want engines or trainer", role)
}

// engineSpec says what the engine process serves.
type engineSpec struct {
	Model         Model  `json:"model"`
	PlannerAddr   string `json:"planner_addr"`
	ActorAddr     string `json:"actor_addr"`
	PlannerWeight string `json:"planner_weight_version"`
	ActorWeight   string `json:"actor_weight_version"`
}

// engineReady is what the engine process prints once it serves.
const engineReady = "bench engines ready"

func runEngines(ctx context.Context, o engineSpec, stdout io.Writer) error {
	if err := o.Model.Check(); err != nil {
		return err
	}
	s := &scripts{m: &o.Model, by: map[[2]int64]*Episode{}}
	pu, err := serveEngine(ctx, o.PlannerAddr, newBenchEngine(rolePlanner, o.Model.Planner, s, o.PlannerWeight))
	if err != nil {
		return err
	}
	au, err := serveEngine(ctx, o.ActorAddr, newBenchEngine(roleActor, o.Model.Actor, s, o.ActorWeight))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: planner %s, actor %s\n", engineReady, pu, au)
	<-ctx.Done()
	return nil
}

// Roles of the engines, as planact names them.
const (
	rolePlanner = "planner"
	roleActor   = "actor"
)

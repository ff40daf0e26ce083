// Command overhead measures what planact's coordination costs against raw
// NATS/JetStream on the same server, in one run:
//
// Baselines, no planact code: (1) JetStream async publish and a pull
// consumer at once, act-sized messages, on a file stream of their own;
// (2) sequential key-value compare-and-set on one key; (3) a core NATS
// request/reply round trip.
//
// planact, every service through internal/stack on the same server, with
// simulated engines served over HTTP: (4) acts per second at plan widths
// 1, 4, 14 and 28 with many episodes in flight and engines of zero
// latency, as a fraction of (1); (5) the latency planact adds per act and
// per turn under light load, against (3); (6) the barrier: from the second
// arrival's acknowledgement to the rollout's start; (7) eager release:
// episode makespan over its critical path when engine latency dominates,
// at 1 and 64 episodes in flight; (8) per act: stored JetStream messages,
// NATS messages, key-value operations, compare-and-set conflicts and CPU.
//
// It prints a table with each figure, its ratio to its baseline and the
// goals of the issue "Coordination cost: a tenth of raw JetStream, flat
// under load"; -json writes every figure, -plot a PNG. -cluster runs the
// same on a three-node JetStream cluster on loopback (R3 streams and
// buckets, the baselines included); -in-process connects the services to
// the one server in process, as `planact up` does.
//
//	go run ./bench/overhead [-quick] [-cluster | -in-process] [-json out.json] [-plot out.png]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// options size the run; -quick shrinks every one of them.
type options struct {
	Cluster bool `json:"cluster"`
	// InProcess connects the services to the embedded server in process,
	// as `planact up` does; the trainers and baselines still dial it.
	InProcess bool `json:"in_process,omitempty"`
	Quick     bool `json:"quick"`

	// Baselines.
	PubMessages int `json:"pub_messages"` // messages per publish+consume repeat
	PubRepeats  int `json:"pub_repeats"`
	PubInFlight int `json:"pub_in_flight"` // async publishes awaiting their ack
	KVOps       int `json:"kv_ops"`
	Requests    int `json:"requests"`

	// Throughput (4, 8).
	Widths      []int `json:"widths"`
	Episodes    int   `json:"episodes_per_rollout"`
	Concurrent  int   `json:"rollouts_in_flight"`
	ActsPerRun  int   `json:"acts_per_width"` // at least this many acts per width
	MinRollouts int   `json:"min_rollouts"`   // at least this many rollouts per width

	// Light load (5, 6): sequential one-task rollouts per width.
	LightWidths   []int `json:"light_widths"`
	LightRollouts int   `json:"light_rollouts_per_width"`

	// Eager release (7).
	EagerSequential int           `json:"eager_sequential_episodes"` // one in flight
	EagerBatch      int           `json:"eager_batch"`               // episodes in flight
	EagerRollouts   int           `json:"eager_batch_rollouts"`
	PlannerTTFT     time.Duration `json:"planner_ttft_ns"`
	PlannerPerToken time.Duration `json:"planner_per_token_ns"`
	ActorTTFT       time.Duration `json:"actor_ttft_ns"`

	RolloutTimeout time.Duration  `json:"rollout_timeout_ns"`
	Log            zerolog.Logger `json:"-"` // the services'
}

func defaults(quick bool) options {
	o := options{
		Quick:       quick,
		PubMessages: 10000, PubRepeats: 7, PubInFlight: 256, KVOps: 5000, Requests: 10000,
		Widths: []int{1, 4, 14, 28}, Episodes: 64, Concurrent: 4, ActsPerRun: 6000, MinRollouts: 8,
		LightWidths: []int{1, 4}, LightRollouts: 150,
		EagerSequential: 50, EagerBatch: 64, EagerRollouts: 3,
		PlannerTTFT: 20 * time.Millisecond, PlannerPerToken: 100 * time.Microsecond, ActorTTFT: 20 * time.Millisecond,
		RolloutTimeout: 3 * time.Minute,
	}
	if quick {
		o.PubMessages, o.PubRepeats, o.KVOps, o.Requests = 1000, 3, 300, 500
		o.Episodes, o.Concurrent, o.ActsPerRun, o.MinRollouts = 16, 2, 200, 2
		o.LightRollouts = 15
		o.EagerSequential, o.EagerRollouts = 6, 1
	}
	return o
}

func main() {
	quick := flag.Bool("quick", false, "a quick run: small sizes everywhere (figures are noisier)")
	cluster := flag.Bool("cluster", false, "run on a three-node JetStream cluster on loopback (R3 streams and buckets); services and the client on different nodes")
	inProcess := flag.Bool("in-process", false, "connect the services to the embedded server in process, as `planact up` does (no socket between them); the trainers and the baselines still connect over TCP")
	jsonPath := flag.String("json", "", "write every figure as JSON to this file (- for standard output, the table then goes to standard error)")
	plotPath := flag.String("plot", "", "write a PNG chart here")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	// Sizes: zero keeps the default (or -quick's).
	pubMessages := flag.Int("pub-messages", 0, "baseline 1: messages per repeat")
	pubRepeats := flag.Int("pub-repeats", 0, "baseline 1: repeats (the median is taken)")
	pubInFlight := flag.Int("pub-in-flight", 0, "baseline 1: async publishes in flight at most")
	kvOps := flag.Int("kv-ops", 0, "baseline 2: compare-and-set updates")
	requests := flag.Int("requests", 0, "baseline 3: request/reply round trips")
	widths := flag.String("widths", "", "plan widths of the throughput runs, comma-separated (default 1,4,14,28)")
	episodes := flag.Int("episodes", 0, "throughput: episodes per rollout")
	concurrent := flag.Int("concurrent", 0, "throughput: rollouts in flight at once")
	acts := flag.Int("acts", 0, "throughput: at least this many acts per width")
	light := flag.Int("light", 0, "light load: sequential one-task rollouts per width (1 and 4)")
	eagerSeq := flag.Int("eager-sequential", 0, "eager: episodes run one at a time")
	eagerBatch := flag.Int("eager-batch", 0, "eager: episodes in flight in the loaded case")
	eagerRollouts := flag.Int("eager-rollouts", 0, "eager: rollouts of -eager-batch episodes, one after the other")
	eagerEngine := flag.Duration("eager-engine", 0, "eager: the simulated engines' time to first token, planner and actor (default 20ms); longer makes engine time dominate on a small machine")
	logLevel := flag.String("log", "", "the services' log level (debug, info, warn, error), as JSON on standard error; default none")
	rolloutTimeout := flag.Duration("rollout-timeout", 0, "how long one rollout may take before the run fails (default 3m)")
	flag.Parse()

	o := defaults(*quick)
	o.Cluster, o.InProcess = *cluster, *inProcess
	if o.Cluster && o.InProcess {
		fail(errors.New("-in-process: not with -cluster (the services of a cluster reach its nodes over the network)"))
	}
	set := func(dst *int, v int) {
		if v > 0 {
			*dst = v
		}
	}
	set(&o.PubMessages, *pubMessages)
	set(&o.PubRepeats, *pubRepeats)
	set(&o.PubInFlight, *pubInFlight)
	set(&o.KVOps, *kvOps)
	set(&o.Requests, *requests)
	set(&o.Episodes, *episodes)
	set(&o.Concurrent, *concurrent)
	set(&o.ActsPerRun, *acts)
	set(&o.LightRollouts, *light)
	set(&o.EagerSequential, *eagerSeq)
	set(&o.EagerBatch, *eagerBatch)
	set(&o.EagerRollouts, *eagerRollouts)
	if *logLevel != "" {
		lvl, err := zerolog.ParseLevel(*logLevel)
		if err != nil {
			fail(fmt.Errorf("-log: %w", err))
		}
		o.Log = zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
	} else {
		o.Log = zerolog.Nop()
	}
	if *eagerEngine < 0 {
		fail(fmt.Errorf("-eager-engine %v: want a positive duration", *eagerEngine))
	}
	if *eagerEngine > 0 {
		o.PlannerTTFT, o.ActorTTFT = *eagerEngine, *eagerEngine
	}
	if *rolloutTimeout > 0 {
		o.RolloutTimeout = *rolloutTimeout
	}
	if *widths != "" {
		ws, err := parseInts(*widths)
		if err != nil {
			fail(fmt.Errorf("-widths: %w", err))
		}
		o.Widths = ws
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	rep, err := run(ctx, o, os.Stderr)
	if err != nil {
		pprof.StopCPUProfile()
		fail(err)
	}
	table := io.Writer(os.Stdout)
	if *jsonPath == "-" {
		table = os.Stderr
	}
	if err := rep.print(table); err != nil {
		fail(err)
	}
	if *jsonPath != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			fail(err)
		}
		data = append(data, '\n')
		if *jsonPath == "-" {
			_, err = os.Stdout.Write(data)
		} else {
			err = os.WriteFile(*jsonPath, data, 0o644)
		}
		if err != nil {
			fail(err)
		}
	}
	if *plotPath != "" {
		if err := rep.chart(*plotPath); err != nil {
			fail(fmt.Errorf("plot: %w", err))
		}
		fmt.Fprintf(table, "chart: %s\n", *plotPath)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/overhead: FAILED:", err)
	os.Exit(1)
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q: want positive integers", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// progress reports what the run is doing, on standard error.
type progress struct {
	w     io.Writer
	start time.Time
}

func (p *progress) say(format string, a ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, a...))
	}
}

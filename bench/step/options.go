package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
)

// options are the harness's flags.
type options struct {
	Prompts    int     `json:"prompts"`
	Copies     int     `json:"copies"`
	Rollouts   int     `json:"rollouts"`
	TargetFrac float64 `json:"target_frac"`
	// TargetGroups is what the rollouts ask for (target_groups): ⌈Prompts ×
	// TargetFrac⌉, 0 when that is every group.
	TargetGroups int            `json:"target_groups"`
	Replicas     map[string]int `json:"replicas"`
	ServeFlags   []string       `json:"serve_flags,omitempty"`
	ServeEnv     []string       `json:"serve_env,omitempty"`
	NATSEnv      []string       `json:"nats_env,omitempty"`
	// OneProcess runs the server and every service in one `planact up`
	// process, the services connected in process (no sockets between them).
	OneProcess bool          `json:"one_process,omitempty"`
	Swap       time.Duration `json:"swap"`
	// StateCapacity: the trainers state each engine's limit in their
	// arrivals (engine.max_in_flight), so planact keeps it full.
	StateCapacity bool `json:"state_capacity"`
	PauseAbort    bool `json:"pause_abort"`
	// ResultSamples is the rollouts' result_samples: the trainers take the
	// groups as they come, and ask for the result without them.
	ResultSamples string        `json:"result_samples"`
	RawMessages   int           `json:"raw_messages"`
	Timeout       time.Duration `json:"timeout"`
	Out           string        `json:"-"`
	Name          string        `json:"name"`
	Keep          bool          `json:"-"`
	Tally         bool          `json:"tally,omitempty"`
	Profile       string        `json:"-"`
	Quick         bool          `json:"quick"`
	Model         Model         `json:"model"`
}

// defaultModel is the step's default workload. Token counts are those of
// a reasoning planner (hundreds of tokens a turn) and a terse actor; times
// are shortened about tenfold from a 70B and a 7B model on GPUs so that a
// 2048-episode step takes minutes, not an hour (every time scales with the
// flags).
func defaultModel() Model {
	return Model{
		Seed: 1,
		Planner: EngineModel{Limit: 128,
			TTFT: LogNormal{0.150, 0.5}, PerToken: LogNormal{0.003, 0.3}, Tokens: LogNormal{300, 0.5},
			MaxTokens: 3000, Stragglers: 0.02, Slowdown: [2]float64{4, 10}},
		Actor: EngineModel{Limit: 256,
			TTFT: LogNormal{0.050, 0.5}, PerToken: LogNormal{0.0015, 0.3}, Tokens: LogNormal{100, 0.6},
			MaxTokens: 1000, Stragglers: 0.02, Slowdown: [2]float64{4, 10}},
		Turns:        Discrete{{1, 5}, {2, 40}, {3, 30}, {4, 15}, {5, 10}},
		Width:        Discrete{{1, 20}, {2, 25}, {3, 20}, {4, 15}, {6, 10}, {8, 7}, {12, 3}},
		DepRate:      0.25,
		PromptTokens: LogNormal{300, 0.4},
		Correct:      0.6,
		Copies:       8,
	}
}

// engineFlags binds one engine's model to flags prefixed with role.
func engineFlags(fs *flag.FlagSet, role string, em *EngineModel) {
	fs.IntVar(&em.Limit, role+"-limit", em.Limit, "generations the "+role+" engine serves at once (continuous batching); more wait in arrival order")
	durFlag(fs, role+"-ttft", &em.TTFT.Median, "median time to first token of the "+role+" engine")
	fs.Float64Var(&em.TTFT.Sigma, role+"-ttft-sigma", em.TTFT.Sigma, "log-normal σ of the "+role+"'s time to first token")
	durFlag(fs, role+"-per-token", &em.PerToken.Median, "median time per output token of the "+role+" engine")
	fs.Float64Var(&em.PerToken.Sigma, role+"-per-token-sigma", em.PerToken.Sigma, "log-normal σ of the "+role+"'s time per token")
	fs.Float64Var(&em.Tokens.Median, role+"-tokens", em.Tokens.Median, "median output tokens of a "+role+" generation")
	fs.Float64Var(&em.Tokens.Sigma, role+"-tokens-sigma", em.Tokens.Sigma, "log-normal σ of the "+role+"'s output length")
	fs.IntVar(&em.MaxTokens, role+"-max-tokens", em.MaxTokens, "cap on a "+role+" generation's drawn length")
	fs.IntVar(&em.QueueLimit, role+"-queue-limit", em.QueueLimit, "requests the "+role+" engine lets wait for a slot; more are answered 429 with Retry-After (0: no bound)")
}

// durFlag binds a duration flag to seconds in a float.
func durFlag(fs *flag.FlagSet, name string, secs *float64, usage string) {
	fs.Func(name, fmt.Sprintf("%s (default %v)", usage, seconds(*secs)), func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration ≥ 0, e.g. 150ms")
		}
		*secs = d.Seconds()
		return nil
	})
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	o := options{Prompts: 256, Copies: 8, Rollouts: 2, TargetFrac: 15.0 / 16, Swap: time.Second, PauseAbort: true, ResultSamples: schema.ResultSamplesUndelivered,
		RawMessages: 20000, Timeout: 30 * time.Minute, Out: "bench/results", Name: "step", Model: defaultModel()}
	fs := flag.NewFlagSet("step", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.Quick, "quick", false, "a quick step: 16 prompts × 4 copies, printed only (flags given override; with -out, files named step-quick)")
	fs.IntVar(&o.Prompts, "prompts", o.Prompts, "prompts (tasks) per rollout: slime's rollout_batch_size")
	fs.IntVar(&o.Model.Copies, "copies", o.Model.Copies, "copies of each prompt (a group): slime's n_samples_per_prompt")
	fs.IntVar(&o.Rollouts, "rollouts", o.Rollouts, "rollouts (training steps) in the run; each after the first arrives while the one before is consumed")
	fs.Float64Var(&o.TargetFrac, "target-frac", o.TargetFrac, "target_groups as a fraction of the prompts (over-sampling: the rollout ends when this many groups are complete); 1 waits for every group")
	replicas := fs.String("replicas", "", "planact serve processes per service, e.g. act-dispatcher=2,actor-gateway=2 (default 1 each)")
	serveEnv := fs.String("serve-env", "", "environment variables for every `planact serve`, space-separated NAME=value, e.g. \"GOMAXPROCS=1\"")
	natsEnv := fs.String("nats-env", "", "environment variables for nats-server, space-separated NAME=value, e.g. \"GOMAXPROCS=1\"")
	fs.BoolVar(&o.OneProcess, "one-process", false, "run nats-server and the five services in one `planact up` process (its embedded server, the services connected in process, sync 1s) instead of nats-server and one `planact serve` per service; -serve-env and -serve-flags go to it")
	serveFlags := fs.String("serve-flags", "", "more flags for every `planact serve`, space-separated, e.g. \"--engine-limit 128\"")
	fs.BoolVar(&o.StateCapacity, "state-capacity", true, "the trainers state each engine's limit in their arrival (engine.max_in_flight); false leaves it to --engine-limit")
	fs.DurationVar(&o.Swap, "swap", o.Swap, "how long each trainer's weight swap takes between two rollouts (its role paused)")
	fs.BoolVar(&o.PauseAbort, "pause-abort", o.PauseAbort, "pause with abort (generations running are aborted and sent again after the resume); false waits for them")
	fs.StringVar(&o.ResultSamples, "result-samples", o.ResultSamples, "the rollouts' result_samples: undelivered (the results leave out the groups the trainers took as they came) or all (every delivered group's samples again)")
	fs.IntVar(&o.RawMessages, "raw-messages", o.RawMessages, "messages per repeat of the raw JetStream baseline (3 repeats)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "give up on the step after this long")
	fs.StringVar(&o.Out, "out", o.Out, "write <name>.txt, .json and .png here (\"\": print only)")
	fs.StringVar(&o.Name, "name", o.Name, "the results' file name")
	fs.BoolVar(&o.Keep, "keep", false, "keep the work directory (logs of every process, the engines' call logs)")
	fs.BoolVar(&o.Tally, "tally", false, "count the step's NATS messages by kind (publish, delivery, ack, pull, direct get, reply) with a subscriber to every subject; it loads the server, so read CPU from a run without it")
	fs.StringVar(&o.Profile, "profile", "", "collect CPU profiles of every service and of nats-server over the step into this directory: <process>.pb.gz (go tool pprof reads them) and profiles.txt, each process's top functions and packages; and each process's heap allocations over its life, <process>.allocs.pb.gz (go tool pprof -sample_index=alloc_space)")
	m := &o.Model
	fs.Int64Var(&m.Seed, "seed", m.Seed, "seed of every draw")
	engineFlags(fs, rolePlanner, &m.Planner)
	engineFlags(fs, roleActor, &m.Actor)
	stragglers := fs.Float64("stragglers", m.Planner.Stragglers, "fraction of generations (either engine) slowed down")
	slowdown := fs.String("slowdown", "4:10", "a straggler's slowdown, low:high (uniform)")
	turns := fs.String("turns", m.Turns.String(), "planner turns per episode, value:weight,… (the last turn answers)")
	width := fs.String("width", m.Width.String(), "acts per plan, value:weight,…")
	fs.Float64Var(&m.DepRate, "dep-rate", m.DepRate, "probability that an act depends on an earlier act of its plan")
	fs.Float64Var(&m.PromptTokens.Median, "prompt-tokens", m.PromptTokens.Median, "median task prompt length in tokens")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.Quick {
		if !set["prompts"] {
			o.Prompts = 16
		}
		if !set["copies"] {
			m.Copies = 4
		}
		if !set["name"] {
			o.Name = "step-quick"
		}
		if !set["out"] {
			o.Out = "" // print only: make bench leaves the tree as it was
		}
		if !set["raw-messages"] {
			o.RawMessages = 10000
		}
	}
	var errs []error
	var err error
	if m.Turns, err = ParseDiscrete(*turns); err != nil {
		errs = append(errs, fmt.Errorf("-turns: %w", err))
	}
	if m.Width, err = ParseDiscrete(*width); err != nil {
		errs = append(errs, fmt.Errorf("-width: %w", err))
	}
	lo, hi, ok := strings.Cut(*slowdown, ":")
	l, err1 := strconv.ParseFloat(lo, 64)
	h, err2 := strconv.ParseFloat(hi, 64)
	if !ok || err1 != nil || err2 != nil {
		errs = append(errs, fmt.Errorf("-slowdown %q: want low:high, e.g. 4:10", *slowdown))
	}
	m.Planner.Stragglers, m.Actor.Stragglers = *stragglers, *stragglers
	m.Planner.Slowdown, m.Actor.Slowdown = [2]float64{l, h}, [2]float64{l, h}
	if o.Replicas, err = parseReplicas(*replicas); err != nil {
		errs = append(errs, fmt.Errorf("-replicas: %w", err))
	}
	o.ServeFlags = strings.Fields(*serveFlags)
	o.ServeEnv, errs = parseEnv("-serve-env", *serveEnv, errs)
	o.NATSEnv, errs = parseEnv("-nats-env", *natsEnv, errs)
	switch {
	case o.Prompts < 1:
		errs = append(errs, fmt.Errorf("-prompts %d: want ≥ 1", o.Prompts))
	case o.Rollouts < 1:
		errs = append(errs, fmt.Errorf("-rollouts %d: want ≥ 1", o.Rollouts))
	case !(o.TargetFrac > 0 && o.TargetFrac <= 1):
		errs = append(errs, fmt.Errorf("-target-frac %g: want above 0 and at most 1", o.TargetFrac))
	case o.Swap < 0:
		errs = append(errs, fmt.Errorf("-swap %v: want ≥ 0", o.Swap))
	case o.RawMessages < 100:
		errs = append(errs, fmt.Errorf("-raw-messages %d: want ≥ 100", o.RawMessages))
	case o.Name == "" || strings.ContainsRune(o.Name, '/'):
		errs = append(errs, fmt.Errorf("-name %q: want a file name", o.Name))
	}
	if err := m.Check(); err != nil {
		errs = append(errs, err)
	}
	if o.OneProcess {
		for _, f := range []string{"replicas", "nats-env"} {
			if set[f] {
				errs = append(errs, fmt.Errorf("-%s: not with -one-process (one process serves once each service, and its server)", f))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	o.TargetGroups = int(math.Ceil(float64(o.Prompts) * o.TargetFrac))
	if o.TargetGroups >= o.Prompts {
		o.TargetGroups = 0
	}
	// The rollouts' config, as planact will check it (-result-samples, the
	// limits the model needs): refused here, not by the first arrival.
	if err := stepConfig(o).WithDefaults().Validate(); err != nil {
		return o, fmt.Errorf("the rollouts' config: %w", err)
	}
	return o, nil
}

// parseReplicas reads "act-dispatcher=2,actor-gateway=2"; every service
// gets 1 unless named.
func parseReplicas(s string) (map[string]int, error) {
	r := map[string]int{}
	for _, name := range chaos.ServiceNames {
		r[name] = 1
	}
	if strings.TrimSpace(s) == "" {
		return r, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(f), "=")
		k, err := strconv.Atoi(n)
		if !ok || err != nil || k < 1 {
			return nil, fmt.Errorf("%q: want service=count, count ≥ 1", f)
		}
		if !slices.Contains(chaos.ServiceNames, name) {
			return nil, fmt.Errorf("%q: unknown service (services: %s)", name, strings.Join(chaos.ServiceNames, ", "))
		}
		r[name] = k
	}
	return r, nil
}

// parseEnv reads a flag's space-separated NAME=value words, adding an error
// to errs for each word that is not one.
func parseEnv(flag, value string, errs []error) ([]string, []error) {
	env := strings.Fields(value)
	for _, kv := range env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			errs = append(errs, fmt.Errorf("%s %q: want NAME=value", flag, kv))
		}
	}
	return env, errs
}

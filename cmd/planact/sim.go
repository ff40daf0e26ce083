package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/planact/planact/internal/demo"
	"github.com/planact/planact/pkg/sim"
)

// runSim serves a simulated planner engine and a simulated actor engine
// (SGLang native and OpenAI-compatible APIs) until ctx ends.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	plannerAddr := fs.String("planner-addr", "127.0.0.1:30000", "listen address of the simulated planner engine")
	actorAddr := fs.String("actor-addr", "127.0.0.1:30001", "listen address of the simulated actor engine")
	seed := fs.Int64("seed", 1, "seed of the simulated engines (the actor uses seed+1)")
	ttft := fs.Duration("ttft", sim.Defaults.TTFT, "simulated time to first token")
	perToken := fs.Duration("per-token", sim.Defaults.PerToken, "simulated time per generated token")
	concurrency := fs.Int("concurrency", 0, "max concurrent generations per engine (0 = unlimited)")
	weightVersion := fs.String("weight-version", "v1", "initial weight version (reported as <role>-<version>)")
	errorRate := fs.Float64("error-rate", 0, "probability that a request fails with 500")
	hangRate := fs.Float64("hang-rate", 0, "probability that a request never completes")
	busyRate := fs.Float64("busy-rate", 0, "probability that a request is turned away with 429 Too Many Requests and a Retry-After header")
	retryAfter := fs.String("retry-after", "1", "the Retry-After header of a 429: seconds or an HTTP date")
	omitTokenIDs := fs.Bool("omit-token-ids", false, "OpenAI-compatible replies carry no token ids (neither return_token_ids nor return_tokens_as_token_ids honoured), as many servers' do: planact refuses them")
	omitLogProbs := fs.Bool("omit-logprobs", false, "replies carry no log-probs (SGLang's output_token_logprobs, OpenAI's logprobs): samples get none (rollout_log_probs absent, metadata.log_probs_missing says why)")
	omitWeightVersion := fs.Bool("omit-weight-version", false, "replies do not say which weights generated them (SGLang's meta_info.weight_version, OpenAI's metadata.weight_version)")
	versionEndpoint := fs.String("version-endpoint", "", "what GET /get_weight_version answers: empty for the engine's version, 404 for none (as vLLM: max_staleness cannot be checked), or a fixed version")
	contextLength := fs.Int("context-length", 0, "report prompts longer than this many tokens as cut to it (prompt_tokens), as a server that truncates long prompts does: planact refuses such generations (0 = no limit)")
	chatStripThink := fs.Bool("chat-strip-think", false, "the chat template drops <think> blocks from earlier assistant turns (as Qwen3's does), so openai-chat trajectories cannot stay token-exact")
	driftFrom := fs.Int("drift-from", 0, "from the N-th request of an episode on, take another input than sent (another tokenizer revision: chat turns end in a newline, token ids get a BOS), and say so in prompt_token_ids / prompt_tokens: planact quarantines the episode (0: never)")
	malformedRate := fs.Float64("malformed-rate", 0, "probability that the planner writes a malformed plan")
	cyclicRate := fs.Float64("cyclic-rate", 0, "probability that the planner writes a cyclic plan")
	actorErrorRate := fs.Float64("actor-error-rate", sim.Defaults.ActorErrorRate, "probability that the actor answers a lookup wrongly")
	stepwise := fs.Float64("stepwise", sim.Defaults.PlannerStepwise, "fraction of questions the planner plans one hop per turn")
	tasks := fs.Int("tasks", 0, "instead of serving: print this many questions of the built-in world with their labels, as JSON Lines of tasks that planact submit --tasks reads")
	group := fs.Int("samples-per-prompt", 1, "with --tasks: copies of each question (a group, sharing a group_index)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"error-rate", *errorRate}, {"hang-rate", *hangRate}, {"busy-rate", *busyRate}, {"malformed-rate", *malformedRate},
		{"cyclic-rate", *cyclicRate}, {"actor-error-rate", *actorErrorRate}, {"stepwise", *stepwise}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("sim: --%s %v is not a probability", p.name, p.v)
		}
	}

	if err := checkSimTimes("sim: --ttft", *ttft, "sim: --per-token", *perToken); err != nil {
		return err
	}
	if *concurrency < 0 || *driftFrom < 0 {
		return fmt.Errorf("sim: --concurrency %d --drift-from %d: want 0 (none) or more", *concurrency, *driftFrom)
	}
	if *contextLength < 0 {
		return fmt.Errorf("sim: --context-length %d: want 0 (no limit) or more", *contextLength)
	}
	if *tasks < 0 || *group < 1 {
		return fmt.Errorf("sim: --tasks %d --samples-per-prompt %d: want 0 or more tasks and at least one sample", *tasks, *group)
	}
	if *tasks == 0 && flagSet(fs, "samples-per-prompt") {
		// The engines serve whatever copies they are sent.
		return fmt.Errorf("sim: --samples-per-prompt %d: only with --tasks (it makes the copies of the tasks printed)", *group)
	}
	if *tasks > 0 {
		enc := json.NewEncoder(stdout)
		for _, t := range demo.Tasks(sim.DefaultWorld(), *tasks, *group, *seed, "") {
			if err := enc.Encode(t); err != nil {
				return err
			}
		}
		return nil
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if strings.ContainsAny(*versionEndpoint, "\r\n\"\\") {
		return fmt.Errorf("sim: --version-endpoint %q: want a version, 404 or nothing", *versionEndpoint)
	}
	if *retryAfter == "" || strings.ContainsAny(*retryAfter, "\r\n") {
		return fmt.Errorf("sim: --retry-after %q: want seconds or an HTTP date", *retryAfter)
	}
	faults := sim.Faults{ErrorRate: *errorRate, HangRate: *hangRate, BusyRate: *busyRate, MalformedPlanRate: *malformedRate, CyclicPlanRate: *cyclicRate}
	var stopped []<-chan struct{}
	for _, e := range []struct {
		role, addr string
		seed       int64
	}{{sim.RolePlanner, *plannerAddr, *seed}, {sim.RoleActor, *actorAddr, *seed + 1}} {
		eng := sim.New(sim.Config{
			Role: e.role, Seed: e.seed, TTFT: *ttft, PerToken: *perToken, Concurrency: *concurrency,
			WeightVersion: e.role + "-" + *weightVersion, ActorErrorRate: *actorErrorRate,
			PlannerStepwise: *stepwise, Faults: faults, RetryAfter: *retryAfter, ChatStripThink: *chatStripThink, DriftFrom: *driftFrom,
			Omit:            sim.Omit{TokenIDs: *omitTokenIDs, LogProbs: *omitLogProbs, WeightVersion: *omitWeightVersion},
			VersionEndpoint: *versionEndpoint, ContextLength: *contextLength,
		})
		url, done, err := sim.ServeEngine(ctx, e.addr, eng)
		if err != nil {
			return fmt.Errorf("sim: %s engine: %w", e.role, err)
		}
		stopped = append(stopped, done)
		fmt.Fprintf(stdout, "%s engine: %s\n", e.role, url)
	}
	fmt.Fprintln(stdout, "simulated engines ready (SGLang /generate, OpenAI /v1/completions and /v1/chat/completions; GET /sim/stats shows routing keys and aborts, POST /sim/take_generations the calls per generation); Ctrl-C stops")
	<-ctx.Done()
	for _, done := range stopped {
		<-done
	}
	return nil
}

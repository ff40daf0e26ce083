// Package sim provides simulated inference engines that speak SGLang's
// native API and the OpenAI-compatible API, backed by a small multi-hop
// question world, with configurable latency and fault injection. They stand
// in for GPUs in tests, benchmarks and the demo.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Roles of a simulated engine.
const (
	RolePlanner = "planner"
	RoleActor   = "actor"
)

// Config configures a simulated engine.
type Config struct {
	Role     string // "planner", "actor", or "" to guess from each prompt
	Seed     int64
	TTFT     time.Duration // time to first token (0 = none)
	PerToken time.Duration // time per output token (0 = none)
	// LatencyJitter spreads the time to first token like a loaded server
	// does: each request's TTFT is scaled by 1 + LatencyJitter·(E - 1), E
	// exponential with mean 1 and chosen per prompt from the seed, so the
	// mean stays TTFT and a few requests are much slower.
	LatencyJitter  float64
	Concurrency    int // max concurrent generations (0 = unlimited); extra requests queue
	WeightVersion  string
	Model          string  // name reported by the OpenAI API (default "sim-<role>")
	ActorErrorRate float64 // probability that the actor answers a lookup wrongly (0 = always right)
	// PlannerStepwise is the fraction of questions (chosen per question) that
	// the planner plans one hop per turn instead of the whole graph at once.
	PlannerStepwise float64
	Faults          Faults
	World           *World // nil = DefaultWorld()
}

// Defaults of the simulated world, the same for `planact up` and `planact
// sim`: engines a little slower than nothing, an actor that answers a
// lookup wrongly one time in ten, and a planner that plans half of the
// questions one hop per turn.
var Defaults = Config{
	TTFT:            5 * time.Millisecond,
	PerToken:        200 * time.Microsecond,
	ActorErrorRate:  0.1,
	PlannerStepwise: 0.5,
}

// Faults are random misbehaviours, each a probability. They are
// deterministic given the seed, the request content and how many times that
// content was seen before, so a retry rolls again.
type Faults struct {
	ErrorRate         float64 // reply 500
	HangRate          float64 // never reply
	MalformedPlanRate float64 // planner: a plan that does not parse
	CyclicPlanRate    float64 // planner: a plan with a cycle
}

// Engine is a simulated inference engine; it implements http.Handler.
type Engine struct {
	cfg   Config
	world *World
	sem   chan struct{}
	mux   httpMux

	mu            sync.Mutex
	weightVersion string
	seen          map[uint64]int // request content -> times seen, for fault rolls
	fired         map[string]int // counted marker + key -> times fired

	requests atomic.Int64
	running  atomic.Int64
	tokens   atomic.Int64
}

// New returns a simulated engine.
func New(cfg Config) *Engine {
	e := &Engine{cfg: cfg, world: cfg.World, weightVersion: cfg.WeightVersion,
		seen: map[uint64]int{}, fired: map[string]int{}}
	if e.world == nil {
		e.world = DefaultWorld()
	}
	if e.cfg.Model == "" {
		e.cfg.Model = "sim-" + cmpOr(cfg.Role, "engine")
	}
	if cfg.Concurrency > 0 {
		e.sem = make(chan struct{}, cfg.Concurrency)
	}
	e.mux = e.routes()
	return e
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// SetWeightVersion changes the weight version reported with generations.
func (e *Engine) SetWeightVersion(v string) {
	e.mu.Lock()
	e.weightVersion = v
	e.mu.Unlock()
}

// WeightVersion returns the current weight version.
func (e *Engine) WeightVersion() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.weightVersion
}

// Stats returns the number of generation requests received and of output
// tokens generated.
func (e *Engine) Stats() (requests, tokens int64) {
	return e.requests.Load(), e.tokens.Load()
}

// Running is the number of generations under way now.
func (e *Engine) Running() int64 { return e.running.Load() }

// World returns the engine's question world.
func (e *Engine) World() *World { return e.world }

// errInjected is a fault: the HTTP layer replies 500.
var errInjected = errors.New("sim: injected engine error")

// errBadInput is a request the engine cannot serve: the HTTP layer replies 400.
type errBadInput struct{ msg string }

func (e errBadInput) Error() string { return e.msg }

// genInput is one generation request, protocol-independent.
type genInput struct {
	ids    []int  // prompt ids
	prompt string // decoded prompt
	maxNew int    // 0: default; < 0: an explicit limit of zero
	stop   []string
	seed   int64 // the request's sampling seed; 0: none
}

// genOutput is a finished generation.
type genOutput struct {
	text          string
	ids           []int
	logprobs      []float64
	finish        string // stop | length | abort
	matched       any    // for SGLang's finish_reason.matched
	weightVersion string
	promptTokens  int
	ttft          time.Duration
}

// defaultMaxNew is used when a request gives no limit; larger than SGLang's
// default of 128 because byte-level plans are long.
const defaultMaxNew = 4096

// generate produces the output of one request, waiting for a slot and
// simulating latency. progress, when set, is called as tokens are produced
// with the number of tokens so far (streaming).
func (e *Engine) generate(ctx context.Context, in genInput, progress func(out *genOutput, n int) error) (*genOutput, error) {
	e.requests.Add(1)
	role := e.cfg.Role
	if role == "" {
		role = RoleActor
		if questionLineRe.MatchString(in.prompt) {
			role = RolePlanner
		}
	}
	// What varies between two requests of the same prompt, as sampling
	// does: the request's own seed, or else how many times the prompt was
	// seen before.
	occurrence := e.occurrence(in.prompt)
	if in.seed != 0 {
		occurrence = fmt.Sprintf("seed %d", in.seed)
	}
	key := e.markerKey(role, in.prompt)
	markers := findMarkers(in.prompt)
	fires := func(kind string) bool {
		for _, m := range markers {
			if m.kind == kind && e.fire(m, key) {
				return true
			}
		}
		return false
	}
	errKind, hangKind := "error", "hang"
	if role == RoleActor {
		errKind, hangKind = "actor-error", "actor-hang"
	}
	if fires("error") || fires(errKind) || roll(e.cfg.Faults.ErrorRate, e.cfg.Seed, "error", in.prompt, occurrence) {
		return nil, errInjected
	}
	hang := fires("hang") || fires(hangKind) || roll(e.cfg.Faults.HangRate, e.cfg.Seed, "hang", in.prompt, occurrence)

	if e.sem != nil {
		select {
		case e.sem <- struct{}{}:
			defer func() { <-e.sem }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e.running.Add(1)
	defer e.running.Add(-1)
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}

	var text string
	truncated := false
	if role == RolePlanner {
		text, truncated = e.plannerOutput(in.prompt, occurrence, fires)
	} else {
		text = e.actorOutput(in.prompt, occurrence, fires)
	}
	out := e.finish(in, text, truncated)
	if err := e.play(ctx, out, progress); err != nil {
		return nil, err
	}
	e.tokens.Add(int64(len(out.ids)))
	return out, nil
}

// finish turns the model's text into output tokens, applying stop strings
// and max_new_tokens as an engine does.
func (e *Engine) finish(in genInput, text string, truncated bool) *genOutput {
	out := &genOutput{weightVersion: e.WeightVersion(), promptTokens: len(in.ids), finish: "stop", matched: EOSID}
	ids := Encode(text)
	if truncated {
		out.finish, out.matched = "length", nil
	} else {
		ids = append(ids, EOSID)
	}
	stopAt, stopStr := -1, ""
	for _, s := range in.stop {
		if i := strings.Index(text, s); s != "" && i >= 0 && (stopAt < 0 || i < stopAt) {
			stopAt, stopStr = i, s
		}
	}
	if stopAt >= 0 {
		// The stop string's tokens are generated but trimmed from the text.
		ids = Encode(text[:stopAt+len(stopStr)])
		text = text[:stopAt]
		out.finish, out.matched = "stop", stopStr
	}
	maxNew := in.maxNew
	switch {
	case maxNew == 0:
		maxNew = defaultMaxNew
	case maxNew < 0: // an explicit zero
		maxNew = 0
	}
	if len(ids) > maxNew {
		ids = ids[:maxNew]
		text, _ = Decode(ids)
		out.finish, out.matched = "length", nil
	}
	out.text, out.ids = text, ids
	ph := hash64(e.cfg.Seed, in.prompt)
	out.ttft = jittered(e.cfg.TTFT, e.cfg.LatencyJitter, ph)
	out.logprobs = make([]float64, len(ids))
	for i, id := range ids {
		out.logprobs[i] = logProb(e.cfg.Seed, ph, i, id)
	}
	return out
}

// play waits as long as the generation would take, reporting progress.
func (e *Engine) play(ctx context.Context, out *genOutput, progress func(*genOutput, int) error) error {
	if progress == nil {
		return sleep(ctx, out.ttft+time.Duration(len(out.ids))*e.cfg.PerToken)
	}
	// Paced against the clock from the start, not by adding up short
	// sleeps (each oversleeps), so that a streamed generation takes as long
	// as an unstreamed one; chunks carry at least a millisecond of tokens,
	// as a server's stream interval does.
	begin := time.Now()
	if err := sleep(ctx, out.ttft); err != nil {
		return err
	}
	step := 16 // no pacing: still stream in several chunks
	if e.cfg.PerToken > 0 {
		step = max(1, int(time.Millisecond/e.cfg.PerToken))
	}
	for n := 0; n < len(out.ids); {
		k := min(step, len(out.ids)-n)
		if err := sleep(ctx, time.Until(begin.Add(out.ttft+time.Duration(n+k)*e.cfg.PerToken))); err != nil {
			return err
		}
		n += k
		if n == len(out.ids) {
			break // the last chunk carries the finish reason; the caller sends it
		}
		if err := progress(out, n); err != nil {
			return err
		}
	}
	return nil
}

// jittered scales d by 1 + j·(E-1), E exponential with mean 1 drawn from h.
func jittered(d time.Duration, j float64, h uint64) time.Duration {
	if j <= 0 || d <= 0 {
		return d
	}
	u := float64(h>>11) / float64(1<<53) // uniform in [0, 1)
	f := 1 + j*(-math.Log1p(-u)-1)
	return time.Duration(float64(d) * max(f, 0.05))
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// textAt is the text visible after n output tokens.
func (out *genOutput) textAt(n int) string {
	visible := 0
	for _, id := range out.ids[:n] {
		if id >= ByteOffset {
			visible++
		}
	}
	return out.text[:min(visible, len(out.text))]
}

// occurrence counts how many times this prompt was seen before, so that
// fault rolls differ between a request and its retry.
func (e *Engine) occurrence(prompt string) string {
	h := hash64(0, prompt)
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.seen) > 1<<20 {
		clear(e.seen)
	}
	n := e.seen[h]
	e.seen[h]++
	return fmt.Sprint(n)
}

// markerKey identifies what a counted marker counts: the question for the
// planner (every turn of an episode), the input for the actor (every retry).
func (e *Engine) markerKey(role, prompt string) string {
	if role == RolePlanner {
		if m := questionLineRe.FindStringSubmatch(prompt); m != nil {
			return role + "\x00" + m[1]
		}
	} else if m := inputLineRe.FindStringSubmatch(prompt); m != nil {
		return role + "\x00" + m[1]
	}
	return role + "\x00" + prompt
}

// fire reports whether a marker takes effect now, counting counted markers.
func (e *Engine) fire(m marker, key string) bool {
	if m.times == 0 {
		return true
	}
	k := m.kind + "\x00" + key
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fired[k] >= m.times {
		return false
	}
	e.fired[k]++
	return true
}

// plannerOutput writes the planner's answer or plan for a prompt.
func (e *Engine) plannerOutput(prompt, occurrence string, fires func(string) bool) (string, bool) {
	p := parsePlannerPrompt(prompt)
	question := stripMarkers(p.question)
	stepwise := roll(e.cfg.PlannerStepwise, e.cfg.Seed, "stepwise", question)
	answer, nodes, think, _ := e.world.plannerTurn(p, stepwise)
	if len(nodes) == 0 {
		return fmt.Sprintf("<think>%s</think>\n<answer>%s</answer>", think, answer), false
	}
	// Actor faults asked for in the question travel in the first node's input.
	for _, m := range findMarkers(p.question) {
		if strings.HasPrefix(m.kind, "actor-") {
			nodes[0].query += " " + m.text
		}
	}
	fault := planOK
	switch {
	case fires("tool-invalid"):
		fault = planToolInvalid
	case fires("cyclic-plan") || roll(e.cfg.Faults.CyclicPlanRate, e.cfg.Seed, "cyclic", prompt, occurrence):
		fault = planCyclic
	case fires("malformed-plan") || roll(e.cfg.Faults.MalformedPlanRate, e.cfg.Seed, "malformed", prompt, occurrence):
		fault = planMalformed
	case fires("truncated-plan"):
		fault = planTruncated
	}
	return breakPlan(fault, p.format, think, nodes)
}

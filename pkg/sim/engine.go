// Package sim provides simulated inference engines that speak SGLang's
// native API and the OpenAI-compatible API, backed by a small multi-hop
// question world, with configurable latency and fault injection. They stand
// in for GPUs in tests, benchmarks and the demo.
package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
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
	// JudgeErrorRate is the probability that the planner, picking among an
	// ensemble's candidates (ensemble_pick planner, judge.go), picks a
	// wrong one where there is a right one (0 = picks right when it can).
	JudgeErrorRate float64
	// PlanWidth, when set, makes the planner answer every question with one
	// plan of PlanWidth independent lookups and, once it has seen their
	// observations, the answer: a plan of known width, for benchmarks.
	PlanWidth int
	// PlannerStepwise is the fraction of questions (chosen per question) that
	// the planner plans one hop per turn instead of the whole graph at once.
	PlannerStepwise float64
	Faults          Faults
	World           *World // nil = DefaultWorld()
	// RetryAfter is the Retry-After header of a busy reply (429): seconds
	// or an HTTP date; "" means "1".
	RetryAfter string
	// ChatStripThink makes the chat template drop <think>…</think> from
	// earlier assistant turns, as Qwen3's does: a conversation re-rendered
	// every turn then differs from the trajectory it extends.
	ChatStripThink bool
	// DriftFrom makes the engine take another input than it was sent from
	// the DriftFrom-th generation request of an episode (its routing key)
	// on, as a server with another tokenizer revision behind the same
	// router would: its chat template ends earlier user turns with "\n"
	// where it wrote EOS (so a conversation no longer extends its
	// trajectory), and token ids given to /generate or /v1/completions get
	// a BOS first. It says so as engines do: in the prompt_token_ids and
	// prompt_tokens of its replies. 0: never.
	DriftFrom int
	// Omit leaves fields out of the engine's replies, as servers that do
	// not know (or were not started with) the options that ask for them.
	Omit Omit
	// VersionEndpoint is what GET /get_weight_version answers: "" the
	// version of the weights the engine serves; NoVersionEndpoint 404 (as
	// vLLM, or an SGLang before it had versions: GET /get_model_info then
	// names none either); anything else that version, whatever the weights
	// (an engine whose report cannot be trusted, or a router that asks
	// another worker than the one that generates).
	VersionEndpoint string
	// ContextLength, when set, makes the engine report prompts longer than
	// it as cut to it (prompt_tokens), as a server that truncates long
	// prompts does (SGLang with --allow-auto-truncate, for one); the
	// simulated model still reads the whole prompt.
	ContextLength int
}

// NoVersionEndpoint, as Config.VersionEndpoint: the engine cannot say which
// weights it serves.
const NoVersionEndpoint = "404"

// Omit lists the fields a simulated engine leaves out of its replies.
type Omit struct {
	// TokenIDs: OpenAI-compatible replies carry neither token_ids nor
	// prompt_token_ids (vLLM's return_token_ids), and their log-prob tokens
	// are text, never "token_id:<id>" (return_tokens_as_token_ids).
	TokenIDs bool
	// LogProbs: SGLang's meta_info has no output_token_logprobs, and
	// OpenAI-compatible replies have no logprobs.
	LogProbs bool
	// WeightVersion: replies do not report the weights that generated them
	// (SGLang's meta_info.weight_version, the OpenAI metadata.weight_version).
	WeightVersion bool
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
	BusyRate          float64 // reply 429 Too Many Requests, with Retry-After
}

// Engine is a simulated inference engine; it implements http.Handler.
type Engine struct {
	cfg   Config
	world *World
	sem   chan struct{}
	mux   httpMux

	mu            sync.Mutex
	weightVersion string
	modelPath     string
	seen          map[uint64]int             // request content -> times seen, for fault rolls
	fired         map[string]int             // counted marker + key -> times fired
	runs          map[*run]bool              // generations in the engine, admitted or waiting
	routing       map[string]int             // routing key -> requests
	generations   map[string]GenerationCalls // GenerationHeader -> calls, until taken
	dropped       int                        // calls not counted: generations was full
	driftSeen     map[string]int             // routing key -> requests, as DriftFrom counts them
	aborts        []Abort
	// The gate: paused (a pause, until continue) and draining (a weight
	// update or vLLM's pause in mode wait, until what runs has finished)
	// hold new requests; frozen holds running ones too. gateCh is closed
	// and replaced at every change.
	paused    bool
	pauseMode string
	frozen    bool
	draining  int
	gateCh    chan struct{}

	requests atomic.Int64
	running  atomic.Int64
	tokens   atomic.Int64
}

// Abort records a generation the engine was told to abort, or whose client
// went away.
type Abort struct {
	RID string `json:"rid"`
	// Generation is the request's GenerationHeader, when it had one.
	Generation string `json:"generation,omitempty"`
	// By is how: "abort_request" (SGLang's POST /abort_request), "pause"
	// (a pause in mode abort), "update" (a weight update with
	// abort_all_requests) or "disconnect" (the client closed the connection
	// before the generation ended, which is how vLLM aborts).
	By string `json:"by"`
	// Running is whether the generation was still in the engine.
	Running bool `json:"running"`
}

// run is one generation in the engine.
type run struct {
	rid        string
	generation string        // GenerationHeader
	abort      chan struct{} // closed to abort the generation
	done       chan struct{} // closed when it has left the engine
	started    bool          // past the gate; e.mu
	aborted    bool          // e.mu
	by         string        // e.mu
}

// New returns a simulated engine.
func New(cfg Config) *Engine {
	e := &Engine{cfg: cfg, world: cfg.World, weightVersion: cfg.WeightVersion,
		seen: map[uint64]int{}, fired: map[string]int{}, runs: map[*run]bool{}, routing: map[string]int{}, generations: map[string]GenerationCalls{}, driftSeen: map[string]int{},
		gateCh: make(chan struct{})}
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

// ModelPath is the model the engine reports (Config.Model, or what the last
// weight update loaded).
func (e *Engine) ModelPath() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return cmpOr(e.modelPath, e.cfg.Model)
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

// errBusy is a fault: the HTTP layer replies status (429 or 503), with a
// Retry-After header when retryAfter is set.
type errBusy struct {
	status     int
	retryAfter string
}

func (e errBusy) Error() string { return fmt.Sprintf("sim: injected busy engine (%d)", e.status) }

// errAborted ends a generation that was aborted; not an HTTP error: the
// reply is what was generated, with finish reason abort.
var errAborted = errors.New("sim: generation aborted")

// errBadInput is a request the engine cannot serve: the HTTP layer replies 400.
type errBadInput struct{ msg string }

func (e errBadInput) Error() string { return e.msg }

// genInput is one generation request, protocol-independent.
type genInput struct {
	ids        []int  // prompt ids
	prompt     string // decoded prompt
	maxNew     int    // 0: default; < 0: an explicit limit of zero
	stop       []string
	seed       int64  // the request's sampling seed; 0: none
	rid        string // the request's id (SGLang's rid), for /abort_request
	routingKey string // X-SMG-Routing-Key, else SGLang's routing_key
	generation string // GenerationHeader: the turn or act it is for
}

// genOutput is a finished generation.
type genOutput struct {
	text          string
	ids           []int
	logprobs      []float64
	finish        string // stop | length | abort
	matched       any    // for SGLang's finish_reason.matched
	abortMsg      string // for SGLang's finish_reason.message
	weightVersion string
	promptTokens  int
	ttft          time.Duration
}

// defaultMaxNew is used when a request gives no limit; larger than SGLang's
// default of 128 because byte-level plans are long.
const defaultMaxNew = 4096

// generate produces the output of one request, waiting for a slot and
// simulating latency. progress, when set, is called as tokens are produced
// with the number of tokens so far (streaming). A generation aborted while
// it runs (POST /abort_request, a pause in mode abort) ends with what it
// had generated and finish reason abort.
func (e *Engine) generate(ctx context.Context, in genInput, progress func(out *genOutput, n int) error) (_ *genOutput, err error) {
	e.requests.Add(1)
	r := e.enter(in)
	defer func() { e.leave(r, ctx, err) }()
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
	switch {
	case fires("busy") || roll(e.cfg.Faults.BusyRate, e.cfg.Seed, "busy", in.prompt, occurrence):
		return nil, errBusy{status: http.StatusTooManyRequests, retryAfter: cmpOr(e.cfg.RetryAfter, "1")}
	case fires("unavailable"):
		return nil, errBusy{status: http.StatusServiceUnavailable}
	}
	e.countCall(in.generation) // taken: no busy reply, which the caller's client sends again
	errKind, hangKind := "error", "hang"
	if role == RoleActor {
		errKind, hangKind = "actor-error", "actor-hang"
	}
	if fires("error") || fires(errKind) || roll(e.cfg.Faults.ErrorRate, e.cfg.Seed, "error", in.prompt, occurrence) {
		return nil, errInjected
	}
	hang := fires("hang") || fires(hangKind) || roll(e.cfg.Faults.HangRate, e.cfg.Seed, "hang", in.prompt, occurrence)

	// A paused engine holds new requests, as SGLang's tokenizer manager does.
	if err := e.admit(ctx, r); err != nil {
		return e.aborted(in, r, err, 0)
	}
	if e.sem != nil {
		select {
		case e.sem <- struct{}{}:
			defer func() { <-e.sem }()
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.abort:
			return e.aborted(in, r, errAborted, 0)
		}
	}
	e.running.Add(1)
	defer e.running.Add(-1)
	if hang {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.abort:
			return e.aborted(in, r, errAborted, 0)
		}
	}

	var text string
	truncated := false
	if role == RolePlanner {
		text, truncated = e.plannerOutput(in.prompt, occurrence, fires)
	} else {
		text = e.actorOutput(in.prompt, occurrence, fires)
	}
	out := e.finish(in, text, truncated)
	if n, err := e.play(ctx, r, out, progress); err != nil {
		if errors.Is(err, errAborted) {
			out.cut(n, e.abortMessage(r))
			e.tokens.Add(int64(n))
			return out, nil
		}
		return nil, err
	}
	e.tokens.Add(int64(len(out.ids)))
	return out, nil
}

// aborted is the reply to a generation aborted before its first token.
func (e *Engine) aborted(in genInput, r *run, err error, n int) (*genOutput, error) {
	if !errors.Is(err, errAborted) {
		return nil, err
	}
	out := e.finish(in, "", true)
	out.cut(n, e.abortMessage(r))
	return out, nil
}

// cut ends the output after n tokens, aborted.
func (out *genOutput) cut(n int, msg string) {
	n = min(n, len(out.ids))
	out.text = out.textAt(n)
	out.ids, out.logprobs = out.ids[:n], out.logprobs[:n]
	out.finish, out.matched, out.abortMsg = "abort", nil, msg
}

func (e *Engine) abortMessage(r *run) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprintf("Abort request %s (%s)", r.rid, r.by)
}

// drifts counts a generation request with routing key key and reports
// whether it is one the engine takes another input for (Config.DriftFrom).
func (e *Engine) drifts(key string) bool {
	if e.cfg.DriftFrom <= 0 || key == "" {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.driftSeen) > 1<<16 {
		clear(e.driftSeen)
	}
	e.driftSeen[key]++
	return e.driftSeen[key] >= e.cfg.DriftFrom
}

// enter registers a generation and counts its routing key.
func (e *Engine) enter(in genInput) *run {
	r := &run{rid: in.rid, generation: in.generation, abort: make(chan struct{}), done: make(chan struct{})}
	e.mu.Lock()
	defer e.mu.Unlock()
	if in.routingKey != "" {
		if len(e.routing) > 1<<16 {
			clear(e.routing)
		}
		e.routing[in.routingKey]++
	}
	e.runs[r] = true
	return r
}

// leave unregisters a generation; one that ends because its client went
// away is recorded as aborted by disconnect.
func (e *Engine) leave(r *run, ctx context.Context, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.runs, r)
	close(r.done)
	if err != nil && ctx.Err() != nil && !r.aborted {
		e.record(Abort{RID: r.rid, Generation: r.generation, By: "disconnect", Running: true})
	}
}

// record keeps an abort for Aborts; e.mu is held.
func (e *Engine) record(a Abort) {
	if len(e.aborts) >= 1024 {
		e.aborts = e.aborts[1:]
	}
	e.aborts = append(e.aborts, a)
}

// abortRun aborts one generation; e.mu is held.
func (e *Engine) abortRun(r *run, by string) {
	if !r.aborted {
		r.aborted, r.by = true, by
		close(r.abort)
	}
}

// AbortRequest aborts the generation named rid, as SGLang's POST
// /abort_request does, or every generation with all; it reports whether
// one was running.
func (e *Engine) AbortRequest(rid string, all bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	found := false
	for r := range e.runs {
		if all || (rid != "" && r.rid == rid) {
			e.abortRun(r, "abort_request")
			found = true
		}
	}
	if all {
		rid = "*"
	}
	e.record(Abort{RID: rid, By: "abort_request", Running: found})
	return found
}

// abortStarted aborts every generation past the gate; e.mu is held.
func (e *Engine) abortStarted(by string) int {
	n := 0
	for r := range e.runs {
		if r.started {
			e.abortRun(r, by)
			e.record(Abort{RID: r.rid, Generation: r.generation, By: by, Running: true})
			e.countAbort(r.generation)
			n++
		}
	}
	return n
}

// changed wakes whoever waits on the gate; e.mu is held.
func (e *Engine) changed() {
	close(e.gateCh)
	e.gateCh = make(chan struct{})
}

// Pause pauses the engine as SGLang's /pause_generation does: new requests
// wait until Continue; running ones end now (mode abort) or hold where they
// are (in_place, retract; vLLM's keep). Mode wait, vLLM's, lets running
// generations finish and returns when they have (or ctx ends).
func (e *Engine) Pause(ctx context.Context, mode string) error {
	e.mu.Lock()
	switch mode {
	case "abort", "":
		mode = "abort"
		e.abortStarted("pause")
	case "in_place", "retract", "keep":
		e.frozen = true
	case "wait":
	default:
		e.mu.Unlock()
		return fmt.Errorf("invalid mode %q: expected one of abort, retract, in_place (SGLang) or abort, wait, keep (vLLM)", mode)
	}
	e.paused, e.pauseMode = true, mode
	e.changed()
	e.mu.Unlock()
	if mode == "wait" {
		return e.drained(ctx)
	}
	return nil
}

// Continue lets a paused engine generate again.
func (e *Engine) Continue() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paused, e.pauseMode, e.frozen = false, "", false
	e.changed()
}

// Paused reports whether the engine is paused, and in which mode.
func (e *Engine) Paused() (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paused, e.pauseMode
}

// Holding reports whether new requests wait: the engine is paused, or a
// weight update waits for the running generations.
func (e *Engine) Holding() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paused || e.draining > 0
}

// drained waits until every generation past the gate has left the engine.
func (e *Engine) drained(ctx context.Context) error {
	for {
		e.mu.Lock()
		var wait <-chan struct{}
		for r := range e.runs {
			if r.started {
				wait = r.done
				break
			}
		}
		e.mu.Unlock()
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// UpdateWeights changes the weight version (and, when path is set, the
// model path) the way SGLang's weight updates do: new requests wait while
// the generations running finish (or are aborted, with abortAll), then the
// version changes.
func (e *Engine) UpdateWeights(ctx context.Context, version, path string, abortAll bool) error {
	e.mu.Lock()
	e.draining++
	if abortAll {
		e.abortStarted("update")
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.draining--
		e.changed()
		e.mu.Unlock()
	}()
	if err := e.drained(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	if version != "" {
		e.weightVersion = version
	}
	if path != "" {
		e.modelPath = path
	}
	e.mu.Unlock()
	return nil
}

// admit holds a new request while the engine is paused or draining.
func (e *Engine) admit(ctx context.Context, r *run) error {
	for {
		e.mu.Lock()
		if !e.paused && e.draining == 0 {
			r.started = true
			e.mu.Unlock()
			return nil
		}
		ch := e.gateCh
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-r.abort:
			return errAborted
		}
	}
}

// GenerationHeader names, on planact's engine requests, the planner turn
// or act they are for (pkg/engine's GenerationHeader).
const GenerationHeader = "X-Planact-Generation"

// MaxGenerations is how many generations an engine counts calls of between
// two TakeGenerations; the calls of more are only counted as dropped.
const MaxGenerations = 1 << 16

// GenerationCalls are the generation requests an engine took for one
// generation (GenerationHeader).
type GenerationCalls struct {
	Calls int `json:"calls"` // taken: every request but one refused busy (429, 503)
	// Aborted counts those the engine itself aborted while they ran: a
	// pause in mode abort, or a weight update with abort_all_requests.
	Aborted int `json:"aborted,omitempty"`
}

// GenerationLog is what an engine counted of each generation's calls
// since the last TakeGenerations.
type GenerationLog struct {
	Generations map[string]GenerationCalls `json:"generations"`
	// Dropped counts the calls not counted: of a generation beyond
	// MaxGenerations. Calls are missing from Generations then.
	Dropped int `json:"dropped"`
}

// countCall counts a generation request the engine took.
func (e *Engine) countCall(generation string) {
	if generation == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.generations[generation]
	if !ok && len(e.generations) >= MaxGenerations {
		e.dropped++
		return
	}
	c.Calls++
	e.generations[generation] = c
}

// countAbort counts a generation request the engine aborted itself; e.mu
// is held.
func (e *Engine) countAbort(generation string) {
	if generation == "" {
		return
	}
	c, ok := e.generations[generation]
	if !ok && len(e.generations) >= MaxGenerations {
		e.dropped++
		return
	}
	c.Aborted++
	e.generations[generation] = c
}

// TakeGenerations returns the calls counted per generation since the last
// take and starts counting afresh: a harness that takes them as it goes
// misses none, and the engine keeps no more than it must.
func (e *Engine) TakeGenerations() GenerationLog {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := GenerationLog{Generations: e.generations, Dropped: e.dropped}
	e.generations, e.dropped = map[string]GenerationCalls{}, 0
	return l
}

// RoutingKeys returns how many requests came with each routing key.
func (e *Engine) RoutingKeys() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.routing)
}

// Aborts returns the aborts the engine saw, oldest first (the last 1024).
func (e *Engine) Aborts() []Abort {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.aborts)
}

// InFlight is the number of generation requests in the engine: running,
// or waiting for a slot or for a pause to end.
func (e *Engine) InFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.runs)
}

// Started is the number of generation requests past the gate (running, not
// waiting for a pause to end): those a pause in mode abort ends.
func (e *Engine) Started() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for r := range e.runs {
		if r.started {
			n++
		}
	}
	return n
}

// finish turns the model's text into output tokens, applying stop strings
// and max_new_tokens as an engine does.
func (e *Engine) finish(in genInput, text string, truncated bool) *genOutput {
	out := &genOutput{weightVersion: e.WeightVersion(), promptTokens: len(in.ids), finish: "stop", matched: EOSID}
	if e.cfg.ContextLength > 0 {
		out.promptTokens = min(out.promptTokens, e.cfg.ContextLength)
	}
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

// play waits as long as the generation would take, reporting progress,
// and holding while the engine is paused in place. It returns the number of
// tokens generated when the generation is aborted (errAborted).
func (e *Engine) play(ctx context.Context, r *run, out *genOutput, progress func(*genOutput, int) error) (int, error) {
	if progress == nil {
		total := out.ttft + time.Duration(len(out.ids))*e.cfg.PerToken
		begin := time.Now()
		paused, err := e.wait(ctx, r, total)
		if err != nil {
			n := 0
			if ran := time.Since(begin) - paused - out.ttft; ran > 0 && e.cfg.PerToken > 0 {
				n = min(int(ran/e.cfg.PerToken), len(out.ids))
			}
			return n, err
		}
		return len(out.ids), nil
	}
	// Paced against the clock from the start, not by adding up short
	// sleeps (each oversleeps), so that a streamed generation takes as long
	// as an unstreamed one; chunks carry at least a millisecond of tokens,
	// as a server's stream interval does. Time paused moves the start.
	begin := time.Now()
	paused, err := e.wait(ctx, r, out.ttft)
	if err != nil {
		return 0, err
	}
	begin = begin.Add(paused)
	step := 16 // no pacing: still stream in several chunks
	if e.cfg.PerToken > 0 {
		step = max(1, int(time.Millisecond/e.cfg.PerToken))
	}
	for n := 0; n < len(out.ids); {
		k := min(step, len(out.ids)-n)
		paused, err := e.wait(ctx, r, time.Until(begin.Add(out.ttft+time.Duration(n+k)*e.cfg.PerToken)))
		if err != nil {
			return n, err
		}
		begin = begin.Add(paused)
		n += k
		if n == len(out.ids) {
			break // the last chunk carries the finish reason; the caller sends it
		}
		if err := progress(out, n); err != nil {
			return n, err
		}
	}
	return len(out.ids), nil
}

// wait lets d of generation time pass: time while the engine is frozen
// (paused in place) does not count, and is returned. It ends early with
// ctx's error, or errAborted.
func (e *Engine) wait(ctx context.Context, r *run, d time.Duration) (paused time.Duration, err error) {
	for {
		e.mu.Lock()
		frozen, ch := e.frozen, e.gateCh
		e.mu.Unlock()
		if frozen {
			since := time.Now()
			select {
			case <-ch:
				paused += time.Since(since)
				continue
			case <-ctx.Done():
				return paused, ctx.Err()
			case <-r.abort:
				return paused, errAborted
			}
		}
		if d <= 0 {
			select {
			case <-r.abort:
				return paused, errAborted
			default:
				return paused, ctx.Err()
			}
		}
		since := time.Now()
		t := time.NewTimer(d)
		select {
		case <-t.C:
			return paused, nil
		case <-ch:
			t.Stop()
			d -= time.Since(since)
		case <-ctx.Done():
			t.Stop()
			return paused, ctx.Err()
		case <-r.abort:
			t.Stop()
			return paused, errAborted
		}
	}
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
	if isReviewPrompt(prompt) {
		return e.world.reviewOutput(p, prompt), false
	}
	question := stripMarkers(p.question)
	if e.cfg.PlanWidth > 0 {
		return widePlan(p, question, e.cfg.PlanWidth)
	}
	stepwise := roll(e.cfg.PlannerStepwise, e.cfg.Seed, "stepwise", question)
	picks := ""
	if isJudgePrompt(prompt) {
		picks, stepwise = e.judge(&p, prompt), true
	}
	answer, nodes, think, _ := e.world.plannerTurn(p, stepwise)
	if len(nodes) == 0 {
		return fmt.Sprintf("%s<think>%s</think>\n<answer>%s</answer>", picks, think, answer), false
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
	text, truncated := breakPlan(fault, p.format, think, nodes)
	return picks + text, truncated
}

package schema

import (
	"fmt"
	"hash/fnv"
	"math"
	"unicode/utf8"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/subject"
)

// Engine names an inference engine by URL and protocol ("sglang" or "openai").
type Engine struct {
	URL      string `json:"url"`
	Protocol string `json:"protocol,omitempty"`
	Model    string `json:"model,omitempty"`
	// MaxInFlight is how many generations the engine serves at once (its
	// continuous batch, SGLang's --max-running-requests): planact keeps
	// that many in flight on it, shared by the gateway replicas; 0 (absent)
	// means each gateway replica keeps its own --engine-limit.
	MaxInFlight int `json:"max_in_flight,omitempty"`
}

// MaxEngineInFlight bounds Engine.MaxInFlight.
const MaxEngineInFlight = 65536

// Check says what is wrong with the engine named at path ("engine").
func (e Engine) Check(path string) error {
	if e.MaxInFlight < 0 || e.MaxInFlight > MaxEngineInFlight {
		return fmt.Errorf("%s.max_in_flight %d: want the generations the engine serves at once, 1 to %d (absent: each gateway replica keeps its --engine-limit)",
			path, e.MaxInFlight, MaxEngineInFlight)
	}
	return nil
}

// Sampling parameters for one role's engine. Fields left out take the
// rollout defaults one by one; temperature and top_p are pointers so that
// an explicit 0 (greedy) is not taken for "left out".
type Sampling struct {
	Temperature  *float64 `json:"temperature,omitempty"`
	TopP         *float64 `json:"top_p,omitempty"`
	MaxNewTokens int      `json:"max_new_tokens,omitempty"`
	Stop         []string `json:"stop,omitempty"`
	// Seed, when set, makes sampling reproducible: every generation gets
	// its own seed derived from this one and what it generates (rollout,
	// episode, turn or node), sent to the engine (SGLang's sampling_seed,
	// the OpenAI API's seed). Unset, the engine samples as it likes.
	Seed *int64 `json:"seed,omitempty"`
}

// GenerationSeed is the seed of one generation: derived from the sampling
// seed and what identifies the generation, never 0 (which engines read as
// "none"); 0 when the sampling has no seed.
func (s Sampling) GenerationSeed(parts ...any) int64 {
	if s.Seed == nil {
		return 0
	}
	h := fnv.New64a()
	fmt.Fprint(h, *s.Seed)
	for _, p := range parts {
		fmt.Fprintf(h, "/%v", p)
	}
	v := int64(h.Sum64() >> 2) // positive, and within what JSON numbers keep exactly
	if v == 0 {
		v = 1
	}
	return v & (1<<53 - 1)
}

// Float returns a pointer to v, for Sampling literals.
func Float(v float64) *float64 { return &v }

// Values returns temperature and top_p, 1 for those left out.
func (s Sampling) Values() (temperature, topP float64) {
	temperature, topP = 1, 1
	if s.Temperature != nil {
		temperature = *s.Temperature
	}
	if s.TopP != nil {
		topP = *s.TopP
	}
	return temperature, topP
}

func (s Sampling) withDefaults(d Sampling) Sampling {
	if s.Temperature == nil {
		s.Temperature = d.Temperature
	}
	if s.TopP == nil {
		s.TopP = d.TopP
	}
	if s.MaxNewTokens == 0 {
		s.MaxNewTokens = d.MaxNewTokens
	}
	if s.Stop == nil {
		s.Stop = d.Stop
	}
	if s.Seed == nil {
		s.Seed = d.Seed
	}
	return s
}

// Validate checks s, its defaults applied, naming field (such as
// "config: planner_sampling") in what it finds wrong; maxTokens bounds
// max_new_tokens.
func (s Sampling) Validate(field string, maxTokens int) error {
	t, p := s.Values()
	switch {
	case math.IsNaN(t) || t < 0 || t > MaxTemperature:
		return fmt.Errorf("%s.temperature %g: want 0 to %d", field, t, MaxTemperature)
	case math.IsNaN(p) || p <= 0 || p > 1:
		return fmt.Errorf("%s.top_p %g: want more than 0, at most 1", field, p)
	case s.MaxNewTokens < 1 || s.MaxNewTokens > maxTokens:
		return fmt.Errorf("%s.max_new_tokens %d: want 1 to %d", field, s.MaxNewTokens, maxTokens)
	case len(s.Stop) > MaxStops:
		return fmt.Errorf("%s.stop has %d strings: want at most %d", field, len(s.Stop), MaxStops)
	}
	for i, stop := range s.Stop {
		// Characters, as the schema's maxLength counts them: a stop string
		// of CJK or emoji is three or four bytes a character.
		if n := utf8.RuneCountInString(stop); n < 1 || n > MaxStopChars {
			return fmt.Errorf("%s.stop[%d] has %d characters: want 1 to %d", field, i, n, MaxStopChars)
		}
	}
	return nil
}

// Task is one prompt of the batch. n_samples_per_prompt copies of a task
// share a group_index and differ in index.
type Task struct {
	GroupIndex int    `json:"group_index"`
	Index      int    `json:"index"`
	Prompt     string `json:"prompt"`
	Label      string `json:"label,omitempty"`
	// Dataset names the evaluation dataset the task comes from: results
	// report each dataset's numbers (Stats.Datasets, Result.Episodes).
	Dataset  string         `json:"dataset,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// Arrive announces a trainer for a rollout. The planner's arrival carries
// the tasks (either role may; the first non-empty list wins) and the
// rollout's configuration.
type Arrive struct {
	Envelope
	Rollout       int64  `json:"rollout"`
	Role          string `json:"role"`
	Engine        Engine `json:"engine"`
	WeightVersion string `json:"weight_version,omitempty"`
	Tasks         []Task `json:"tasks,omitempty"`
	TasksObject   string `json:"tasks_object,omitempty"` // tasks too large for a message: a TaskList in the object store tasks_<role>
	// TasksSHA256 is the SHA-256 (lower-case hex) of the TasksObject's
	// bytes: planact runs the rollout on that list only, and refuses it if
	// the object changed after the arrival.
	TasksSHA256 string  `json:"tasks_sha256,omitempty"`
	Config      *Config `json:"config,omitempty"`
	// Sampling is the arriving role's own model's sampling for this
	// rollout, which its trainer knows best (slime resolves it from that
	// job's flags): it becomes the config's <role>_sampling, its zero
	// fields taking the role's defaults. A config that sets the role's
	// sampling to something else makes the rollout invalid.
	Sampling *Sampling `json:"sampling,omitempty"`
	Attempt  string    `json:"attempt,omitempty"` // distinguishes deliberate re-arrivals; "" for the first
	AtMs     int64     `json:"at_ms"`
	// Nonce tells this arrival from another of the rollout by the role
	// stamped in the same millisecond (a corrected arrival sent at once
	// after a rejection, two trainer processes), as a Cancel's does: part
	// of the message id only, not of the body.
	Nonce string `json:"-"`
}

func (m *Arrive) Kind() string    { return "rollout.arrive/1" }
func (m *Arrive) Subject() string { return subject.Arrive(m.Rollout, m.Role) }

// MsgID is arrive.<rollout>.<role>.<attempt>.<at_ms> and, when it has one,
// its nonce: one id per arrival call, so a publish retried by the client
// is stored once and a corrected arrival, even in the same millisecond, is
// a new message with its own answer. Planact answers an arrival by
// whatever id it came with, the old form without a nonce included.
func (m *Arrive) MsgID() string {
	if m.Nonce == "" {
		return fmt.Sprintf("arrive.%d.%s.%s.%d", m.Rollout, m.Role, m.Attempt, m.AtMs)
	}
	return fmt.Sprintf("arrive.%d.%s.%s.%d.%s", m.Rollout, m.Role, m.Attempt, m.AtMs, m.Nonce)
}
func (m *Arrive) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: -1, Role: m.Role} }

// Start is published once, when the barrier releases a rollout.
type Start struct {
	Envelope
	Rollout    int64 `json:"rollout"`
	Episodes   int   `json:"episodes"`
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
	AtMs       int64 `json:"at_ms"`
}

func (m *Start) Kind() string    { return "rollout.start/1" }
func (m *Start) Subject() string { return subject.Start(m.Rollout) }
func (m *Start) MsgID() string   { return fmt.Sprintf("start.%d", m.Rollout) }
func (m *Start) Meta() Meta      { return Meta{Rollout: m.Rollout, Episode: -1} }

// Status is a lifecycle event for people watching a rollout.
type Status struct {
	Envelope
	Rollout int64  `json:"rollout"`
	Event   string `json:"event"`
	Episode int    `json:"episode"`
	Detail  string `json:"detail,omitempty"`
	// Progress of a running rollout, on its episode events: episodes
	// ended of all, and the acts of the ended episodes.
	Ended    int `json:"ended,omitempty"`
	Episodes int `json:"episodes,omitempty"`
	Acts     int `json:"acts,omitempty"`
	// CancelID, on the answer to a cancel (event cancelled or rejected),
	// is the cancel's Nats-Msg-Id, and CancelOutcome what became of it
	// (CancelAborted, CancelNothingToAbort, CancelNotRecorded,
	// CancelRefused): a trainer knows its answer by these, not by the
	// detail's words, which say why for people.
	CancelID      string `json:"cancel_id,omitempty"`
	CancelOutcome string `json:"cancel_outcome,omitempty"`
	AtMs          int64  `json:"at_ms"`
}

// What became of a cancel, in its answer's CancelOutcome.
const (
	// CancelAborted: the rollout is aborted; its results follow.
	CancelAborted = "aborted"
	// CancelNothingToAbort: the rollout had already ended, or is not known.
	CancelNothingToAbort = "nothing-to-abort"
	// CancelNotRecorded: planact gave up recording the cancel; the rollout
	// may still run (cancel again).
	CancelNotRecorded = "not-recorded"
	// CancelRefused: planact could not read the cancel, its subject,
	// headers and body disagree, or its reason is over MaxReason bytes;
	// nothing was done.
	CancelRefused = "refused"
)

func (m *Status) Kind() string    { return "rollout.status/1" }
func (m *Status) Subject() string { return subject.Status(m.Rollout) }
func (m *Status) MsgID() string {
	return fmt.Sprintf("status.%d.%s.%d.%s", m.Rollout, m.Event, m.Episode, m.Detail)
}
func (m *Status) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: m.Episode} }

// PlanRequest asks the planner for episode Episode's turn Turn. Turn 1 has
// no observation; later turns carry what the acts of the previous turn
// observed (or the parser's complaint), to be appended to the trajectory.
type PlanRequest struct {
	Envelope
	Rollout       int64  `json:"rollout"`
	Episode       int    `json:"episode"`
	Turn          int    `json:"turn"`
	Observation   string `json:"observation,omitempty"`
	WeightVersion string `json:"weight_version,omitempty"`
}

func (m *PlanRequest) Kind() string    { return "plan.req/1" }
func (m *PlanRequest) Subject() string { return subject.PlanReq(m.Rollout, m.Episode) }
func (m *PlanRequest) MsgID() string {
	return fmt.Sprintf("plan.req.%d.%d.%d", m.Rollout, m.Episode, m.Turn)
}
func (m *PlanRequest) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn, Role: RolePlanner}
}

// Segment kinds of a token trajectory.
const (
	SegPrompt      = "prompt"      // the rendered prompt (loss mask 0)
	SegGenerated   = "generated"   // model output (loss mask 1, with log-probs)
	SegObservation = "observation" // text planact appended (loss mask 0)
)

// Segment is a run of token ids of one kind in a trajectory.
type Segment struct {
	Kind     string    `json:"kind"`
	Turn     int       `json:"turn"`
	Text     string    `json:"text"`
	Version  string    `json:"weight_version,omitempty"` // of the engine that generated it
	IDs      []int     `json:"ids"`
	LogProbs []float64 `json:"log_probs,omitempty"` // only for generated segments, one per id
	// LogProbsMissing says why a generated segment has no log-probs: the
	// engine did not return them (never zeros in their place).
	LogProbsMissing string `json:"log_probs_missing,omitempty"`
	// StalenessUnchecked says why the weights of a generated segment could
	// not be checked against max_staleness before it ran (the engine
	// cannot say which it serves); empty when they were, or need not be.
	StalenessUnchecked string `json:"staleness_unchecked,omitempty"`
}

// PlanOutput is the planner's full output for a turn. Segments hold the whole
// token trajectory of the episode up to and including this turn, so the last
// output of an episode is its planner sample.
type PlanOutput struct {
	Envelope
	Rollout       int64     `json:"rollout"`
	Episode       int       `json:"episode"`
	Turn          int       `json:"turn"`
	Text          string    `json:"text"`
	Prompt        string    `json:"prompt,omitempty"` // rendered prompt text, on turn 1
	Segments      []Segment `json:"segments"`
	FinishReason  string    `json:"finish_reason"`
	WeightVersion string    `json:"weight_version,omitempty"`
	LatencyMs     int64     `json:"latency_ms"`
	// Truncated names the limit that cut the turn short (finish reason
	// length): max_context_tokens (no room left to generate, or less than
	// max_new_tokens) or planner_sampling.max_new_tokens.
	Truncated string `json:"truncated,omitempty"`
}

func (m *PlanOutput) Kind() string    { return "plan.out/1" }
func (m *PlanOutput) Subject() string { return subject.PlanOut(m.Rollout, m.Episode) }
func (m *PlanOutput) MsgID() string {
	return fmt.Sprintf("plan.out.%d.%d.%d", m.Rollout, m.Episode, m.Turn)
}
func (m *PlanOutput) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn, Role: RolePlanner}
}

// ContextLen is the number of tokens in the trajectory so far.
func (m *PlanOutput) ContextLen() int {
	n := 0
	for _, s := range m.Segments {
		n += len(s.IDs)
	}
	return n
}

// PlanPartial is the planner's output for a turn so far, published while
// it is still writing when the rollout streams plans. Seq counts a turn's
// partials from 1; each one's text extends the previous one's and holds at
// least one more complete node. The turn's PlanOutput still follows.
type PlanPartial struct {
	Envelope
	Rollout int64  `json:"rollout"`
	Episode int    `json:"episode"`
	Turn    int    `json:"turn"`
	Seq     int    `json:"seq"`
	Text    string `json:"text"`
}

func (m *PlanPartial) Kind() string    { return "plan.partial/1" }
func (m *PlanPartial) Subject() string { return subject.PlanPartial(m.Rollout, m.Episode) }
func (m *PlanPartial) MsgID() string {
	return fmt.Sprintf("plan.partial.%d.%d.%d.%d", m.Rollout, m.Episode, m.Turn, m.Seq)
}
func (m *PlanPartial) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn, Role: RolePlanner}
}

// PlanDAG is a parsed, validated plan for a turn. A partial DAG (Partial,
// from the Seq-th PlanPartial) holds the complete nodes of a plan still
// being written; the turn's final DAG, answer or error follows.
type PlanDAG struct {
	Envelope
	Rollout      int64     `json:"rollout"`
	Episode      int       `json:"episode"`
	Turn         int       `json:"turn"`
	Plan         plan.Plan `json:"plan"`
	FinishReason string    `json:"finish_reason,omitempty"`
	Partial      bool      `json:"partial,omitempty"`
	Seq          int       `json:"seq,omitempty"`
}

func (m *PlanDAG) Kind() string    { return "plan.dag/1" }
func (m *PlanDAG) Subject() string { return subject.PlanDAG(m.Rollout, m.Episode) }
func (m *PlanDAG) MsgID() string {
	if m.Partial {
		return fmt.Sprintf("plan.dag.%d.%d.%d.p%d", m.Rollout, m.Episode, m.Turn, m.Seq)
	}
	return fmt.Sprintf("plan.dag.%d.%d.%d", m.Rollout, m.Episode, m.Turn)
}
func (m *PlanDAG) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn} }

// PlanAnswer is the planner's final answer: the episode ends.
type PlanAnswer struct {
	Envelope
	Rollout      int64    `json:"rollout"`
	Episode      int      `json:"episode"`
	Turn         int      `json:"turn"`
	Answers      []string `json:"answers"`
	FinishReason string   `json:"finish_reason,omitempty"`
}

func (m *PlanAnswer) Kind() string    { return "plan.answer/1" }
func (m *PlanAnswer) Subject() string { return subject.PlanAnswer(m.Rollout, m.Episode) }
func (m *PlanAnswer) MsgID() string {
	return fmt.Sprintf("plan.answer.%d.%d.%d", m.Rollout, m.Episode, m.Turn)
}
func (m *PlanAnswer) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn} }

// Plan error kinds that do not come from the parser (whose kinds are
// plan.ErrorKind values): the planner could not be asked at all.
const (
	PlanErrPlannerUnavailable = "planner_unavailable" // the engine kept failing
	PlanErrPlannerRejected    = "planner_rejected"    // the engine or planact refused the request
	PlanErrContextFull        = "context_full"        // no room left in the context to generate
	PlanErrStale              = "stale"               // the planner's weights are older than max_staleness allows
	// PlanErrTokenDrift: the engine's input was not the episode's
	// trajectory (the message says where): the episode is quarantined.
	PlanErrTokenDrift = "token_drift"
)

// PlanError is a plan that could not be used, with a message precise enough
// to be fed back to the planner.
type PlanError struct {
	Envelope
	Rollout      int64  `json:"rollout"`
	Episode      int    `json:"episode"`
	Turn         int    `json:"turn"`
	ErrorKind    string `json:"error_kind"`
	Message      string `json:"message"`
	FinishReason string `json:"finish_reason,omitempty"`
}

func (m *PlanError) Kind() string    { return "plan.error/1" }
func (m *PlanError) Subject() string { return subject.PlanError(m.Rollout, m.Episode) }
func (m *PlanError) MsgID() string {
	return fmt.Sprintf("plan.error.%d.%d.%d", m.Rollout, m.Episode, m.Turn)
}
func (m *PlanError) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn} }

// Act outcomes.
const (
	ActDoneOK = "done"
	ActFailed = "failed"
	ActSkip   = "skipped"
	ActCached = "cached"
)

// Kinds of act failures, counted in Stats.Failures.
const (
	ActErrTimeout     = "timeout"     // every attempt ran out of time
	ActErrTransient   = "error"       // the engine or tool kept failing
	ActErrInvalid     = "invalid"     // will never work: bad arguments, unknown tool, a 4xx
	ActErrUnavailable = "unavailable" // no actor-gateway answered
	ActErrDuplicate   = "duplicate"   // repeats a call of the episode that failed
	ActErrPaused      = "paused"      // the actor role stayed paused past its pause's time-out
	ActErrStale       = "stale"       // the actor's weights were older than max_staleness allows
	ActErrTokenDrift  = "token_drift" // the engine's input was not the act's prompt: the episode is quarantined
)

// Generation is one engine call as a trainer needs it: token-exact.
type Generation struct {
	Prompt    string    `json:"prompt"`
	PromptIDs []int     `json:"prompt_ids"`
	Text      string    `json:"text"`
	OutputIDs []int     `json:"output_ids"`
	LogProbs  []float64 `json:"log_probs"` // one per output id, or none
	// LogProbsMissing says why there are no log-probs: the engine did not
	// return them (never zeros in their place).
	LogProbsMissing string `json:"log_probs_missing,omitempty"`
	FinishReason    string `json:"finish_reason"`
	WeightVersion   string `json:"weight_version,omitempty"`
	LatencyMs       int64  `json:"latency_ms"`
	// StalenessUnchecked says why the engine's weights could not be checked
	// against max_staleness before the generation ran; empty when they
	// were, or need not be.
	StalenessUnchecked string `json:"staleness_unchecked,omitempty"`
	// Truncated names the limit that cut the generation short (finish
	// reason length): actor_sampling.max_new_tokens.
	Truncated string `json:"truncated,omitempty"`
}

// ActDone is the outcome of one act.
type ActDone struct {
	Envelope
	Rollout    int64       `json:"rollout"`
	Episode    int         `json:"episode"`
	Turn       int         `json:"turn"`
	Key        string      `json:"key"`
	NodeID     string      `json:"node_id"`
	Tool       string      `json:"tool"`
	Input      string      `json:"input"`
	Status     string      `json:"status"`
	Output     string      `json:"output,omitempty"`
	Error      string      `json:"error,omitempty"`
	ErrorKind  string      `json:"error_kind,omitempty"` // for failed acts: ActErr… values
	Attempts   int         `json:"attempts,omitempty"`
	Generation *Generation `json:"generation,omitempty"`  // set when the actor model ran
	ReleasedMs int64       `json:"released_ms,omitempty"` // when its dependencies allowed it to run
	StartedMs  int64       `json:"started_ms,omitempty"`
	EndedMs    int64       `json:"ended_ms,omitempty"`
	// Replica is the act-dispatcher replica that ran it (its service id).
	Replica string `json:"replica,omitempty"`
	// Retries are the generations of the act sent to an actor-gateway
	// again beyond its attempts, oldest first: the gateway that had it was
	// gone (it answered nothing), no gateway acknowledged the request, the
	// gateway no longer kept its answer, or a pause aborted it while it ran.
	// Those the gateways recorded (ActRetries) are in the act's first
	// outcome, whichever runner of the act published it.
	Retries []Retry `json:"retries,omitempty"`
}

func (m *ActDone) Kind() string    { return "act.done/1" }
func (m *ActDone) Subject() string { return subject.ActDone(m.Rollout, m.Episode, m.Key) }
func (m *ActDone) MsgID() string {
	return fmt.Sprintf("act.done.%d.%d.%s", m.Rollout, m.Episode, m.Key)
}
func (m *ActDone) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn, Node: m.Key, Role: RoleActor}
}

// ActRetries records the retries of one act, oldest first: each message on
// its subject holds every retry of the one before it and one more. An
// actor-gateway publishes it before it calls the engine for a generation
// that is a retry, only while the act has no outcome (compare-and-set on
// the act's last message), and the outcome published first carries them
// (its publisher merges them, compare-and-set alike): every generation of
// the act that reached an engine is in the outcome that counts, whichever
// runner of the act published it.
type ActRetries struct {
	Envelope
	Rollout int64   `json:"rollout"`
	Episode int     `json:"episode"`
	Turn    int     `json:"turn"` // the act's turn, as its key says
	Key     string  `json:"key"`
	Retries []Retry `json:"retries"`
	// Gateway is the actor-gateway that recorded the last retry, for the
	// generation of Try it starts.
	Gateway string `json:"gateway"`
	Try     int    `json:"try,omitempty"`
	// After is the sequence of the act's message this one follows (0:
	// none): with Gateway and Try, it names this message for the stream's
	// de-duplication.
	After uint64 `json:"after,omitempty"`
}

func (m *ActRetries) Kind() string    { return "act.retries/1" }
func (m *ActRetries) Subject() string { return subject.ActRetries(m.Rollout, m.Episode, m.Key) }
func (m *ActRetries) MsgID() string {
	return fmt.Sprintf("act.retries.%d.%d.%s.%d.%s.%d", m.Rollout, m.Episode, m.Key, m.After, m.Gateway, m.Try)
}
func (m *ActRetries) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Turn: m.Turn, Node: m.Key, Role: RoleActor}
}

// Episode end states, which are also sample statuses.
const (
	EpisodeCompleted = "completed"
	EpisodeTruncated = "truncated"
	EpisodeFailed    = "failed"
	EpisodeAborted   = "aborted"
	// EpisodeQuarantined: an engine's input drifted from the episode's
	// trajectory (Reason: token_drift, where and how): no role trains on
	// it, and its reward is not computed. Never a sample status.
	EpisodeQuarantined = "quarantined"
)

// EpisodeEnd says that an episode is over.
type EpisodeEnd struct {
	Envelope
	Rollout int64    `json:"rollout"`
	Episode int      `json:"episode"`
	Turns   int      `json:"turns"`
	Status  string   `json:"status"`
	Answers []string `json:"answers,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Acts are the keys of the episode's nodes that have an outcome on
	// act.N.done.E.K (executed, failed or answered from the cache), in
	// turn order: where its samples are.
	Acts []string `json:"acts,omitempty"`
	AtMs int64    `json:"at_ms"`
}

func (m *EpisodeEnd) Kind() string    { return "rollout.end/1" }
func (m *EpisodeEnd) Subject() string { return subject.EpisodeEnd(m.Rollout, m.Episode) }
func (m *EpisodeEnd) MsgID() string   { return fmt.Sprintf("end.%d.%d", m.Rollout, m.Episode) }
func (m *EpisodeEnd) Meta() Meta      { return Meta{Rollout: m.Rollout, Episode: m.Episode} }

// Result statuses.
const (
	ResultOK      = "ok"
	ResultTimeout = "timeout"
	ResultPartial = "partial"
	ResultAborted = "aborted"
	ResultInvalid = "invalid" // the arrival or the rollout was rejected; Reason says why
	ResultFailed  = "failed"  // planact could not produce the samples; Reason says why
)

// Sample is one training sample, in the shape slime trains on.
type Sample struct {
	GroupIndex      int            `json:"group_index"`
	Index           int            `json:"index"`
	RolloutID       string         `json:"rollout_id"` // shared by every sample of one episode
	Prompt          string         `json:"prompt"`
	Tokens          []int          `json:"tokens"`
	Response        string         `json:"response"`
	ResponseLength  int            `json:"response_length"`
	LossMask        []int          `json:"loss_mask"`
	RolloutLogProbs []float64      `json:"rollout_log_probs"`
	Reward          float64        `json:"reward"`
	Status          string         `json:"status"`
	WeightVersions  []string       `json:"weight_versions,omitempty"`
	Label           string         `json:"label,omitempty"`
	Metadata        map[string]any `json:"metadata,omitempty"`
}

// Task states: how each task of a rollout ended, in its result.
const (
	TaskTrained    = "trained"    // the role's samples of it are in its result (or a delivered group)
	TaskFiltered   = "filtered"   // its group did not pass the group filter, or held nothing to train on
	TaskAborted    = "aborted"    // stopped: enough groups (over-sampling), or cancelled
	TaskFailed     = "failed"     // its episode failed, or what the role was to run of it did; Reason says why
	TaskUnfinished = "unfinished" // still running when the rollout timed out
	// TaskEmpty: its episode ended, but nothing of it was for the role's
	// model to run (the actor: no act ran the actor model), so the role has
	// no sample of it.
	TaskEmpty = "empty"
	// TaskQuarantined: its episode was quarantined (token drift): no role
	// trains on it; Reason says where the engine's input drifted.
	TaskQuarantined = "quarantined"
	// TaskEvaluated: its episode ended and is scored in the result's
	// Episodes; an evaluation (config evaluation) delivers no samples.
	TaskEvaluated = "evaluated"
)

// EpisodeOutcome is how one episode of an evaluation ended, scored: what
// an evaluation result holds instead of samples.
type EpisodeOutcome struct {
	Episode    int    `json:"episode"`
	GroupIndex int    `json:"group_index"`
	Index      int    `json:"index"`
	Dataset    string `json:"dataset,omitempty"`
	// Status is the episode's end status, or TaskUnfinished / TaskAborted
	// for an episode that did not end (it has no reward then).
	Status  string   `json:"status"`
	Reason  string   `json:"reason,omitempty"`
	Answers []string `json:"answers,omitempty"`
	Reward  float64  `json:"reward"`
	Correct bool     `json:"correct,omitempty"`
	Turns   int      `json:"turns"`
	// Acts counts the acts the actor model ran (one actor sample each in
	// training); Failures the episode's failed acts by kind, and "reward"
	// when its reward could not be computed.
	Acts     int            `json:"acts"`
	Failures map[string]int `json:"failures,omitempty"`
}

// DatasetStats are Stats' numbers for the episodes of one dataset.
type DatasetStats struct {
	Episodes       int            `json:"episodes"`
	Ended          int            `json:"ended"`
	Correct        int            `json:"correct"`
	Accuracy       float64        `json:"accuracy"`
	MeanReward     float64        `json:"mean_reward"`
	MeanTurns      float64        `json:"mean_turns"`
	Acts           int            `json:"acts"`
	ActsPerEpisode float64        `json:"acts_per_episode"`
	Failures       map[string]int `json:"failures,omitempty"`
	EpisodeStatus  map[string]int `json:"episode_status,omitempty"`
}

// TaskOutcome is how one task (one episode) of a rollout ended.
type TaskOutcome struct {
	Episode    int    `json:"episode"`
	GroupIndex int    `json:"group_index"`
	Index      int    `json:"index"`
	State      string `json:"state"`
	Reason     string `json:"reason,omitempty"`
}

// Group is role's share of one group of a rollout (the copies of one task),
// published as soon as every task of the group ended and the group passed
// the rollout's filter; the rollout's result still follows, with every
// delivered group's samples.
type Group struct {
	Envelope
	Rollout       int64         `json:"rollout"`
	Role          string        `json:"role"`
	GroupIndex    int           `json:"group_index"`
	Samples       []Sample      `json:"samples,omitempty"`
	SamplesObject string        `json:"samples_object,omitempty"`
	SampleCount   int           `json:"sample_count"`
	Tasks         []TaskOutcome `json:"tasks"`
	// Delivered are the rollout's groups delivered so far, this one last.
	Delivered []int `json:"delivered"`
	Groups    int   `json:"groups"` // groups of the rollout
	AtMs      int64 `json:"at_ms"`
}

func (m *Group) Kind() string    { return "rollout.group/1" }
func (m *Group) Subject() string { return subject.Group(m.Rollout, m.Role, m.GroupIndex) }
func (m *Group) MsgID() string {
	return fmt.Sprintf("group.%d.%s.%d", m.Rollout, m.Role, m.GroupIndex)
}
func (m *Group) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: -1, Role: m.Role} }

// Stats summarise a rollout for one role.
type Stats struct {
	Episodes int `json:"episodes"`
	// Ended counts the episodes that ended (any status); Completed those
	// that ended completed. Accuracy and the means are over Ended.
	Ended          int            `json:"ended"`
	Completed      int            `json:"completed"`
	Correct        int            `json:"correct"`
	Accuracy       float64        `json:"accuracy"`
	MeanReward     float64        `json:"mean_reward"`
	MeanTurns      float64        `json:"mean_turns"`
	Acts           int            `json:"acts"`        // executed acts (one actor sample each)
	CachedActs     int            `json:"cached_acts"` // answered from an earlier identical call
	ActsPerEpisode float64        `json:"acts_per_episode"`
	Failures       map[string]int `json:"failures,omitempty"`
	EpisodeStatus  map[string]int `json:"episode_status,omitempty"`
	TaskStates     map[string]int `json:"task_states,omitempty"` // tasks by how they ended (Task…)
	StartedMs      int64          `json:"started_ms,omitempty"`  // when the barrier released the rollout
	FinishedMs     int64          `json:"finished_ms,omitempty"` // when the rollout ended
	WallMs         int64          `json:"wall_ms"`
	Tokens         map[string]int `json:"tokens,omitempty"`
	// StalenessUnchecked counts, by role, the generations of the ended
	// episodes (planner turns, acts) that ran without their weights checked
	// against max_staleness: their engine could not say which it served.
	StalenessUnchecked map[string]int `json:"staleness_unchecked,omitempty"`
	// Datasets are these numbers per dataset, when the tasks name theirs
	// (Task.Dataset); means over each dataset's ended episodes.
	Datasets map[string]DatasetStats `json:"datasets,omitempty"`
}

// Result is one role's share of a finished rollout. Samples are inline, or
// in the object store under SamplesObject when they are large.
type Result struct {
	Envelope
	Rollout       int64    `json:"rollout"`
	Role          string   `json:"role"`
	Status        string   `json:"status"`
	Reason        string   `json:"reason,omitempty"`
	Samples       []Sample `json:"samples,omitempty"`
	SamplesObject string   `json:"samples_object,omitempty"`
	SampleCount   int      `json:"sample_count"`
	Stats         Stats    `json:"stats"`
	// Tasks says how every task of the rollout ended (none is left out).
	Tasks []TaskOutcome `json:"tasks,omitempty"`
	// ArrivalID names the arrival the result answers: the arrival's
	// Nats-Msg-Id, or "seq:<stream sequence>" for one published without.
	// A rejection (Rejected) goes to the rejection subject, never the result's.
	ArrivalID string `json:"arrival_id,omitempty"`
	Rejected  bool   `json:"rejected,omitempty"`
	// Evaluation is set on the result of an evaluation (config
	// evaluation): no samples, by design; Episodes say how every episode
	// ended and scored.
	Evaluation bool             `json:"evaluation,omitempty"`
	Episodes   []EpisodeOutcome `json:"episodes,omitempty"`
	// DeliveredGroups, with result_samples undelivered, are the delivered
	// groups whose samples this result leaves out (their group messages
	// hold them), in the order delivered; GroupSamples counts those
	// samples. SampleCount counts the samples this result holds.
	DeliveredGroups []int `json:"delivered_groups,omitempty"`
	GroupSamples    int   `json:"group_samples,omitempty"`
	// StreamedGroups, with stream_groups, are every group delivered on its
	// group subject, in the order delivered, whatever result_samples: a
	// reader of the groups (client.Groups) reads each until it is there,
	// rather than take a follower's "nothing there" for "not delivered".
	StreamedGroups []int `json:"streamed_groups,omitempty"`
}

func (m *Result) Kind() string { return "rollout.result/1" }
func (m *Result) Subject() string {
	if m.Rejected {
		return subject.Rejected(m.Rollout, m.Role)
	}
	return subject.Result(m.Rollout, m.Role)
}
func (m *Result) MsgID() string {
	if m.Rejected {
		// A rejected arrival must not take the id of the rollout's real
		// result, which would then be dropped as its duplicate.
		return fmt.Sprintf("result.%d.%s.rejected.%s", m.Rollout, m.Role, m.ArrivalID)
	}
	return fmt.Sprintf("result.%d.%s", m.Rollout, m.Role)
}
func (m *Result) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: -1, Role: m.Role} }

// ActorRequest asks the actor-gateway (a NATS service endpoint, not a
// stream) for one generation.
type ActorRequest struct {
	Envelope
	Rollout  int64    `json:"rollout"`
	Episode  int      `json:"episode"`
	Key      string   `json:"key"`
	Engine   Engine   `json:"engine"`
	Prompt   string   `json:"prompt"`
	Sampling Sampling `json:"sampling"`
	// DeadlineMs is when the caller stops waiting (unix ms); the gateway
	// abandons the generation then, freeing the engine's slot.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
	// MaxStaleness is the rollout's max_staleness: the gateway asks the
	// engine which weights it serves right before it generates, and refuses
	// (ActorCodeStale) weights further behind the role's newest.
	MaxStaleness int `json:"max_staleness,omitempty"`

	// Try numbers the generations the caller asked for this act (an
	// attempt after a failure, after a pause, is a new one). A request
	// sent again for the same try (its answers went silent) is the same
	// generation: a gateway that runs it, or ran it a moment ago, answers
	// from it instead of calling the engine again (ActorID).
	Try int `json:"try,omitempty"`
}

// ActorID names the generation a request asks for, the same for every
// request of one try: "<rollout>.<episode>.<key>.<try>".
func (m *ActorRequest) ActorID() string {
	return fmt.Sprintf("%d.%d.%s.%d", m.Rollout, m.Episode, m.Key, m.Try)
}

func (m *ActorRequest) Kind() string    { return "actor.generate/1" }
func (m *ActorRequest) Subject() string { return ActorSubject }
func (m *ActorRequest) MsgID() string   { return "" }
func (m *ActorRequest) Meta() Meta {
	return Meta{Rollout: m.Rollout, Episode: m.Episode, Node: m.Key, Role: RoleActor}
}

// ActorReply is the actor-gateway's answer.
type ActorReply struct {
	Envelope
	Generation Generation `json:"generation"`
}

func (m *ActorReply) Kind() string    { return "actor.reply/1" }
func (m *ActorReply) Subject() string { return "" }
func (m *ActorReply) MsgID() string   { return "" }
func (m *ActorReply) Meta() Meta      { return Meta{Episode: -1} }

// Error codes of the actor-gateway's endpoint (the Nats-Service-Error-Code
// header): like HTTP, 4xx will never work, 5xx may work later.
const (
	ActorCodeInvalid     = "400"
	ActorCodeUnavailable = "503"
	ActorCodeTimeout     = "504" // the caller's deadline passed
	ActorCodePaused      = "423" // the actor role is paused: send it again after the resume
	ActorCodeStale       = "409" // the engine's weights are further behind than max_staleness allows
	ActorCodeBusy        = "429" // the engine asked to be tried again (Retry-After) past the caller's deadline
	ActorCodeTokenDrift  = "422" // the engine took another input than the act's prompt (the description says where)
	ActorCodeGone        = "410" // the gateway ran this try, and keeps its answer no longer
	ActorCodeDone        = "412" // a retry of an act that has an outcome already: not generated again
)

// ActorRetryAfterHeader, on an actor-gateway error, is how long the engine
// asked to be left alone (its Retry-After) in milliseconds: no attempt
// before then.
const ActorRetryAfterHeader = "Planact-Retry-After-Ms"

// ActorSubject is the actor-gateway's service endpoint.
const ActorSubject = "planact.actor.generate"

// ActorInstanceSubject is where actor-gateway instance id (its NATS service
// id) takes requests for itself alone: a request sent again goes there, to
// the generation already running.
func ActorInstanceSubject(id string) string { return "planact.actor." + id + ".generate" }

// Headers of the actor-gateway's answers. Every answer names the instance
// (HdrActorGateway); an acknowledgement, at once, and progress, every
// second while the generation runs, carry HdrActorProgress and no body.
const (
	HdrActorGateway  = "Planact-Gateway"
	HdrActorProgress = "Planact-Progress"
	// HdrActorSend numbers the sends of one try's request (1, 2, …), and
	// the gateway's "started" acknowledgement gives back the number of the
	// send it started from: a generation started from the first send is
	// not a retry, however late its acknowledgement comes.
	HdrActorSend = "Planact-Send"
	// HdrActorRetry, on a request, is the Retry (JSON) a new generation
	// of it would be: a gateway that starts one records it on the ACT
	// stream (ActRetries) before its engine is called; one that attaches
	// the request to a generation running records nothing.
	HdrActorRetry = "Planact-Retry"
)

// Values of HdrActorProgress.
const (
	ActorStarted  = "started"  // the gateway has the request: a new generation, running or waiting for a slot
	ActorAttached = "attached" // the gateway runs this try already: the request is attached to it
	ActorRunning  = "running"  // still generating
)

// Timeout is a scheduled message: when it fires (on the time-out subject),
// the session-store ends the rollout if it is still in the state the
// time-out guards. Kind is "barrier" or "rollout".
type Timeout struct {
	Envelope
	Rollout     int64  `json:"rollout"`
	TimeoutKind string `json:"timeout_kind"`
	DeadlineMs  int64  `json:"deadline_ms"`
}

func (m *Timeout) Kind() string    { return "rollout.timeout/1" }
func (m *Timeout) Subject() string { return subject.TimeoutSchedule(m.Rollout, m.TimeoutKind) }
func (m *Timeout) MsgID() string {
	return fmt.Sprintf("timeout.%d.%s.%d", m.Rollout, m.TimeoutKind, m.DeadlineMs)
}
func (m *Timeout) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: -1} }

// Time-out kinds.
const (
	TimeoutBarrier   = "barrier"   // the other role never arrived
	TimeoutRollout   = "rollout"   // the rollout ran past its deadline
	TimeoutRetention = "retention" // a finished rollout's results may go
)

// Cancel asks planact to abort a rollout: acts stop being retried and both
// roles get an aborted result with the samples finished so far.
type Cancel struct {
	Envelope
	Rollout int64  `json:"rollout"`
	Role    string `json:"role"` // the trainer that cancels
	Reason  string `json:"reason,omitempty"`
	AtMs    int64  `json:"at_ms"`
	// Nonce tells this cancel from another of the rollout by the role sent
	// in the same millisecond (two trainer processes, a retry loop), as a
	// Pause's does: part of the message id only, not of the body.
	Nonce string `json:"-"`
}

func (m *Cancel) Kind() string    { return "rollout.cancel/1" }
func (m *Cancel) Subject() string { return subject.Cancel(m.Rollout, m.Role) }

// MsgID is cancel.<rollout>.<role>.<at_ms> and, when it has one, its
// nonce: one id per cancel call, so a publish retried by the client is
// stored once and another cancel, even in the same millisecond, is a new
// message with its own answer. Planact answers a cancel by whatever id it
// came with, the old form without a nonce included.
func (m *Cancel) MsgID() string {
	if m.Nonce == "" {
		return fmt.Sprintf("cancel.%d.%s.%d", m.Rollout, m.Role, m.AtMs)
	}
	return fmt.Sprintf("cancel.%d.%s.%d.%s", m.Rollout, m.Role, m.AtMs, m.Nonce)
}
func (m *Cancel) Meta() Meta { return Meta{Rollout: m.Rollout, Episode: -1, Role: m.Role} }

// MetaInt reads an integer from a decoded sample's metadata: msgpack gives
// the smallest integer type that holds it, JSON a float64. ok is false when
// v is not a number.
func MetaInt(v any) (n int, ok bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int8:
		return int(x), true
	case int16:
		return int(x), true
	case int32:
		return int(x), true
	case int64:
		return int(x), true
	case uint8:
		return int(x), true
	case uint16:
		return int(x), true
	case uint32:
		return int(x), true
	case uint64:
		return int(x), true
	case float64:
		return int(x), true
	}
	return 0, false
}

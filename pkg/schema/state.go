package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/reward"
)

// Failure policies: what happens to a turn when an act fails for good.
const (
	PolicySkip   = "skip"   // dependents are skipped; the turn ends with what it has
	PolicyReplan = "replan" // the planner sees the failure in its next turn
	PolicyFail   = "fail"   // the episode ends failed
)

// Parse-error policies.
const (
	ParseReprompt = "reprompt" // the planner gets the parser's message next turn
	ParseEnd      = "end"      // the episode ends failed
)

// Scheduling modes.
const (
	ScheduleEager      = "eager"      // a node runs as soon as its dependencies are done
	ScheduleLevels     = "levels"     // a barrier between topological levels
	ScheduleSequential = "sequential" // one node at a time
)

// Coordination modes (pkg/mode): how the planner and the actor work
// together in an episode.
const (
	ModePlanAct    = "plan_act"    // the planner plans, the actor carries out the plan's acts
	ModePeerReview = "peer_review" // the actor answers, the planner reviews until it accepts
	ModeEnsemble   = "ensemble"    // plan_act with every act of the actor asked ensemble_k times, and a pick (ensemble_pick)
)

// Modes are the coordination modes a rollout may name (mode).
var Modes = []string{ModePlanAct, ModePeerReview, ModeEnsemble}

// How mode ensemble picks among an act's candidates (ensemble_pick).
const (
	EnsemblePickVote    = "vote"    // the most frequent answer, in the act-dispatcher (default)
	EnsemblePickPlanner = "planner" // the planner, in its next reply
)

// EnsemblePicks lists the values of ensemble_pick.
var EnsemblePicks = []string{EnsemblePickVote, EnsemblePickPlanner}

// DefaultEnsembleK is ensemble_k in mode ensemble when the config leaves it 0.
const DefaultEnsembleK = 3

// Tool kinds.
const (
	ToolActor = "actor" // the actor model answers
	ToolHTTP  = "http"  // POST {"queries":[…], "topk":…} to a URL
	ToolGo    = "go"    // a Go function the act-dispatcher's program registered (pkg/tool)
)

// Tool is a tool the planner may call.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Kind        string `json:"kind,omitempty"` // actor (default) or http
	URL         string `json:"url,omitempty"`
}

// Config is a rollout's configuration, sent by a trainer with its arrival.
// Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Mode names the coordination mode (Modes); default plan_act.
	Mode string `json:"mode,omitempty"`
	// EnsembleK is how many times mode ensemble asks the actor for each
	// act (2 to 16; default 3 in that mode, and only for it).
	EnsembleK int `json:"ensemble_k,omitempty"`
	// EnsemblePick is who picks among an act's candidates in mode ensemble
	// (EnsemblePicks; default vote, and only for that mode).
	EnsemblePick     string   `json:"ensemble_pick,omitempty"`
	MaxTurns         int      `json:"max_turns,omitempty"`
	PlanFormat       string   `json:"plan_format,omitempty"`  // format the prompt asks for
	ParseFormat      string   `json:"parse_format,omitempty"` // force the parser's format; "" = auto
	Tools            []Tool   `json:"tools,omitempty"`
	FailurePolicy    string   `json:"failure_policy,omitempty"`
	ParseErrorPolicy string   `json:"parse_error_policy,omitempty"`
	Schedule         string   `json:"schedule,omitempty"`
	MaxNodes         int      `json:"max_nodes,omitempty"`
	MaxContextTokens int      `json:"max_context_tokens,omitempty"`
	ActRetries       int      `json:"act_retries,omitempty"` // -1: no retries
	ActTimeoutS      float64  `json:"act_timeout_s,omitempty"`
	BarrierTimeoutS  float64  `json:"barrier_timeout_s,omitempty"`
	RolloutTimeoutS  float64  `json:"rollout_timeout_s,omitempty"`
	PlannerTimeoutS  float64  `json:"planner_timeout_s,omitempty"` // per planner generation attempt
	PlannerSampling  Sampling `json:"planner_sampling,omitempty"`
	ActorSampling    Sampling `json:"actor_sampling,omitempty"`
	Reward           string   `json:"reward,omitempty"` // "f1" (default), "em", or a reward server URL
	SplitActReward   bool     `json:"split_act_reward,omitempty"`
	// StreamPlans releases a turn's nodes while the planner is still
	// writing: the planner-gateway publishes the plan so far as it grows.
	StreamPlans bool `json:"stream_plans,omitempty"`
	// StreamGroups publishes each group (the copies of one task) on
	// rollout.N.result.<role>.group.<g> as soon as all its tasks ended, for
	// a trainer that trains on groups as they come. A group filter or
	// target_groups implies it.
	StreamGroups bool `json:"stream_groups,omitempty"`
	// GroupFilter decides which complete groups (the copies of one task)
	// are delivered: "none" (the default), "spread" (groups whose rewards
	// all equal are dropped: they give group-relative advantages nothing),
	// or the URL of a filter server (POST the group → {"keep", "reason"}).
	GroupFilter string `json:"group_filter,omitempty"`
	// TargetGroups, over-sampling: the rollout ends as soon as this many
	// groups were delivered; the episodes still running are stopped. 0: all.
	TargetGroups int `json:"target_groups,omitempty"`
	// ResultSamples says which samples a rollout that delivers groups puts
	// in its results: "all" (absent) every delivered group's again, with
	// those of the tasks outside them; "undelivered" only the latter, for
	// trainers that take the groups as they come: the results then name the
	// groups left out (Result.DeliveredGroups) and count their samples
	// (Result.GroupSamples), and the rollout's end neither reads the
	// groups back nor writes their samples again.
	ResultSamples string `json:"result_samples,omitempty"`
	// MaxStaleness bounds, in weight versions (the numbers versions end
	// in), how far behind the trainer's newest weights a generation's may
	// be: older, the work is not started; a sample whose oldest segment is
	// further behind at the end is marked stale. 0: no bound.
	MaxStaleness int `json:"max_staleness,omitempty"`
	// Evaluation makes the rollout an evaluation: both roles' results carry
	// the stats and every episode's outcome (Result.Episodes), and no
	// samples; nothing is assembled for training.
	Evaluation bool `json:"evaluation,omitempty"`
}

// DefaultConfig is what a rollout gets for every field its trainers leave zero.
func DefaultConfig() Config {
	return Config{
		Mode:             ModePlanAct,
		MaxTurns:         4,
		PlanFormat:       string(plan.FormatGraph),
		Tools:            []Tool{{Name: "search", Description: "look up one short fact, e.g. search(\"capital of France\")", Kind: ToolActor}},
		FailurePolicy:    PolicyReplan,
		ParseErrorPolicy: ParseReprompt,
		Schedule:         ScheduleEager,
		MaxNodes:         32,
		MaxContextTokens: 16384,
		ActRetries:       3,
		ActTimeoutS:      60,
		BarrierTimeoutS:  1800,
		RolloutTimeoutS:  3600,
		PlannerTimeoutS:  300,
		PlannerSampling:  Sampling{Temperature: Float(1), TopP: Float(1), MaxNewTokens: 1024},
		ActorSampling:    Sampling{Temperature: Float(1), TopP: Float(1), MaxNewTokens: 128},
		Reward:           "f1",
	}
}

// roleSampling is role's sampling field of c, and its default.
func (c *Config) roleSampling(role string) (*Sampling, Sampling, string) {
	d := DefaultConfig()
	if role == RolePlanner {
		return &c.PlannerSampling, d.PlannerSampling, "planner_sampling"
	}
	return &c.ActorSampling, d.ActorSampling, "actor_sampling"
}

// CheckSampling checks an arrival's own sampling (Arrive.Sampling) of
// role, its defaults applied.
func CheckSampling(role string, s Sampling) error {
	_, d, _ := new(Config).roleSampling(role)
	return s.withDefaults(d).Validate("sampling", MaxContextTokensLimit)
}

// TakeSampling makes s, an arrival's own sampling of role (Arrive.Sampling),
// the role's sampling in c, before c's defaults are applied. A c that sets
// the role's sampling to something else (the planner's config, say, with
// an actor_sampling the actor's trainer did not ask for) is an error
// naming both: which one is meant is the user's to say.
func (c *Config) TakeSampling(role string, s Sampling, from string) error {
	field, d, name := c.roleSampling(role)
	set, _ := json.Marshal(*field)
	was, _ := json.Marshal(field.withDefaults(d))
	now, _ := json.Marshal(s.withDefaults(d))
	if string(set) != "{}" && string(was) != string(now) {
		return fmt.Errorf("config: %s: the %s's arrival asks for %s, the config (the %s's) for %s: give it in one of them", name, role, now, from, was)
	}
	*field = s
	return nil
}

// WithDefaults fills the zero fields of c from DefaultConfig.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.Mode == "" {
		c.Mode = d.Mode
	}
	if c.Mode == ModeEnsemble && c.EnsembleK == 0 {
		c.EnsembleK = DefaultEnsembleK
	}
	if c.Mode == ModeEnsemble && c.EnsemblePick == "" {
		c.EnsemblePick = EnsemblePickVote
	}
	if c.MaxTurns == 0 {
		c.MaxTurns = d.MaxTurns
	}
	if c.PlanFormat == "" {
		c.PlanFormat = d.PlanFormat
	}
	if len(c.Tools) == 0 {
		c.Tools = d.Tools
	}
	if c.FailurePolicy == "" {
		c.FailurePolicy = d.FailurePolicy
	}
	if c.ParseErrorPolicy == "" {
		c.ParseErrorPolicy = d.ParseErrorPolicy
	}
	if c.Schedule == "" {
		c.Schedule = d.Schedule
	}
	if c.MaxNodes == 0 {
		c.MaxNodes = d.MaxNodes
	}
	if c.MaxContextTokens == 0 {
		c.MaxContextTokens = d.MaxContextTokens
	}
	if c.ActRetries == 0 {
		c.ActRetries = d.ActRetries
	}
	if c.ActTimeoutS == 0 {
		c.ActTimeoutS = d.ActTimeoutS
	}
	if c.BarrierTimeoutS == 0 {
		c.BarrierTimeoutS = d.BarrierTimeoutS
	}
	if c.RolloutTimeoutS == 0 {
		c.RolloutTimeoutS = d.RolloutTimeoutS
	}
	if c.PlannerTimeoutS == 0 {
		c.PlannerTimeoutS = d.PlannerTimeoutS
	}
	c.PlannerSampling = c.PlannerSampling.withDefaults(d.PlannerSampling)
	c.ActorSampling = c.ActorSampling.withDefaults(d.ActorSampling)
	if c.Reward == "" {
		c.Reward = d.Reward
	}
	return c
}

// Ranges of the configuration's numbers (README, "Rollout configuration").
// A value outside its range, or a number that is not finite, rejects the
// arrival: a mistake must not run as something else.
const (
	MaxTurnsLimit         = 100
	MaxNodesLimit         = 1024
	MaxContextTokensLimit = 1 << 20
	MinContextTokens      = 16
	MaxActRetries         = 20
	MaxActTimeoutS        = 86400
	// MinTimeoutS is the shortest time-out planact takes, of an act, a
	// planner generation, the barrier, a rollout or a pause: each waits
	// for work that takes seconds, and less is a mistake (a value meant in
	// other units, 1e-300) that would time out at once.
	MinTimeoutS        = 1
	MaxRolloutTimeoutS = 7 * 86400
	MaxTemperature     = 100
	MaxStops           = 16
	MaxStopChars       = 256 // characters (Unicode code points) of a stop string, as JSON Schema's maxLength counts
	MaxTools           = 64
)

// Validate reports the first field that holds a value planact does not
// know or that is out of its range, naming the field.
func (c Config) Validate() error {
	if !slices.Contains(Modes, c.Mode) {
		return fmt.Errorf("config: mode %q: want one of %s", c.Mode, strings.Join(Modes, ", "))
	}
	switch {
	case c.Mode == ModeEnsemble && (c.EnsembleK < 2 || c.EnsembleK > 16):
		return fmt.Errorf("config: ensemble_k %d: want 2 to 16", c.EnsembleK)
	case c.Mode != ModeEnsemble && c.EnsembleK != 0:
		return fmt.Errorf("config: ensemble_k %d: only for mode ensemble (mode is %s)", c.EnsembleK, c.Mode)
	case c.Mode != ModeEnsemble && c.EnsemblePick != "":
		return fmt.Errorf("config: ensemble_pick %q: only for mode ensemble (mode is %s)", c.EnsemblePick, c.Mode)
	case c.Mode == ModeEnsemble && c.EnsemblePick != "" && !slices.Contains(EnsemblePicks, c.EnsemblePick):
		return fmt.Errorf("config: ensemble_pick %q: want one of %s", c.EnsemblePick, strings.Join(EnsemblePicks, ", "))
	}
	switch {
	case c.StreamPlans && c.Mode == ModeEnsemble:
		// Nodes released from a partial plan would run once, before the
		// final plan turns them into candidates and a vote.
		return fmt.Errorf("config: stream_plans: not with mode ensemble (each act runs as ensemble_k candidates, made from the final plan)")
	case c.StreamPlans && c.Mode != ModePlanAct:
		// Streaming releases the nodes of a plan_act plan still being
		// written; another mode's planner output is not one.
		return fmt.Errorf("config: stream_plans: not with mode %s (only plan_act's planner writes plans whose nodes can run before it finishes)", c.Mode)
	}
	if c.SplitActReward && c.Mode != ModePlanAct {
		// peer_review and ensemble reward the actor's samples their own
		// way (each attempt, each candidate): nothing there divides the
		// episode's reward among acts.
		return fmt.Errorf("config: split_act_reward: only for mode plan_act (mode %s rewards each actor sample its own way)", c.Mode)
	}
	if c.Mode == ModePeerReview && c.MaxTurns < 2 {
		return fmt.Errorf("config: max_turns %d: mode peer_review wants at least 2 (turn 1 is the actor's first answer, the planner reviews from turn 2)", c.MaxTurns)
	}
	switch c.FailurePolicy {
	case PolicySkip, PolicyReplan, PolicyFail:
	default:
		return fmt.Errorf("config: failure_policy %q: want skip, replan or fail", c.FailurePolicy)
	}
	switch c.ParseErrorPolicy {
	case ParseReprompt, ParseEnd:
	default:
		return fmt.Errorf("config: parse_error_policy %q: want reprompt or end", c.ParseErrorPolicy)
	}
	switch c.Schedule {
	case ScheduleEager, ScheduleLevels, ScheduleSequential:
	default:
		return fmt.Errorf("config: schedule %q: want eager, levels or sequential", c.Schedule)
	}
	if !knownFormat(c.PlanFormat) {
		return fmt.Errorf("config: plan_format %q: want one of %s", c.PlanFormat, formatList())
	}
	if c.ParseFormat != "" && c.ParseFormat != string(plan.FormatAuto) && !knownFormat(c.ParseFormat) {
		return fmt.Errorf("config: parse_format %q: want auto or one of %s", c.ParseFormat, formatList())
	}
	for _, r := range []struct {
		name     string
		v        int
		min, max int
	}{
		{"max_turns", c.MaxTurns, 1, MaxTurnsLimit},
		{"max_nodes", c.MaxNodes, 1, MaxNodesLimit},
		{"max_context_tokens", c.MaxContextTokens, MinContextTokens, MaxContextTokensLimit},
		{"act_retries", c.ActRetries, -1, MaxActRetries},
		{"max_staleness", c.MaxStaleness, 0, 1 << 20},
		{"target_groups", c.TargetGroups, 0, 1 << 20},
	} {
		if r.v < r.min || r.v > r.max {
			return fmt.Errorf("config: %s %d: want %d to %d", r.name, r.v, r.min, r.max)
		}
	}
	for _, r := range []struct {
		name string
		v    float64
		max  int
	}{
		{"act_timeout_s", c.ActTimeoutS, MaxActTimeoutS},
		{"planner_timeout_s", c.PlannerTimeoutS, MaxActTimeoutS},
		{"barrier_timeout_s", c.BarrierTimeoutS, MaxRolloutTimeoutS},
		{"rollout_timeout_s", c.RolloutTimeoutS, MaxRolloutTimeoutS},
	} {
		if !inSeconds(r.v, MinTimeoutS, r.max) {
			return fmt.Errorf("config: %s %g: want a number of seconds from %d to %d", r.name, r.v, MinTimeoutS, r.max)
		}
	}
	if err := c.validateReward(); err != nil {
		return err
	}
	switch {
	case c.GroupFilter == "", c.GroupFilter == FilterNone, c.GroupFilter == FilterSpread:
	case strings.HasPrefix(c.GroupFilter, "http://") || strings.HasPrefix(c.GroupFilter, "https://"):
		if err := checkURL(c.GroupFilter); err != nil {
			return fmt.Errorf("config: group_filter %q: %w", c.GroupFilter, err)
		}
	default:
		return fmt.Errorf("config: group_filter %q: want none, spread or the URL of a filter server", c.GroupFilter)
	}
	switch c.ResultSamples {
	case "", ResultSamplesAll:
	case ResultSamplesUndelivered:
		if !c.Grouped() {
			return fmt.Errorf("config: result_samples %q: only with stream_groups, group_filter or target_groups (the samples left out are those delivered in groups)", c.ResultSamples)
		}
	default:
		return fmt.Errorf("config: result_samples %q: want %s or %s", c.ResultSamples, ResultSamplesAll, ResultSamplesUndelivered)
	}
	if c.Evaluation && c.Grouped() {
		return fmt.Errorf("config: evaluation with stream_groups, group_filter or target_groups: an evaluation delivers no groups (it scores every episode); want none of them")
	}
	if err := c.PlannerSampling.Validate("config: planner_sampling", c.MaxContextTokens); err != nil {
		return err
	}
	if err := c.ActorSampling.Validate("config: actor_sampling", MaxContextTokensLimit); err != nil {
		return err
	}
	return c.validateTools()
}

func (c Config) validateReward() error {
	switch c.Reward {
	case "f1", "em":
		return nil
	}
	if _, ok := reward.Lookup(c.Reward); ok {
		return nil // registered by the program (reward.Register)
	}
	if !strings.HasPrefix(c.Reward, "http://") && !strings.HasPrefix(c.Reward, "https://") {
		if regs := reward.Registered(); len(regs) > 0 {
			return fmt.Errorf("config: reward %q: want f1, em, one registered (%s) or the URL of a reward server", c.Reward, strings.Join(regs, ", "))
		}
		return fmt.Errorf("config: reward %q: want f1, em or the URL of a reward server", c.Reward)
	}
	if err := checkURL(c.Reward); err != nil {
		return fmt.Errorf("config: reward %q: %w", c.Reward, err)
	}
	return nil
}

func (c Config) validateTools() error {
	if len(c.Tools) > MaxTools {
		return fmt.Errorf("config: %d tools: want at most %d", len(c.Tools), MaxTools)
	}
	seen := map[string]bool{}
	for i, t := range c.Tools {
		switch {
		case t.Name == "":
			return fmt.Errorf("config: tools[%d] has no name", i)
		case !validToolName(t.Name):
			return fmt.Errorf("config: tools[%d] name %q: want 1 to 64 letters, digits, '_' or '-'", i, t.Name)
		case seen[t.Name]:
			return fmt.Errorf("config: tool %q is declared twice", t.Name)
		case t.Kind != "" && t.Kind != ToolActor && t.Kind != ToolHTTP && t.Kind != ToolGo:
			return fmt.Errorf("config: tool %q: kind %q: want actor, http or go", t.Name, t.Kind)
		case t.Kind == ToolHTTP && t.URL == "":
			return fmt.Errorf("config: http tool %q has no url", t.Name)
		case t.Kind != ToolHTTP && t.URL != "":
			return fmt.Errorf("config: tool %q: url %q is only for kind http", t.Name, t.URL)
		case c.Mode == ModeEnsemble && t.Name == "vote": // mode.VoteTool (pkg/mode imports this package)
			return fmt.Errorf("config: tool %q: mode ensemble runs its votes as acts of a tool of that name; name the tool otherwise", t.Name)
		}
		if t.Kind == ToolHTTP {
			if err := checkURL(t.URL); err != nil {
				return fmt.Errorf("config: http tool %q: url %q: %w", t.Name, t.URL, err)
			}
		}
		seen[t.Name] = true
	}
	return nil
}

func validToolName(name string) bool {
	if len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// inSeconds reports whether s is a number of seconds from lo to hi (not
// NaN, not infinite).
func inSeconds(s float64, lo, hi int) bool {
	return !math.IsNaN(s) && s >= float64(lo) && s <= float64(hi)
}

// checkURL accepts an absolute http or https URL with a host.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("want an http or https URL")
	case u.Host == "":
		return fmt.Errorf("the URL has no host")
	}
	return nil
}

// ParseOptions are the parser options of the rollout's plans.
// Grouped reports whether the rollout's groups are decided and published as
// they complete (stream_groups, a group filter or target_groups).
func (c Config) Grouped() bool {
	return c.StreamGroups || c.Filtering()
}

// Filtering reports whether some complete groups may not be delivered.
func (c Config) Filtering() bool {
	return c.TargetGroups > 0 || (c.GroupFilter != "" && c.GroupFilter != FilterNone)
}

func (c Config) ParseOptions() plan.Options {
	format := plan.Format(c.ParseFormat)
	if _, custom := plan.Custom(plan.Format(c.PlanFormat)); custom && (format == "" || format == plan.FormatAuto) {
		// The planner was asked for a format of the program's own, which
		// no detector knows: its outputs are read in it.
		format = plan.Format(c.PlanFormat)
	}
	return plan.Options{Format: format, Tools: c.ToolNames(), MaxNodes: c.MaxNodes}
}

// knownFormat says whether f is a built-in plan format or one the program
// registered (plan.RegisterFormat).
func knownFormat(f string) bool {
	_, custom := plan.Custom(plan.Format(f))
	return slices.Contains(PlanFormats, f) || custom
}

// formatList names the formats for an error: the built-in ones and those
// registered.
func formatList() string {
	names := slices.Clone(PlanFormats)
	for _, f := range plan.CustomFormats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// PartialNodes are the leading nodes, of a plan still being written, that
// are complete: those that name a configured tool. A task list names its
// tasks before the tool calls that give them a tool and arguments, and
// until its call is written a task has the parser's default tool.
func (c Config) PartialNodes(nodes []plan.Node) []plan.Node {
	for i, n := range nodes {
		if _, ok := c.Tool(n.Tool); !ok {
			return nodes[:i]
		}
	}
	return nodes
}

// PlanFormats are the formats a planner can be asked for (plan_format) or
// held to (parse_format).
var PlanFormats = []string{
	string(plan.FormatGraph), string(plan.FormatTaskList), string(plan.FormatJSON), string(plan.FormatNumbered), string(plan.FormatSteps),
}

// Tool returns the tool named name.
func (c Config) Tool(name string) (Tool, bool) {
	for _, t := range c.Tools {
		if t.Name == name {
			if t.Kind == "" {
				t.Kind = ToolActor
			}
			return t, true
		}
	}
	return Tool{}, false
}

// ToolNames lists the configured tools.
func (c Config) ToolNames() []string {
	names := make([]string, len(c.Tools))
	for i, t := range c.Tools {
		names[i] = t.Name
	}
	return names
}

// Seconds turns a config field in seconds into a duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Session states.
const (
	SessionWaiting = "waiting" // one role has arrived
	SessionRunning = "running"
	SessionDone    = "done"
	SessionTimeout = "timeout"
	SessionAborted = "aborted"
)

// RoleInfo is what a session keeps of one role's arrival.
type RoleInfo struct {
	Engine        Engine `json:"engine"`
	WeightVersion string `json:"weight_version,omitempty"`
	ArrivedMs     int64  `json:"arrived_ms"`
	// ArrivalID is the Nats-Msg-Id of the arrival that counted (or
	// "seq:<stream sequence>"): another arrival of the role is a re-submission.
	ArrivalID string `json:"arrival_id,omitempty"`
	// Digest sums what the arrival asked for: engine, weight version,
	// config and tasks, not its message id, attempt or time. Another arrival
	// of the role with the same digest is the same one sent again
	// (harmless); with another it is refused, naming what differs.
	Digest string `json:"digest,omitempty"`
	// ConfigDigest sums the configuration the arrival carried, its
	// defaults applied ("" without one), and Tasks is its task list's
	// digest ("" without tasks; TaskList.Digest).
	ConfigDigest string `json:"config_digest,omitempty"`
	Tasks        string `json:"tasks,omitempty"`
	// Sampling is the arrival's own sampling (Arrive.Sampling), which the
	// rollout's config takes for the role at the start.
	Sampling *Sampling `json:"sampling,omitempty"`
	// ResultStatus is the status of the role's result once it is out, and
	// ResultReason why: each role's result has its own (the actor's can be
	// failed where the planner's is ok). Empty before the results go out,
	// and in a session recorded before roles had them.
	ResultStatus string `json:"result_status,omitempty"`
	ResultReason string `json:"result_reason,omitempty"`
}

// Group filters.
const (
	FilterNone   = "none"
	FilterSpread = "spread"
)

// What the results of a rollout that delivers groups hold (result_samples).
const (
	ResultSamplesAll         = "all"
	ResultSamplesUndelivered = "undelivered"
)

// LeavesOutGroups reports whether the results leave the delivered groups'
// samples out (result_samples undelivered).
func (c Config) LeavesOutGroups() bool { return c.ResultSamples == ResultSamplesUndelivered }

// GroupState is how a complete group of a rollout ended.
type GroupState struct {
	Index  int    `json:"index"`
	State  string `json:"state"` // delivered, filtered, surplus or failed
	Reason string `json:"reason,omitempty"`
	// Scores are the rewards of the group's ended episodes, recorded with
	// the verdict when the reward is a remote server's (reward: URL): the
	// filter decided on them, the group's samples carry them and the
	// result counts them, and the server is asked once per episode. A
	// reward computed here (em, f1, a registered function) is computed
	// again where needed and not recorded.
	Scores []EpisodeScore `json:"scores,omitempty"`
}

// EpisodeScore is one episode's reward as the reward server gave it, or
// why it gave none (Error: the episode scores 0, and says so).
type EpisodeScore struct {
	Episode int     `json:"episode"`
	Reward  float64 `json:"reward"`
	Correct bool    `json:"correct,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// Scores are the rewards recorded with the rollout's group verdicts and
// at its end, by episode.
func (s *Session) Scores() map[int]EpisodeScore {
	var out map[int]EpisodeScore
	record := func(scores []EpisodeScore) {
		for _, sc := range scores {
			if out == nil {
				out = map[int]EpisodeScore{}
			}
			out[sc.Episode] = sc
		}
	}
	for _, gs := range s.Groups {
		record(gs.Scores)
	}
	record(s.EndScores)
	return out
}

// Group states.
const (
	GroupDelivered = "delivered"
	GroupFiltered  = "filtered"
	// GroupSurplus: complete and passed, but target_groups were already
	// delivered (groups that completed together); not delivered.
	GroupSurplus = "surplus"
	// GroupFailed: complete, but it could not be decided or delivered and
	// never will be (a permanent error, in Reason); not delivered.
	GroupFailed = "failed"
)

// EffectGroup is the outbox effect that delivers group g: "group:<g>".
func EffectGroup(g int) string { return fmt.Sprintf("group:%d", g) }

// EffectVersion is the outbox effect that records an arrived role's weight
// version as the role's newest (what staleness is counted from), before
// the rollout starts: "version:<role>".
func EffectVersion(role string) string { return "version:" + role }

// Effects a session records as decided before they are published (its
// outbox): whoever reads the session next — a handler, a redelivery, the
// session-store's sweep — publishes them, idempotently, and removes them.
const (
	EffectBarrier = "barrier" // schedule the barrier time-out
	EffectStart   = "start"   // the rollout's deadline, start event and first plan requests
	EffectResults = "results" // each arrived role's result
	EffectCleanup = "cleanup" // remove the run state and the tasks; schedule the result retention
)

// Session is the KV value (bucket sessions, key "<N>") that is a rollout's
// barrier and lifecycle. It is only ever written by compare-and-set.
type Session struct {
	Rollout    int64               `json:"rollout"`
	State      string              `json:"state"`
	Roles      map[string]RoleInfo `json:"roles"`
	Config     Config              `json:"config"`
	ConfigFrom string              `json:"config_from,omitempty"` // role whose config was taken
	Episodes   int                 `json:"episodes"`
	Ended      []int               `json:"ended,omitempty"` // ended episodes, sorted
	Acts       int                 `json:"acts,omitempty"`  // acts of the ended episodes
	Trace      string              `json:"trace"`           // W3C trace id of the rollout
	CreatedMs  int64               `json:"created_ms"`
	StartedMs  int64               `json:"started_ms,omitempty"`
	FinishedMs int64               `json:"finished_ms,omitempty"`
	// Status is the result status decided when the rollout ended, and
	// Reason why; once the results are out, the first arrived role's result
	// status (the planner's when it arrived), and each role's own is in
	// Roles (RoleInfo.ResultStatus).
	Status string `json:"status,omitempty"`
	Reason string `json:"reason,omitempty"`
	// CancelledBy is the Nats-Msg-Id of the cancel that ended the rollout
	// (that cancel delivered again is answered as it was the first time).
	CancelledBy string `json:"cancelled_by,omitempty"`
	// Late are, by role, the arrivals that came after the rollout had ended
	// without their role, last answered (on the role's result subject)
	// when. Each answer is recorded after it is published, so that the
	// session, kept for the history from its last write, outlives it.
	Late map[string]LateArrival `json:"late,omitempty"`
	// ResultsMs is when the results were published: the write that
	// settled them. Their retention is counted from it.
	ResultsMs int64 `json:"results_ms,omitempty"`
	// Outbox lists the effects decided and not yet known to be published.
	Outbox []string `json:"outbox,omitempty"`
	// Objects are the result objects ("bucket/name") the rollout left in the
	// object stores, removed once the result retention has passed.
	Objects []string `json:"objects,omitempty"`
	// Groups are the groups that completed, delivered or filtered, in the
	// order they did.
	Groups []GroupState `json:"groups,omitempty"`
	// EndScores are the rewards of ended episodes that no group verdict
	// scored, recorded when the results are assembled and before any is
	// published, when the reward is a remote server's: a result published
	// again (one role's went out, the other's failed) carries the answers
	// the first one did, and the server is asked once per episode.
	EndScores []EpisodeScore `json:"end_scores,omitempty"`
}

// LateArrival is an arrival of a role that came after its rollout had
// ended without it.
type LateArrival struct {
	ArrivalID string `json:"arrival_id"`
	AtMs      int64  `json:"at_ms"` // when it was last answered
}

// Group returns how group g ended, if it did.
func (s *Session) Group(g int) (GroupState, bool) {
	for _, gs := range s.Groups {
		if gs.Index == g {
			return gs, true
		}
	}
	return GroupState{}, false
}

// Delivered lists the delivered groups, in the order they were.
func (s *Session) Delivered() []int {
	var out []int
	for _, gs := range s.Groups {
		if gs.State == GroupDelivered {
			out = append(out, gs.Index)
		}
	}
	return out
}

// Final reports whether the rollout has ended.
func (s *Session) Final() bool {
	return s.State != SessionWaiting && s.State != SessionRunning
}

// Owes reports whether effect is in the outbox.
func (s *Session) Owes(effect string) bool { return slices.Contains(s.Outbox, effect) }

// Settle removes effects from the outbox and reports whether any was there.
func (s *Session) Settle(effects ...string) bool {
	n := len(s.Outbox)
	s.Outbox = slices.DeleteFunc(s.Outbox, func(e string) bool { return slices.Contains(effects, e) })
	if len(s.Outbox) == 0 {
		s.Outbox = nil
	}
	return len(s.Outbox) != n
}

// BarrierDeadlineMs is when a waiting rollout times out.
func (s *Session) BarrierDeadlineMs() int64 {
	return s.CreatedMs + Seconds(s.Config.WithDefaults().BarrierTimeoutS).Milliseconds()
}

// DeadlineMs is when a running rollout times out.
func (s *Session) DeadlineMs() int64 {
	return s.StartedMs + Seconds(s.Config.WithDefaults().RolloutTimeoutS).Milliseconds()
}

// MarkEnded records that episode e ended and reports whether that is news.
func (s *Session) MarkEnded(e int) bool {
	i, found := slices.BinarySearch(s.Ended, e)
	if found {
		return false
	}
	s.Ended = slices.Insert(s.Ended, i, e)
	return true
}

// EndedCount is the number of episodes that have ended.
func (s *Session) EndedCount() int { return len(s.Ended) }

// TaskList is the KV value (bucket sessions, key "<N>.tasks") holding a
// rollout's tasks, written once by the arrival that brings them. A list too
// large for a KV value stays in the object store and the value names it.
type TaskList struct {
	Tasks  []Task `json:"tasks,omitempty"`
	Object string `json:"object,omitempty"` // the list is this TaskList in the object store tasks_<From>
	// From is the role whose arrival brought the list, and Digest the
	// list's: TasksDigest of the tasks, or, for an object, DigestSHA256 and
	// the SHA-256 of its bytes its arrival named (tasks_sha256), which
	// every reader checks. Another arrival's list is compared by it.
	From   string `json:"from,omitempty"`
	Digest string `json:"digest,omitempty"`
}

// DigestSHA256 prefixes a digest that is a SHA-256 in lower-case hex.
const DigestSHA256 = "sha256:"

// TasksDigest names a task list by its content: equal lists have equal
// digests, whatever the order of their metadata's keys.
func TasksDigest(tasks []Task) string {
	data, err := json.Marshal(tasks)
	if err != nil {
		// A task decoded from msgpack always encodes; say so rather than
		// let two lists share a digest.
		return "unencodable: " + err.Error()
	}
	sum := sha256.Sum256(data)
	return DigestSHA256 + hex.EncodeToString(sum[:])
}

// Node states of a run.
const (
	NodePending  = "pending"  // waiting for dependencies
	NodeReleased = "released" // its act.run has been published
	NodeDone     = "done"
	NodeFailed   = "failed"
	NodeSkipped  = "skipped"
	NodeCached   = "cached"
)

// NodeState is one node of a run.
type NodeState struct {
	Node   plan.Node `json:"node"`
	Key    string    `json:"key"`
	Status string    `json:"status"`
	Input  string    `json:"input,omitempty"` // as executed, placeholders replaced
	Output string    `json:"output,omitempty"`
	Error  string    `json:"error,omitempty"`
	// ErrorKind of a failed node: an ActErr… value.
	ErrorKind string `json:"error_kind,omitempty"`
	// CachedFrom is the key of the earlier act of the episode with the same
	// tool and arguments whose result this node takes (the duplicate guard);
	// while that act is still running the node stays released and waits.
	CachedFrom string `json:"cached_from,omitempty"`
	// ReleasedMs is when the node was released (unix ms).
	ReleasedMs int64 `json:"released_ms,omitempty"`
}

// Terminal reports whether the node will not change any more.
func (n *NodeState) Terminal() bool {
	switch n.Status {
	case NodeDone, NodeFailed, NodeSkipped, NodeCached:
		return true
	}
	return false
}

// Run is the KV value (bucket runs, key "<N>.<E>.<turn>") holding the
// execution state of one episode turn.
type Run struct {
	Rollout  int64        `json:"rollout"`
	Episode  int          `json:"episode"`
	Turn     int          `json:"turn"`
	Schedule string       `json:"schedule"`
	Nodes    []*NodeState `json:"nodes"`
	Finished bool         `json:"finished,omitempty"`
	// Complete is set once the run holds the turn's final plan; a run
	// created from a streamed, partial plan is incomplete until then, and
	// a turn finishes only when its run is complete and every node terminal.
	Complete bool `json:"complete,omitempty"`
	// Runner names the work item that runs the turn: the stream sequence of
	// the plan.N.dag.E message whose handler created the run (or took it
	// over). That handler keeps the message in progress until the turn is
	// over; if its replica stops, the message goes to another replica,
	// which finds its sequence here and goes on with the turn.
	Runner uint64 `json:"runner,omitempty"`
	// Abandoned is set on a run that no final plan completed once the
	// turn's final planner output turned out not a plan (an answer, a
	// parse error), or once its episode ends with the run unfinished:
	// from then on nothing is merged into it or released
	// from it, and the acts it released run to their end, until
	// Abandoned.UntilMs at the latest. The episode's end waits for their
	// outcomes (see Abandonment).
	Abandoned *Abandonment `json:"abandoned,omitempty"`
}

// Abandonment records when and why a turn's run was abandoned, and until
// when the acts it released may still run: the episode's end waits for
// their outcomes until then (the watchdog, which does not wait, tries
// again at its next sweep), and records the outcome of an act that
// has none by then as failed (timeout), so that the episode's end lists
// every act released, with its sample when its generation ran.
type Abandonment struct {
	AtMs    int64  `json:"at_ms"`
	UntilMs int64  `json:"until_ms"`
	Why     string `json:"why"`
}

// Clone returns a copy of r that shares nothing it can change.
func (r *Run) Clone() Run {
	c := *r
	if r.Abandoned != nil {
		a := *r.Abandoned
		c.Abandoned = &a
	}
	c.Nodes = make([]*NodeState, len(r.Nodes))
	for i, n := range r.Nodes {
		cp := *n
		c.Nodes[i] = &cp
	}
	return c
}

// RunKey is the KV key of a run.
func RunKey(n int64, e, turn int) string { return fmt.Sprintf("%d.%d.%d", n, e, turn) }

// SessionKey is the KV key of a session.
func SessionKey(n int64) string { return fmt.Sprintf("%d", n) }

// TasksKey is the KV key of a rollout's tasks.
func TasksKey(n int64) string { return fmt.Sprintf("%d.tasks", n) }

// Claim is the KV value (bucket runs, key "<N>.<E>.<turn>.planner") that
// records which planner-gateway instance generates a planner turn. It is
// written before the turn's first engine request: a plan request delivered
// again while the turn runs (a redelivery, a watchdog's) finds the holder
// alive and waits for the turn's output instead of calling the engine a
// second time. Only when the holder is gone (its process dead or stopped,
// or it gave the turn up) does another instance take the turn over, and
// the retry is recorded here: who, from whom, and why; a holder that
// answers that it sent none of the turn's generations is taken over
// without a retry. The holder reads its claim again before the turn's
// first generation and before it fails the turn: taken over meanwhile, it
// does neither, and leaves the turn to the new holder. Removed with the
// rollout's run state.
type Claim struct {
	Rollout int64 `json:"rollout"`
	Episode int   `json:"episode"`
	Turn    int   `json:"turn"`
	// Holder is the instance that generates the turn (its NATS service id,
	// as `nats micro ls planner-gateway` lists it); Replica names it for
	// people.
	Holder  string `json:"holder"`
	Replica string `json:"replica,omitempty"`
	SinceMs int64  `json:"since_ms"`
	// Retries are the engine calls of the turn beyond the first, oldest
	// first: a holder that took over from one that had sent a generation,
	// or a holder's own attempt after an engine failure or a pause's
	// abort.
	Retries []Retry `json:"retries,omitempty"`
}

// Retry records a generation sent to an engine again: by whom, after whom
// (the instance that had it before; the same one for an attempt after a
// failure), and why.
type Retry struct {
	By   string `json:"by"`
	From string `json:"from,omitempty"`
	Why  string `json:"why"`
	AtMs int64  `json:"at_ms"`
}

// ClaimKey is the KV key of a planner turn's claim.
func ClaimKey(n int64, e, turn int) string { return RunKey(n, e, turn) + ".planner" }

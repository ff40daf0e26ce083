// Package mode is the seam between what planact guarantees and how two
// policies work together. A Mode says, for one episode: which role is asked
// first, what the planner is asked (its prompt) and how its output becomes
// work for the actor (a DAG of acts), an answer or an error; what the actor
// is asked for one act; what the planner is shown of a finished turn; and
// how the episode's samples are rewarded.
//
// Everything else stays below the seam and is shared by every mode: the
// barrier, durable time-outs, recorded run state and the watchdog, retries
// and failure policies, pause/resume and weight versions, token-exact
// trajectories, groups and over-sampling, results, the web view and traces.
// A mode never talks to the bus: the services call it and publish what it
// returns on the subjects they always use.
//
// plan_act (planact.go) is the first mode; peer_review (peerreview.go) is
// the smallest one to read when writing a new one (docs/modes.md).
package mode

import (
	"context"
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/schema"
)

// Mode is one way the planner and the actor work together in an episode.
// Implementations are stateless: every service asks the rollout's mode
// (For) and gets the same answers for the same inputs, whatever replica or
// restart asks.
type Mode interface {
	// Name is the mode's name in a rollout's config (schema.Modes).
	Name() string

	// Open is episode e's first message: a plan request for turn 1 (the
	// planner goes first), or a plan of turn 1 the act-dispatcher runs at
	// once (the actor goes first). The session-store publishes it when the
	// rollout starts; the watchdog publishes it again when it was lost.
	Open(n int64, e int, task schema.Task, cfg schema.Config, plannerVersion string) schema.Message
	// FirstPlannerTurn is the turn of the planner's first request: its
	// prompt is rendered then (followed by the request's observation, if
	// any); later turns append observations to its trajectory.
	FirstPlannerTurn() int
	// PlannerPrompt is the planner's first prompt for a task.
	PlannerPrompt(task schema.Task, cfg schema.Config) string

	// ParseNeedsObservation says whether Parse reads the observation the
	// planner answered (decoding a turn's whole trajectory costs: modes
	// that do not need it say false).
	ParseNeedsObservation(cfg schema.Config) bool
	// Parse turns one planner output into what the rest of planact acts
	// on: a *schema.PlanDAG (work for the actor), a *schema.PlanAnswer (the
	// episode's end) or a *schema.PlanError. observation is the text the
	// planner answered (Observed: the last observation segment of its
	// trajectory that the mode reads), "" when ParseNeedsObservation is
	// false or there is none. An error is only ctx's: the output is parsed
	// again when redelivered.
	Parse(ctx context.Context, out *schema.PlanOutput, observation string, cfg schema.Config) (schema.Message, error)

	// Tool resolves a node's tool: the rollout's tools, and any the mode
	// adds for its own acts.
	Tool(cfg schema.Config, name string) (schema.Tool, bool)
	// ActorPrompt is what the actor model is asked for one act of an
	// episode of task: the node (its arguments) and its input with
	// placeholders filled.
	ActorPrompt(task schema.Task, tool schema.Tool, node Node, input string) string
	// RunLocal runs an act of a tool of kind KindLocal (one the mode adds,
	// such as ensemble's vote) without an engine; node's arguments have
	// their placeholders filled.
	RunLocal(tool schema.Tool, node Node) (string, error)
	// Observation is what the planner is shown of a turn whose acts all
	// finished (the next turn's observation).
	Observation(r *schema.Run, cfg schema.Config) string

	// Rewards sets the rewards of an ended episode's samples (and may add
	// to their metadata). The samples arrive rewarded with ep.Score.
	Rewards(ep *Episode)
}

// Node is an act's node as the mode sees it: its id, tool and arguments.
type Node struct {
	ID   string
	Tool string
	Args map[string]any
}

// Episode is what an ended episode's rewards are assembled from.
type Episode struct {
	Task   schema.Task
	Config schema.Config
	End    *schema.EpisodeEnd
	// Last is the planner's last output (its text is the last turn's); nil
	// when the planner never answered.
	Last *schema.PlanOutput
	// Score is the reward function's score of the final answer (0 when the
	// episode did not complete); Correct, whether it matches the label
	// exactly.
	Score   float64
	Correct bool
	// Planner is the planner's sample (nil: none); Actor, one sample per
	// executed act, in turn and key order; Acts, the outcomes they come
	// from, in the same order.
	Planner *schema.Sample
	Actor   []schema.Sample
	Acts    []*schema.ActDone
	// Outcomes are every act outcome of the episode (those without a
	// sample too: failed, cached, HTTP tools, local acts).
	Outcomes []*schema.ActDone
}

// modes are the modes by name.
var modes = map[string]Mode{
	schema.ModePlanAct:    PlanAct{},
	schema.ModePeerReview: PeerReview{},
	schema.ModeEnsemble:   Ensemble{},
}

// For returns the mode a rollout's config names ("" is plan_act). A name
// planact does not know is an error naming the known ones; the
// session-store refuses such a config at arrival (schema.Config.Validate),
// so services see only known names.
func For(cfg schema.Config) (Mode, error) {
	name := cfg.Mode
	if name == "" {
		name = schema.ModePlanAct
	}
	m, ok := modes[name]
	if !ok {
		return nil, fmt.Errorf("mode %q: want one of %s", cfg.Mode, strings.Join(schema.Modes, ", "))
	}
	return m, nil
}

// Observed is the observation a planner output answered, as m's Parse
// reads it, from the output's trajectory segs: the last observation
// segment, or, for a mode that looks past some (peer_review reviews the
// last attempt shown, not the parse error that followed it), the last one
// it reads. "" if there is none.
func Observed(m Mode, segs []schema.Segment) string {
	reads := func(string) bool { return true }
	if o, ok := m.(observer); ok {
		reads = o.reads
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Kind == schema.SegObservation && reads(segs[i].Text) {
			return segs[i].Text
		}
	}
	return ""
}

// observer is a mode whose Parse reads only some observations (Observed).
type observer interface {
	reads(observation string) bool
}

// errNoLocal is RunLocal's answer in a mode that adds no local tool.
func errNoLocal(m Mode, tool string) error {
	return fmt.Errorf("mode %s runs no tool %q itself", m.Name(), tool)
}

// oneLine keeps an observation on one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", " ")
	return strings.ReplaceAll(s, "\n", " ")
}

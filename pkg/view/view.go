// Package view is a read model of planact's rollouts, built only from what
// JetStream holds (the ROLLOUT, PLAN and ACT streams, the runs bucket and
// the tasks object store): a list of rollouts, one rollout's episodes, and
// one episode's turns, plans and act timeline. It follows the streams live,
// from the start of their history, so rollouts that finished before it
// started are there too. The web view and `planact inspect` are built on it.
package view

import (
	"strings"
	"time"
)

// Rollout statuses besides the result statuses of schema (ok, partial,
// aborted, timeout, failed, invalid), which a finished rollout takes from
// its planner's result (each role's is in RolloutSummary.Results).
const (
	StatusWaiting = "waiting" // one trainer has arrived
	StatusRunning = "running" // the barrier released it; no result yet
	// StatusRejected: an arrival was refused (the reason says why) and
	// no corrected one came since.
	StatusRejected = "rejected"
)

// Episode and act statuses besides those of schema.
const (
	EpisodeRunning = "running" // not ended yet
	// EpisodeUnfinished: the rollout ended (timed out, cancelled) before
	// the episode did; it never will.
	EpisodeUnfinished = "unfinished"
	ActRunning        = "running" // released (by the runs bucket) without an outcome yet
	ActPending        = "pending" // in a plan, waiting for its dependencies
)

// ActCounts counts acts by status.
type ActCounts struct {
	Running int `json:"running"`
	Done    int `json:"done"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
	Cached  int `json:"cached"`
}

// RolloutSummary is one line of the list of rollouts.
type RolloutSummary struct {
	Rollout int64 `json:"rollout"`
	// Status and Reason are the rollout's: a finished one's are its
	// planner's result's (else its actor's); Ending says how each role's
	// result ended.
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Results are the roles' results that came, in role order (planner,
	// actor): each has its own status (the actor's can be failed where the
	// planner's is ok).
	Results  []RoleResult `json:"results,omitempty"`
	Ended    int          `json:"ended"`    // episodes ended
	Episodes int          `json:"episodes"` // episodes of the rollout (0 until it starts)
	// Quarantined counts the episodes that ended quarantined: an engine's
	// input drifted from their trajectory (token_drift), and no role trains
	// on them.
	Quarantined int       `json:"quarantined,omitempty"`
	Acts        ActCounts `json:"acts"`
	// Accuracy and MeanReward are over the episodes ended so far (the
	// result's figures once there is one); nil when they cannot be known
	// here (a reward server scores the rollout, or no episode ended).
	Accuracy   *float64 `json:"accuracy"`
	MeanReward *float64 `json:"mean_reward"`
	// WeightVersions by role: those the trainers arrived with and those
	// the engines reported generating with.
	WeightVersions map[string][]string `json:"weight_versions"`
	ArrivedAt      time.Time           `json:"arrived_at"`
	StartedAt      time.Time           `json:"started_at,omitzero"`
	FinishedAt     time.Time           `json:"finished_at,omitzero"`
	// WallMs is from the start to the end, or to now while it runs.
	WallMs int64 `json:"wall_ms"`
}

// RoleResult is how one role's result ended.
type RoleResult struct {
	Role   string `json:"role"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Ending says how the rollout ended, as `planact watch` says it: its status
// and reason once when every role's result says the same ("ok"), else role
// by role ("planner ok, actor failed", with "actor: why"). Before a result
// comes it is the rollout's status and reason.
func (s RolloutSummary) Ending() (status, reason string) {
	if len(s.Results) == 0 {
		return s.Status, s.Reason
	}
	first, same := s.Results[0], true
	for _, rr := range s.Results[1:] {
		same = same && rr.Status == first.Status && rr.Reason == first.Reason
	}
	if same {
		return first.Status, first.Reason
	}
	var st, why []string
	for _, rr := range s.Results {
		st = append(st, rr.Role+" "+rr.Status)
		if rr.Reason != "" {
			why = append(why, rr.Role+": "+rr.Reason)
		}
	}
	return strings.Join(st, ", "), strings.Join(why, "; ")
}

// Rollout is one rollout with its episodes (those that pass the filter).
type Rollout struct {
	RolloutSummary
	PlanFormat  string           `json:"plan_format,omitempty"`
	MaxTurns    int              `json:"max_turns,omitempty"`
	Reward      string           `json:"reward,omitempty"` // f1, em or the reward server's URL
	Filter      Filter           `json:"filter"`
	EpisodeList []EpisodeSummary `json:"episode_list"`
}

// EpisodeSummary is one episode of a rollout.
type EpisodeSummary struct {
	Rollout int64  `json:"rollout"`
	Episode int    `json:"episode"`
	Status  string `json:"status"` // running, unfinished, completed, truncated, failed, aborted, quarantined
	// Reason says why it ended so; a quarantined episode's says where the
	// engine's input drifted (token_drift: turn 2: … at token 137 of 412).
	Reason  string   `json:"reason,omitempty"`
	Answers []string `json:"answers,omitempty"`
	// Reward of an ended episode as the rollout's reward function gives it;
	// nil while it runs or when a reward server scores it.
	Reward   *float64  `json:"reward"`
	Correct  bool      `json:"correct"` // the answer matches the label exactly
	Turns    int       `json:"turns"`
	Acts     ActCounts `json:"acts"`
	Question string    `json:"question,omitempty"`
	Label    string    `json:"label,omitempty"`
	WallMs   int64     `json:"wall_ms"`
}

// Episode is one episode in full: the planner's turns with their plans and
// the timeline of its acts.
type Episode struct {
	EpisodeSummary
	TurnList []Turn `json:"turn_list"`
	Timeline []Act  `json:"timeline"`
	// CriticalPath lists the keys of the acts on the episode's critical
	// path: in each turn, the dependency chain that took longest.
	CriticalPath []string `json:"critical_path"`
	// StartMs is when the episode's first turn was asked for (unix ms),
	// the origin of the timeline.
	StartMs int64 `json:"start_ms"`
}

// Turn is one turn of the planner.
type Turn struct {
	Turn int `json:"turn"`
	// Prompt is the rendered prompt (turn 1) or the observation appended
	// before this turn (later turns).
	Prompt        string `json:"prompt"`
	Output        string `json:"output"`
	FinishReason  string `json:"finish_reason,omitempty"`
	WeightVersion string `json:"weight_version,omitempty"`
	LatencyMs     int64  `json:"latency_ms"`
	// Outcome is plan, answer, error, or "" while the planner writes.
	Outcome string   `json:"outcome"`
	Answers []string `json:"answers,omitempty"`
	Error   string   `json:"error,omitempty"`
	// Observation is what the planner was shown after this turn's acts.
	Observation string `json:"observation,omitempty"`
	Graph       Graph  `json:"graph"`
}

// Turn outcomes.
const (
	OutcomePlan   = "plan"
	OutcomeAnswer = "answer"
	OutcomeError  = "error"
)

// Graph is a turn's plan: its nodes and the edges from each dependency to
// its dependent.
type Graph struct {
	Nodes []Node `json:"nodes"`
	Edges []Edge `json:"edges"`
}

// Node is one node of a plan with its status.
type Node struct {
	ID       string   `json:"id"`
	Key      string   `json:"key"` // episode-unique: t<turn>-<id>
	Tool     string   `json:"tool"`
	Input    string   `json:"input"` // as executed when known, else the arguments
	Deps     []string `json:"deps,omitempty"`
	Status   string   `json:"status"` // pending, running, done, failed, skipped, cached
	Output   string   `json:"output,omitempty"`
	Error    string   `json:"error,omitempty"`
	Critical bool     `json:"critical"`
}

// Edge runs from a dependency to the node that needs it.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Act is one act on the episode's timeline. Times are unix ms; 0 when not
// (yet) known.
type Act struct {
	Key        string `json:"key"`
	Turn       int    `json:"turn"`
	Node       string `json:"node"`
	Tool       string `json:"tool"`
	Status     string `json:"status"`
	ReleasedMs int64  `json:"released_ms"`
	StartedMs  int64  `json:"started_ms"`
	EndedMs    int64  `json:"ended_ms"`
	Attempts   int    `json:"attempts"`
	Retries    int    `json:"retries"`
	Replica    string `json:"replica,omitempty"`
	ErrorKind  string `json:"error_kind,omitempty"`
	Critical   bool   `json:"critical"`
}

package view

import (
	"time"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// The read model's state: what the messages of each rollout said, kept
// small (no token trajectories, no samples). It is only touched with the
// Reader's lock held.

type rolloutState struct {
	n         int64
	arrivedAt time.Time
	arrivals  map[string]*schema.Arrive // by role, without their tasks
	tasks     []schema.Task
	config    *schema.Config // as arrived (the planner's wins)
	start     *schema.Start
	startedAt time.Time
	result    *schema.Result // the planner's (else the actor's), without samples
	resultAt  time.Time
	episodes  map[int]*episodeState
	versions  map[string]map[string]bool // role -> weight versions seen
	// rejected holds, by role, why its last arrival was refused.
	rejected map[string]string
	// rejectedAt and arrivalAt say when, by role, the last refusal and the
	// last arrival were stored: they are read from different streams, in
	// no set order, and a refusal stands only if no arrival came after it.
	rejectedAt, arrivalAt map[string]time.Time
	// compacted: the texts of its turns and acts were dropped from memory
	// (see compact.go); its episodes are read again when asked for.
	compacted bool
}

type episodeState struct {
	e       int
	turns   map[int]*turnState
	acts    map[string]*schema.ActDone // by node key, without generations
	end     *schema.EpisodeEnd
	endedAt time.Time
}

type turnState struct {
	turn          int
	askedAt       time.Time
	observation   string // sent with the request for this turn
	prompt        string // rendered, turn 1
	output        string
	finish        string
	weightVersion string
	latencyMs     int64
	written       bool
	plan          *plan.Plan
	partial       bool // plan is a partial plan (the final one has not come)
	answers       []string
	answered      bool
	errorMsg      string
	failed        bool
	run           *schema.Run // from the runs bucket while the turn's state is kept
}

// planOut is the part of a plan.out body the view needs: not its token
// trajectory, which is most of it.
type planOut struct {
	schema.Envelope
	Rollout       int64  `json:"rollout"`
	Episode       int    `json:"episode"`
	Turn          int    `json:"turn"`
	Text          string `json:"text"`
	Prompt        string `json:"prompt,omitempty"`
	FinishReason  string `json:"finish_reason"`
	WeightVersion string `json:"weight_version,omitempty"`
	LatencyMs     int64  `json:"latency_ms"`
}

func (s *state) rollout(n int64, at time.Time) *rolloutState {
	r := s.rollouts[n]
	if r == nil {
		r = &rolloutState{n: n, arrivedAt: at, arrivals: map[string]*schema.Arrive{}, episodes: map[int]*episodeState{}, versions: map[string]map[string]bool{}}
		s.rollouts[n] = r
	}
	return r
}

func (r *rolloutState) episode(e int) *episodeState {
	ep := r.episodes[e]
	if ep == nil {
		ep = &episodeState{e: e, turns: map[int]*turnState{}, acts: map[string]*schema.ActDone{}}
		r.episodes[e] = ep
	}
	return ep
}

func (ep *episodeState) turn(t int) *turnState {
	ts := ep.turns[t]
	if ts == nil {
		ts = &turnState{turn: t}
		ep.turns[t] = ts
	}
	return ts
}

func (r *rolloutState) version(role, v string) {
	if v == "" {
		return
	}
	if r.versions[role] == nil {
		r.versions[role] = map[string]bool{}
	}
	r.versions[role][v] = true
}

// state is everything the Reader has read.
type state struct {
	rollouts map[int64]*rolloutState
	// loadTasks fetches the task list an arrival names in its object
	// store; nil in tests that need none.
	loadTasks func(a *schema.Arrive) []schema.Task
	// keepFull is how many finished rollouts keep their texts (0: all).
	keepFull int
}

// apply folds one stream message into the state and reports the rollout
// it changed (ok false when the message is not one the view reads, or
// cannot be decoded: a reader must not stop on one bad message).
func (s *state) apply(subj string, data []byte, at time.Time) (int64, bool) {
	p, err := subject.Parse(subj)
	if err != nil {
		return 0, false
	}
	switch p.Domain + "." + p.Verb {
	case "rollout.arrive":
		var m schema.Arrive
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r.tasks == nil {
			switch {
			case len(m.Tasks) > 0:
				r.tasks = m.Tasks
			case m.TasksObject != "" && s.loadTasks != nil:
				r.tasks = s.loadTasks(&m)
			}
		}
		if m.Config != nil && (r.config == nil || m.Role == schema.RolePlanner) {
			r.config = m.Config
		}
		m.Tasks = nil
		if len(r.arrivals) == 0 || at.Before(r.arrivedAt) {
			// The rollout may have been seen first in another stream,
			// read at the same time: it arrived with its first arrival.
			r.arrivedAt = at
		}
		r.version(m.Role, m.WeightVersion)
		if at.Before(r.arrivalAt[m.Role]) {
			return m.Rollout, true // a later arrival of the role was read first
		}
		r.arrivals[m.Role] = &m
		if r.arrivalAt == nil {
			r.arrivalAt = map[string]time.Time{}
		}
		r.arrivalAt[m.Role] = at
		if at.After(r.rejectedAt[m.Role]) {
			delete(r.rejected, m.Role) // an arrival after a refusal: waiting again
		}
	case "rollout.start":
		var m schema.Start
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		r.start, r.startedAt = &m, at
	case "rollout.end":
		var m schema.EpisodeEnd
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		ep := s.rollout(m.Rollout, at).episode(m.Episode)
		ep.end, ep.endedAt = &m, at
	case "rollout.result":
		var m schema.Result
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if m.Rejected {
			// An arrival refused; its trainer may send a corrected one.
			if at.Before(r.arrivalAt[m.Role]) {
				return m.Rollout, true // the role arrived again after it
			}
			if r.rejected == nil {
				r.rejected, r.rejectedAt = map[string]string{}, map[string]time.Time{}
			}
			r.rejected[m.Role], r.rejectedAt[m.Role] = m.Reason, at
			return m.Rollout, true
		}
		if r.result != nil && m.Role != schema.RolePlanner {
			return 0, false
		}
		m.Samples = nil
		r.result, r.resultAt = &m, at
		if s.keepFull > 0 {
			s.compact(s.keepFull)
		}
	case "plan.req":
		var m schema.PlanRequest
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		ts := s.rollout(m.Rollout, at).episode(m.Episode).turn(m.Turn)
		ts.askedAt, ts.observation = at, m.Observation
	case "plan.out":
		var m planOut
		if schema.UnmarshalPart(data, &schema.PlanOutput{}, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		ts := r.episode(m.Episode).turn(m.Turn)
		ts.output, ts.finish, ts.weightVersion, ts.latencyMs, ts.written = m.Text, m.FinishReason, m.WeightVersion, m.LatencyMs, true
		if m.Prompt != "" {
			ts.prompt = m.Prompt
		}
		r.version(schema.RolePlanner, m.WeightVersion)
	case "plan.dag":
		var m schema.PlanDAG
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		ts := s.rollout(m.Rollout, at).episode(m.Episode).turn(m.Turn)
		if m.Partial && ts.plan != nil && !ts.partial {
			return 0, false // a late partial never hides the final plan
		}
		ts.plan, ts.partial = &m.Plan, m.Partial
	case "plan.answer":
		var m schema.PlanAnswer
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		ts := s.rollout(m.Rollout, at).episode(m.Episode).turn(m.Turn)
		ts.answers, ts.answered = m.Answers, true
	case "plan.error":
		var m schema.PlanError
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		ts := s.rollout(m.Rollout, at).episode(m.Episode).turn(m.Turn)
		ts.errorMsg, ts.failed = m.ErrorKind+": "+m.Message, true
	case "act.done":
		var m schema.ActDone
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if m.Generation != nil {
			r.version(schema.RoleActor, m.Generation.WeightVersion)
			m.Generation = nil
		}
		r.episode(m.Episode).acts[m.Key] = &m
	default:
		return 0, false
	}
	return p.Rollout, true
}

// applyRun folds a value of the runs bucket (nil when the key was deleted
// or purged: the turn's state is gone, its acts' outcomes stay in ACT).
func (s *state) applyRun(n int64, e, turn int, run *schema.Run, at time.Time) {
	r := s.rollouts[n]
	if r == nil {
		if run == nil {
			return
		}
		r = s.rollout(n, at)
	}
	r.episode(e).turn(turn).run = run
}

package view

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/bus"
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
	// lastAt is when the last message of the rollout the view read was
	// stored: once it is older than the history the streams keep, the
	// streams hold nothing of the rollout any more, and the view lets it go.
	lastAt   time.Time
	arrivals map[string]*schema.Arrive // by role, without their tasks
	// brought are the arrivals that brought a task list or a config, in
	// the order read; tasks and config are taken from those not refused
	// (see pick), as the session-store takes them.
	brought []*arrival
	// refusedIDs are the arrivals refused (Result.ArrivalID of a
	// rejection, with its role), read before or after the arrival itself.
	// An id is its trainer's to choose (its Nats-Msg-Id): one role's
	// refusal never names the other's arrival.
	refusedIDs map[refusedID]bool
	// arrivedWith is the weight version each arrival (by role and id)
	// came with: a refused one's is not the rollout's (see summary).
	arrivedWith map[refusedID]string
	tasks       []schema.Task
	tasksFrom   *arrival       // the arrival the tasks came with
	config      *schema.Config // from the arrivals not refused (the planner's wins)
	start       *schema.Start
	startedAt   time.Time
	result      *schema.Result // the planner's (else the actor's), without samples
	resultAt    time.Time
	// results are each role's result, without samples: each has its own
	// status (the actor's can be failed where the planner's is ok).
	results  map[string]*schema.Result
	episodes map[int]*episodeState
	versions map[string]map[string]bool // role -> weight versions seen
	// rejected holds, by role, why its last arrival was refused.
	rejected map[string]string
	// rejectedAt and arrivalAt say when, by role, the last refusal and the
	// last arrival were stored: they are read from different streams, in
	// no set order, and a refusal stands only if no arrival came after it.
	rejectedAt, arrivalAt map[string]time.Time
	// compacted: its episodes and tasks were dropped from memory (see
	// compact.go), counts holds what its line in the list needs, and its
	// episodes and tasks are read again when asked for.
	compacted bool
	counts    rolloutCounts
	// rev counts the changes to a compacted rollout (messages read late):
	// what was read again of it before is stale.
	rev int
	// dropped: let go of (see state.prune); a pointer still held changes
	// nothing the view shows.
	dropped bool
}

// refusedID names a refused arrival: its role and its id.
type refusedID struct{ role, id string }

// arrival is what the view keeps of an arrival that brought tasks or a
// config: enough to take them, and to read its task list again from the
// stream once its rollout is compacted.
type arrival struct {
	id     string // Nats-Msg-Id, or seq:<sequence>: what a refusal names
	role   string // the role whose stream holds it (TRAINER_<role>)
	seq    uint64 // its sequence there
	at     time.Time
	list   bool          // it brought a task list
	tasks  []schema.Task // the list: inline, or read from the object store (nil once compacted)
	object string        // the list's object in tasks_<role>
	sha    string        // its SHA-256
	loaded bool          // the object was read (tasks holds it, or nil if gone)
	// fetching: the object is being read (see state.fetches).
	fetching bool
	config   *schema.Config
}

// hasTasks says whether the arrival brought a task list.
func (a *arrival) hasTasks() bool { return a.list }

// rolloutCounts are the figures of a rollout's line that come from its
// episodes.
type rolloutCounts struct {
	acts        ActCounts
	ended       int
	quarantined int
	rewards     float64 // summed over the ended episodes, when scored
	correct     float64
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

// rollout returns rollout n's state, made on its first message, or nil:
// when the view let it go (see prune), or when the message is older than
// the history the streams keep (the streams are dropping it now, and with
// it what the view would show of the rollout).
func (s *state) rollout(n int64, at time.Time) *rolloutState {
	r := s.rollouts[n]
	if r == nil {
		if _, gone := s.gone[n]; gone {
			return nil
		}
		if s.maxAge > 0 && at.Before(s.clock().Add(-s.maxAge)) {
			return nil
		}
		r = &rolloutState{n: n, arrivedAt: at, arrivals: map[string]*schema.Arrive{}, episodes: map[int]*episodeState{}, versions: map[string]map[string]bool{}}
		s.rollouts[n] = r
	}
	if at.After(r.lastAt) {
		r.lastAt = at
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

// pick takes the rollout's task list and config from the arrivals not
// refused, as the session-store does (a task list in the object store is
// read later, see takeFetches): the first task list stored is the
// rollout's (an arrival that brings another is refused), and the config is
// the planner's, else the actor's, each from the role's first arrival. An
// arrival read before its refusal counts until the refusal is read.
func (s *state) pick(r *rolloutState) {
	var tasks, planner, actor *arrival
	for _, a := range r.brought {
		if r.refusedIDs[refusedID{a.role, a.id}] {
			a.tasks = nil // never the rollout's
			continue
		}
		if a.hasTasks() && (tasks == nil || a.at.Before(tasks.at)) {
			tasks = a
		}
		if a.config == nil {
			continue
		}
		switch {
		case a.role == schema.RolePlanner && (planner == nil || a.at.Before(planner.at)):
			planner = a
		case a.role != schema.RolePlanner && (actor == nil || a.at.Before(actor.at)):
			actor = a
		}
	}
	switch {
	case planner != nil:
		r.config = planner.config
	case actor != nil:
		r.config = actor.config
	default:
		r.config = nil
	}
	r.tasksFrom, r.tasks = tasks, nil
	if tasks == nil || r.compacted {
		return // a compacted rollout's tasks are read again when asked for
	}
	if tasks.object != "" && !tasks.loaded && !tasks.fetching && s.loadTasks != nil {
		// Read by whoever folded this, without the Reader's lock (see
		// fetches): until then the rollout shows no tasks.
		tasks.fetching = true
		s.fetches = append(s.fetches, fetch{r, tasks})
	}
	r.tasks = tasks.tasks
}

// fetch is a task list to read from the object store: arrival a's, of
// rollout r.
type fetch struct {
	r *rolloutState
	a *arrival
}

// takeFetches returns the task lists pick asked for since the last call.
// The caller reads them without the Reader's lock (an object store can be
// slow, or cut off, for seconds) and hands each to fetched under it.
func (s *state) takeFetches() []fetch {
	fs := s.fetches
	s.fetches = nil
	return fs
}

// fetched takes the task list read for f (nil: gone, or not the one its
// arrival named), and the rollout's tasks again: what was read meanwhile
// (a refusal of the arrival, a compaction) decides whether they show.
func (s *state) fetched(f fetch, tasks []schema.Task) {
	a, r := f.a, f.r
	a.fetching, a.loaded = false, true
	if r.dropped || r.compacted || r.refusedIDs[refusedID{a.role, a.id}] {
		return
	}
	a.tasks = tasks
	s.pick(r)
}

// state is everything the Reader has read.
type state struct {
	rollouts map[int64]*rolloutState
	// loadTasks fetches the task list an arrival of role names in its
	// object store; nil in tests that need none.
	loadTasks func(ctx context.Context, role, object, sha string) []schema.Task
	// fetches are the task lists pick asked for, not read yet (see
	// takeFetches).
	fetches []fetch
	// keepFull is how many finished rollouts keep their episodes (0: all).
	keepFull int
	// finished are the finished rollouts not compacted yet, in the order
	// their results were read.
	finished []*rolloutState
	// marks say, by stream, up to when the view has read it (see readTo).
	marks map[string]time.Time
	// maxAge is how long the streams keep a message (0: for ever);
	// maxRollouts how many rollouts the view keeps (0: all).
	maxAge      time.Duration
	maxRollouts int
	// gone are the rollouts let go of to stay within maxRollouts, with
	// their last message's time: what comes of them later is not read.
	gone     map[int64]time.Time
	now      func() time.Time
	prunedAt time.Time
}

func (s *state) clock() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// arrivalID is how the session-store names an arrival, and with it a
// refusal (Result.ArrivalID): its Nats-Msg-Id, or seq:<sequence> when it
// has none or one too long to take (schema.TrainerMsgID).
func arrivalID(m bus.StoredMsg) string {
	return schema.TrainerMsgID(m.Header.Get(jetstream.MsgIDHeader), m.Seq)
}

// decodeArrival reads an arrival as the session-store does: msgpack, or
// JSON where its Content-Type header says so (a trainer may send either,
// `nats pub` for one), so that a rollout arrived in JSON is shown too.
func decodeArrival(msg bus.StoredMsg, m *schema.Arrive) error {
	if err := schema.Unmarshal(msg.Data, m); err == nil || len(msg.Header) == 0 {
		return err
	}
	*m = schema.Arrive{}
	return schema.UnmarshalTrainer(msg.Data, msg.Header, m)
}

// apply folds one stream message into the state and reports the rollout
// it changed (ok false when the message is not one the view reads, or
// cannot be decoded: a reader must not stop on one bad message).
func (s *state) apply(msg bus.StoredMsg) (int64, bool) {
	n, ok := s.fold(msg)
	s.maintain()
	return n, ok
}

func (s *state) fold(msg bus.StoredMsg) (int64, bool) {
	subj, data, at := msg.Subject, msg.Data, msg.Time
	p, err := subject.Parse(subj)
	if err != nil {
		return 0, false
	}
	switch p.Domain + "." + p.Verb {
	case "rollout.arrive":
		var m schema.Arrive
		if decodeArrival(msg, &m) != nil {
			return 0, false
		}
		if schema.CheckRouting(subj, msg.Header, &m) != nil {
			// Its subject and body disagree (the actor's stream holding a
			// planner's arrival for another rollout, say): the
			// session-store refuses it, on the subject's rollout and role,
			// and it is nothing of the rollout its body names.
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil {
			return 0, false
		}
		if len(m.Tasks) > 0 || m.TasksObject != "" || m.Config != nil {
			role := p.Role
			if role == "" {
				role = m.Role
			}
			a := &arrival{id: arrivalID(msg), role: role, seq: msg.Seq, at: at, list: len(m.Tasks) > 0 || m.TasksObject != "",
				object: m.TasksObject, sha: m.TasksSHA256, config: m.Config}
			if !r.compacted {
				a.tasks = m.Tasks
			}
			r.brought = append(r.brought, a)
			s.pick(r)
		}
		m.Tasks = nil
		if len(r.arrivals) == 0 || at.Before(r.arrivedAt) {
			// The rollout may have been seen first in another stream,
			// read at the same time: it arrived with its first arrival.
			r.arrivedAt = at
		}
		if m.WeightVersion != "" {
			if r.arrivedWith == nil {
				r.arrivedWith = map[refusedID]string{}
			}
			r.arrivedWith[refusedID{m.Role, arrivalID(msg)}] = m.WeightVersion
		}
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
		if r == nil {
			return 0, false
		}
		r.start, r.startedAt = &m, at
	case "rollout.end":
		var m schema.EpisodeEnd
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil {
			return 0, false
		}
		if r.compacted {
			// Stored after the rollout's result: its line counts it.
			r.counts.ended++
			if m.Status == schema.EpisodeQuarantined {
				r.counts.quarantined++
			}
			r.rev++
			break
		}
		ep := r.episode(m.Episode)
		ep.end, ep.endedAt = &m, at
	case "rollout.result":
		var m schema.Result
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil {
			return 0, false
		}
		if m.Rejected {
			// An arrival refused; its trainer may send a corrected one.
			// Whatever it brought is not the rollout's.
			if id := (refusedID{m.Role, m.ArrivalID}); m.ArrivalID != "" && !r.refusedIDs[id] {
				if r.refusedIDs == nil {
					r.refusedIDs = map[refusedID]bool{}
				}
				r.refusedIDs[id] = true
				s.pick(r)
			}
			if at.Before(r.arrivalAt[m.Role]) {
				return m.Rollout, true // the role arrived again after it
			}
			if r.rejected == nil {
				r.rejected, r.rejectedAt = map[string]string{}, map[string]time.Time{}
			}
			r.rejected[m.Role], r.rejectedAt[m.Role] = m.Reason, at
			return m.Rollout, true
		}
		if _, seen := r.results[m.Role]; seen {
			// The role's first result is its result: a later one answers an
			// arrival that came after the rollout ended.
			return 0, false
		}
		// The view shows neither the samples nor every task's outcome.
		m.Samples, m.Tasks, m.Episodes = nil, nil, nil
		known := slices.Contains(bus.Roles, m.Role)
		if known {
			if r.results == nil {
				r.results = map[string]*schema.Result{}
			}
			r.results[m.Role] = &m
		}
		if r.result != nil && m.Role != schema.RolePlanner {
			return m.Rollout, known // the rollout's status stays the planner's
		}
		if r.result == nil && !r.compacted && s.keepFull > 0 {
			s.finished = append(s.finished, r)
		}
		r.result, r.resultAt = &m, at
	case "plan.req":
		var m schema.PlanRequest
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil || r.compacted {
			return 0, false
		}
		ts := r.episode(m.Episode).turn(m.Turn)
		ts.askedAt, ts.observation = at, m.Observation
	case "plan.out":
		var m planOut
		if schema.UnmarshalPart(data, &schema.PlanOutput{}, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil {
			return 0, false
		}
		r.version(schema.RolePlanner, m.WeightVersion)
		if r.compacted {
			break
		}
		ts := r.episode(m.Episode).turn(m.Turn)
		ts.output, ts.finish, ts.weightVersion, ts.latencyMs, ts.written = m.Text, m.FinishReason, m.WeightVersion, m.LatencyMs, true
		if m.Prompt != "" {
			ts.prompt = m.Prompt
		}
	case "plan.dag":
		var m schema.PlanDAG
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil || r.compacted {
			return 0, false
		}
		ts := r.episode(m.Episode).turn(m.Turn)
		if m.Partial && ts.plan != nil && !ts.partial {
			return 0, false // a late partial never hides the final plan
		}
		ts.plan, ts.partial = &m.Plan, m.Partial
	case "plan.answer":
		var m schema.PlanAnswer
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil || r.compacted {
			return 0, false
		}
		ts := r.episode(m.Episode).turn(m.Turn)
		ts.answers, ts.answered = m.Answers, true
	case "plan.error":
		var m schema.PlanError
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil || r.compacted {
			return 0, false
		}
		ts := r.episode(m.Episode).turn(m.Turn)
		ts.errorMsg, ts.failed = m.ErrorKind+": "+m.Message, true
	case "act.done":
		var m schema.ActDone
		if schema.Unmarshal(data, &m) != nil {
			return 0, false
		}
		r := s.rollout(m.Rollout, at)
		if r == nil {
			return 0, false
		}
		if m.Generation != nil {
			r.version(schema.RoleActor, m.Generation.WeightVersion)
			m.Generation = nil
		}
		if r.compacted {
			// Stored after the rollout's result, or read after it was
			// compacted: its line counts it.
			r.counts.acts.add(m.Status)
			r.rev++
			break
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
		if r = s.rollout(n, at); r == nil {
			return
		}
	}
	if r.compacted {
		return // it ended: nothing of it runs
	}
	r.episode(e).turn(turn).run = run
}

package sessionstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// handleArrive records a role's arrival. The compare-and-set write that
// completes the pair is the one that starts the rollout, so racing and
// duplicated arrivals start it exactly once; the start itself is an effect
// recorded in the session with that write and published after it.
func (s *Service) handleArrive(ctx context.Context, m bus.Msg, p subject.Parsed) error {
	id := trainerID(m)
	var a schema.Arrive
	if err := schema.UnmarshalTrainer(m.Data, m.Header, &a); err != nil {
		return s.rejectUndecodable(ctx, m, p, fmt.Errorf("%s: %w", m.Subject, err))
	}
	log := zerolog.Ctx(ctx) // has the rollout and role, from the headers
	if err := schema.CheckRouting(m.Subject, m.Header, &a); err != nil {
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	}
	if err := schema.CheckMsgID(fmt.Sprintf("arrival of %s for rollout %d", a.Role, a.Rollout), m.Header.Get(jetstream.MsgIDHeader)); err != nil {
		// Repeated in the session and every answer to the arrival: it
		// is refused (named seq:<n>), as a pause's is.
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, fail.E(fail.Invalid, err))
	}
	if err := s.validateArrival(&a); err != nil {
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	}
	// An error before the arrival is written leaves nothing for the sweep
	// to finish: given up, the arrival is answered (unrecorded).
	unrecorded := func(err error) error { return s.unrecorded(ctx, m, p, &a, id, err) }
	sum, err := s.sumArrival(ctx, &a)
	if err != nil {
		return unrecorded(rolloutErr(a.Rollout, err))
	}

	// The arrivals of a rollout, when this process has them, take turns
	// writing the session: run together, they race on the session key, and
	// the loser backs off and reads again (the barrier's latency); and a
	// second arrival of a role is compared with the first before its tasks
	// are stored. Across replicas the compare-and-sets still decide. What
	// follows the write (its outbox settled) takes the settle lock instead,
	// so the other role's arrival is written while this one settles.
	unlock, _ := s.arrivals.lock(a.Rollout)
	unlock = sync.OnceFunc(unlock)
	defer unlock()
	if sum.tasks != "" {
		if refused, err := s.storeTasks(ctx, &a, id, sum); err != nil || refused != nil {
			if err != nil {
				return unrecorded(err)
			}
			log.Warn().Err(refused).Msg("arrival rejected")
			return s.reject(ctx, p, &a, id, refused)
		}
	}
	var late bool        // the role arrives at a rollout that ended without it
	var again bool       // another arrival of a role that has arrived
	var redelivered bool // this arrival, written before
	var diffs []string   // what that other arrival asks for that the first did not
	sess, rev, wrote, err := bus.MutateRev(ctx, s.Bus.Sessions, schema.SessionKey(a.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		late, again, redelivered, diffs = false, false, false, nil
		if !exists {
			trace := bus.TraceFrom(ctx)
			if trace == "" {
				trace = bus.NewTraceID()
			}
			*v = schema.Session{Rollout: a.Rollout, State: schema.SessionWaiting, Trace: trace, CreatedMs: s.nowMs(),
				Outbox: []string{schema.EffectBarrier}}
		}
		if r, arrived := v.Roles[a.Role]; arrived {
			again = r.ArrivalID != id // id: this very arrival, delivered again
			redelivered = !again
			if again && r.Digest != "" && r.Digest != sum.digest {
				diffs = differences(v, r, &a, sum)
			}
			return false, nil
		}
		if v.State != schema.SessionWaiting {
			late = true // the rollout started or ended without this role
			return false, nil
		}
		if len(v.Roles) == 0 && a.Config == nil {
			// The first arrival, without a config: the session waits with
			// the default barrier time-out, and must outlive it (an arrival
			// with a config was checked with it: validateArrival). Under a
			// shorter history the wait is cut to half the history, written
			// in the session's config: the config the other role brings
			// replaces it, and a trainer arriving first without one (the
			// actor, as the planner's job brings the config) is answered by
			// the barrier time-out while its session is there.
			if s.outlives(schema.Config{}.WithDefaults(), "first") != nil {
				v.Config.BarrierTimeoutS = max(s.Bus.Provisioning.History.Seconds()/2, schema.MinTimeoutS)
			}
		}
		if v.Roles == nil {
			v.Roles = map[string]schema.RoleInfo{}
		}
		v.Roles[a.Role] = schema.RoleInfo{Engine: a.Engine, WeightVersion: a.WeightVersion, ArrivedMs: s.nowMs(), ArrivalID: id,
			Digest: sum.digest, ConfigDigest: sum.config, Tasks: sum.tasks, Sampling: a.Sampling}
		if a.WeightVersion != "" {
			// The trainer's weights as it arrives become the role's newest
			// version before the rollout starts (the start follows in the
			// outbox): a generation's staleness is counted from them.
			v.Outbox = append(v.Outbox, schema.EffectVersion(a.Role))
		}
		if a.Config != nil && (v.ConfigFrom == "" || a.Role == schema.RolePlanner) {
			v.Config, v.ConfigFrom = *a.Config, a.Role
		}
		if len(v.Roles) < 2 {
			return true, nil
		}
		tl, err := s.tasksOf(ctx, v)
		if err != nil && fail.IsRetryable(err) {
			return false, err
		}
		tasks := tl.Tasks
		// Each role's own sampling, as its arrival asked, before the
		// defaults fill what neither gave.
		var invalid error // the roles' choices together: the rollout cannot run as asked
		took := false
		for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
			if r := v.Roles[role]; r.Sampling != nil && invalid == nil {
				invalid, took = v.Config.TakeSampling(role, *r.Sampling, cmp.Or(v.ConfigFrom, "default")), true
			}
		}
		v.Config = v.Config.WithDefaults()
		if took && invalid == nil {
			invalid = v.Config.Validate() // the planner's max_new_tokens against max_context_tokens
		}
		if invalid == nil {
			invalid = chatPlannerFirst(v)
		}
		if invalid == nil {
			invalid = chatPlannerStops(v)
		}
		// A config an arrival carried was checked with it (validateArrival):
		// this finds the defaults' time-outs, when neither carried one,
		// outlasting the history.
		tooLong := s.outlives(v.Config, v.ConfigFrom)
		switch {
		case err != nil:
			s.end(v, schema.SessionDone, schema.ResultInvalid, "tasks unusable: "+err.Error())
		case refusedList(v, tl):
			s.end(v, schema.SessionDone, schema.ResultInvalid, fmt.Sprintf("tasks unusable: the task list stored for the rollout came with a %s arrival that was refused (it raced with the %s's arrival that counted, which brought %s): use a new rollout id",
				tl.From, tl.From, describeTasks(v.Roles[tl.From].Tasks, -1)))
		case len(tasks) == 0:
			s.end(v, schema.SessionDone, schema.ResultInvalid, "no tasks: neither arrival carried any")
		case groupsOfOneTask(tasks) != nil:
			// A list in the object store, read only now.
			s.end(v, schema.SessionDone, schema.ResultInvalid, "tasks unusable: "+groupsOfOneTask(tasks).Error())
		case invalid != nil:
			s.end(v, schema.SessionDone, schema.ResultInvalid, invalid.Error())
		case tooLong != nil:
			s.end(v, schema.SessionDone, schema.ResultInvalid, tooLong.Error())
		case v.Config.TargetGroups > groupCount(tasks):
			s.end(v, schema.SessionDone, schema.ResultInvalid, fmt.Sprintf("config: target_groups %d: the batch has only %d groups (distinct group_index)",
				v.Config.TargetGroups, groupCount(tasks)))
		default:
			// Started only here: a rollout that ends invalid at the
			// barrier never started, and its results say no start.
			v.State, v.Episodes, v.StartedMs = schema.SessionRunning, len(tasks), s.nowMs()
			v.Settle(schema.EffectBarrier) // no need to schedule it any more
			v.Outbox = append(v.Outbox, schema.EffectStart)
		}
		return true, nil
	})
	unlock()
	if err != nil {
		return unrecorded(rolloutErr(a.Rollout, err))
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	switch {
	case again && sess.Final():
		// A rollout id names one rollout: a trainer that submits a finished
		// one again (a training run restarted from rollout 0, say) is told,
		// not handed the old result as if it were new.
		err := fail.Invalidf("rollout %d already ended (%s): its result stays on %s; a rollout id names one rollout for as long as planact keeps its history (%v)",
			a.Rollout, endedAs(&sess, a.Role), subject.Result(a.Rollout, a.Role), s.Bus.Provisioning.History)
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	case again && len(diffs) > 0:
		err := disagreement(a.Rollout, a.Role, sess.Roles[a.Role], diffs)
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	case again:
		log.Info().Str("state", sess.State).Msg("the role arrived again, asking for the same: the rollout goes on with its first arrival")
	case late && (sess.State == schema.SessionTimeout || sess.State == schema.SessionAborted):
		// It ended waiting for this very role: tell it, instead of leaving
		// its trainer to wait for a result that will never come.
		log.Warn().Str("state", sess.State).Msg("arrival after the rollout ended without this role")
		return s.answerLate(ctx, &a, id, &sess)
	}
	// The arrival's effects (the barrier's time-out, the role's newest
	// version, the start) are done before anyone is told it arrived.
	if err := s.settle(ctx, sess, rev); err != nil {
		return err
	}
	switch {
	case (wrote || redelivered) && sess.State == schema.SessionWaiting:
		log.Info().Bool("redelivered", redelivered).Msg("arrived, waiting for the other role")
		_ = s.status(ctx, a.Rollout, "arrived", -1, a.Role)
	case wrote && sess.State == schema.SessionRunning:
		log.Info().Int("episodes", sess.Episodes).Msg("both roles arrived, rollout starts")
	case !wrote:
		log.Info().Str("state", sess.State).Msg("arrival delivered again")
	}
	return nil
}

// answerLate tells the role of a, which arrived (as id) after its rollout
// ended without it, that the rollout is over, on the role's result
// subject; then it records the arrival in the session. The answer names
// the arrival, so that neither the trainer of a later rollout of the number
// nor the session-store publishing that rollout's result takes it for that
// rollout's. The record follows the answer so that the session, kept for
// the history from its last write, outlives it: while the session is
// there, the number is not used again.
func (s *Service) answerLate(ctx context.Context, a *schema.Arrive, id string, sess *schema.Session) error {
	status := schema.ResultTimeout
	if sess.State == schema.SessionAborted {
		status = schema.ResultAborted
	}
	r := &schema.Result{Rollout: a.Rollout, Role: a.Role, Status: status, Reason: "arrived after the rollout ended: " + sess.Reason,
		ArrivalID: id, Stats: schema.Stats{StartedMs: sess.StartedMs, FinishedMs: sess.FinishedMs}}
	if err := s.publishAnswer(ctx, r, nil); err != nil {
		return rolloutErr(a.Rollout, err)
	}
	at := s.nowMs()
	_, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(a.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		if !exists || !v.Final() {
			return false, nil
		}
		if v.Late == nil {
			v.Late = map[string]schema.LateArrival{}
		}
		v.Late[a.Role] = schema.LateArrival{ArrivalID: id, AtMs: max(at, v.Late[a.Role].AtMs)}
		return true, nil
	})
	if err != nil {
		return rolloutErr(a.Rollout, err)
	}
	return nil
}

// storeTasks stores the arrival's task list as the rollout's, unless a
// list is stored already: the first stored is the rollout's, and an arrival
// that brings another is refused (the error refused says why, naming whose
// list it is). A second arrival of a role that arrived is compared with
// the first (see handleArrive) before anything of it is stored.
func (s *Service) storeTasks(ctx context.Context, a *schema.Arrive, id string, sum arrivalSum) (refused, err error) {
	sess, _, found, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(a.Rollout))
	if err != nil {
		return nil, rolloutErr(a.Rollout, err)
	}
	if found && sess.Final() {
		return nil, nil // nothing to store: the arrival is answered when it reaches the session
	}
	if r, arrived := sess.Roles[a.Role]; found && arrived && r.ArrivalID != id {
		if r.Digest != "" && r.Digest != sum.digest {
			return disagreement(a.Rollout, a.Role, r, differences(&sess, r, a, sum)), nil
		}
		return nil, nil // the same arrival sent again: its tasks are stored, or it had none
	}
	tl := &schema.TaskList{Tasks: a.Tasks, Object: a.TasksObject, From: a.Role, Digest: sum.tasks}
	created, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(a.Rollout), tl)
	if err != nil {
		return nil, rolloutErr(a.Rollout, err)
	}
	if created {
		if len(a.Tasks) > 0 {
			s.keepTasks(a.Rollout, *tl) // the barrier and every episode end need them
		}
		return nil, nil
	}
	stored, _, _, err := bus.GetFresh[schema.TaskList](ctx, s.Bus.Sessions, schema.TasksKey(a.Rollout))
	if err != nil {
		return nil, rolloutErr(a.Rollout, err)
	}
	if stored.Digest == "" || stored.Digest == sum.tasks {
		return nil, nil // the same list (or one stored before lists had digests)
	}
	count := -1
	if stored.Object == "" {
		count = len(stored.Tasks)
	}
	return fail.Invalidf("rollout %d: its task list came with the %s's arrival (%s); this %s arrival brings another (%s). Arrive without tasks, or with the same list",
		a.Rollout, stored.From, describeTasks(stored.Digest, count), a.Role, describeTasks(sum.tasks, sum.count)), nil
}

// refusedList reports whether the task list tl (as stored) came with an
// arrival that was refused: one of a role whose arrival that counted
// brought another list, or none. It can only happen when two arrivals of
// one role raced on different session-store replicas.
func refusedList(v *schema.Session, tl schema.TaskList) bool {
	r, ok := v.Roles[tl.From]
	if tl.Digest == "" || !ok || r.Digest == "" {
		return false // recorded before lists had digests: nothing to compare
	}
	return r.Tasks != tl.Digest
}

// validateArrival checks what a trainer sent before anything is stored
// (its subject and headers were checked against it: schema.CheckRouting).
func (s *Service) validateArrival(a *schema.Arrive) error {
	if a.Rollout < 0 {
		return fail.Invalidf("rollout %d: must not be negative", a.Rollout)
	}
	if a.Engine.URL == "" {
		return fail.Invalidf("%s arrived without an engine url", a.Role)
	}
	if err := checkEngineURL(a.Engine.URL); err != nil {
		// Taken, it failed every generation of the rollout (the engine
		// "down"), minutes later and far from the field at fault.
		return fail.Invalidf("engine.url %.200q: %v", a.Engine.URL, err)
	}
	if a.Engine.Protocol != "" && !slices.Contains(engine.Protocols, a.Engine.Protocol) {
		return fail.Invalidf("engine protocol %q: want one of %s", a.Engine.Protocol, strings.Join(engine.Protocols, ", "))
	}
	if err := a.Engine.Check("engine"); err != nil {
		return fail.E(fail.Invalid, err)
	}
	if a.Config != nil && len(a.Tasks) > 0 && a.Config.TargetGroups > groupCount(a.Tasks) {
		return fail.Invalidf("config: target_groups %d: the batch has only %d groups (distinct group_index)", a.Config.TargetGroups, groupCount(a.Tasks))
	}
	if len(a.Tasks) > 0 && a.TasksObject != "" {
		return fail.Invalidf("arrival carries both tasks and tasks_object")
	}
	switch {
	case a.TasksObject != "" && !isSHA256(a.TasksSHA256):
		return fail.Invalidf("tasks_sha256 %q: an arrival with tasks_object %q names the SHA-256 of the object's bytes (64 lower-case hex digits); planact runs the rollout on that list only", a.TasksSHA256, a.TasksObject)
	case a.TasksObject == "" && a.TasksSHA256 != "":
		return fail.Invalidf("tasks_sha256 without tasks_object: it is the digest of the task list object the arrival names")
	}
	for i, t := range a.Tasks {
		if t.Prompt == "" {
			return fail.Invalidf("task %d has an empty prompt", i)
		}
	}
	if err := groupsOfOneTask(a.Tasks); err != nil {
		return err
	}
	if a.Sampling != nil {
		if err := schema.CheckSampling(a.Role, *a.Sampling); err != nil {
			return fail.E(fail.Invalid, err)
		}
	}
	if a.Config != nil {
		cfg := a.Config.WithDefaults()
		if err := cfg.Validate(); err != nil {
			return fail.E(fail.Invalid, err)
		}
		if cfg.MaxStaleness > 0 && a.WeightVersion != "" {
			if _, ok := schema.VersionNumber(a.WeightVersion); !ok {
				return fail.Invalidf("weight_version %q: with max_staleness, versions must end in a number (staleness is counted in them)", a.WeightVersion)
			}
		}
		if err := s.outlives(cfg, a.Role); err != nil {
			return err
		}
	}
	return nil
}

// checkEngineURL accepts what a gateway can send requests to: an absolute
// http or https URL with a host. One without its scheme
// ("planner-router:30000") is told what it lacks.
func checkEngineURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case (err != nil || u.Scheme != "http" && u.Scheme != "https") && !strings.Contains(raw, "://"):
		return fmt.Errorf("want an http or https URL: %q, say", "http://"+raw)
	case err != nil:
		return errors.Unwrap(err) // the *url.Error repeats the URL
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: want http or https", u.Scheme)
	case u.Host == "":
		return fmt.Errorf("the URL names no host")
	}
	return nil
}

// groupsOfOneTask refuses a task list with a group (the tasks sharing a
// group_index) of different labels: a group is the copies of one task
// (n_samples_per_prompt), whose rewards are compared with each other (the
// spread filter, group-relative advantages), and a filter server is sent
// one prompt and label for it. The copies' prompts may differ (a
// paraphrase, or the simulated engines' fault markers in the tests); their
// answer may not. The error names the group and two of its tasks.
func groupsOfOneTask(tasks []schema.Task) error {
	first := map[int]int{} // by group_index: its first task
	for i, t := range tasks {
		j, ok := first[t.GroupIndex]
		if !ok {
			first[t.GroupIndex] = i
			continue
		}
		if tasks[j].Label != t.Label {
			return fail.Invalidf("group_index %d: tasks %d and %d have different labels (%.80q, %.80q; prompts %.80q, %.80q): a group is the copies of one task, their rewards compared with each other; give each task a group_index of its own",
				t.GroupIndex, j, i, tasks[j].Label, t.Label, tasks[j].Prompt, t.Prompt)
		}
	}
	return nil
}

// outlives checks that the session of a rollout with the configuration
// cfg (defaults applied) outlives the rollout: the session is kept for the
// history from its last write, and a time-out that finds none answers no
// one. from is the role whose config cfg is; "" for none (the defaults);
// "first" for the defaults while the first arrival, without a config,
// waits for the other role.
func (s *Service) outlives(cfg schema.Config, from string) error {
	history := s.Bus.Provisioning.History
	switch life := schema.Seconds(cfg.BarrierTimeoutS + cfg.RolloutTimeoutS); {
	case from == "first":
		// Only the barrier's wait is known: the other role may bring a
		// config with a shorter one, and the rollout's is checked then.
		if wait := schema.Seconds(cfg.BarrierTimeoutS); wait >= history {
			return fail.Invalidf("arrived first without a config: the default barrier_timeout_s %g (%v) is not less than the history planact keeps (--history %v), so the rollout's session would be gone before its barrier timed out: send a config with barrier_timeout_s + rollout_timeout_s under the history, or keep a longer one",
				cfg.BarrierTimeoutS, wait, history)
		}
	case life < history:
	case from == "":
		return fail.Invalidf("config: neither arrival carried one, and the defaults' barrier_timeout_s %g + rollout_timeout_s %g = %v are not less than the history planact keeps (--history %v), so the rollout's session would be gone before it timed out: send a config with shorter time-outs, or keep a longer history",
			cfg.BarrierTimeoutS, cfg.RolloutTimeoutS, life, history)
	default:
		return fail.Invalidf("config: barrier_timeout_s + rollout_timeout_s = %v: want less than the history planact keeps (--history %v)", life, history)
	}
	return nil
}

// chatPlannerFirst refuses a rollout whose mode has the actor go first
// (peer_review) with a planner on openai-chat: the planner's first turn
// then brings two new messages (the task and the actor's answer), and only
// the last message's ids come from the server's chat template; the ids of
// the first, from /tokenize, are not what the template renders, so every
// episode would end as token drift. Said at the start, not per episode.
func chatPlannerFirst(v *schema.Session) error {
	m, err := mode.For(v.Config)
	if err != nil || m.FirstPlannerTurn() <= 1 || v.Roles[schema.RolePlanner].Engine.Protocol != engine.ProtocolOpenAIChat {
		return nil // a mode it does not know is refused elsewhere
	}
	return fmt.Errorf("config: mode %s with a planner on protocol %s: the planner's first turn sends the task and the actor's answer as two new messages, and a chat template's ids of the first cannot be had (every episode would end as token drift): give the planner protocol %s or %s",
		v.Config.Mode, engine.ProtocolOpenAIChat, engine.ProtocolOpenAI, engine.ProtocolSGLang)
}

// chatPlannerStops refuses a rollout whose planner, on openai-chat, has
// stop strings and more than one turn: a chat reply's text leaves out the
// stop string that its token ids hold, the next turn sends that text back
// as the assistant's message, and the chat template renders it without
// those tokens, so every episode would end as token drift at its second
// planner turn. Said at the start, not per episode.
func chatPlannerStops(v *schema.Session) error {
	m, err := mode.For(v.Config)
	stop := v.Config.PlannerSampling.Stop
	if err != nil || len(stop) == 0 || v.Config.MaxTurns <= m.FirstPlannerTurn() || v.Roles[schema.RolePlanner].Engine.Protocol != engine.ProtocolOpenAIChat {
		return nil
	}
	return fmt.Errorf("config: planner_sampling.stop %q with a planner on protocol %s and max_turns %d: a chat reply's text leaves out the stop string its token ids hold, so the chat template renders the turn otherwise on the next one (every episode would end as token drift at its second planner turn): leave stop out, give the planner protocol %s or %s, or one planner turn",
		stop, engine.ProtocolOpenAIChat, v.Config.MaxTurns, engine.ProtocolOpenAI, engine.ProtocolSGLang)
}

// unrecorded answers the arrival a (as id), which could not be recorded
// because of err, when its message is given up: err cannot pass, or this
// was the last delivery the session-store's consumers make (maxDeliveries).
// Given up in silence, it left its trainer waiting for a result that
// never comes. bus.Msg.Delivered is for logs and back-off, never to decide
// what happened: here it decides only to answer, and what happened (the
// arrival is not in the session) the error says. It returns err, for the
// consumer to give the message up (or, before the last delivery, to
// deliver it again).
func (s *Service) unrecorded(ctx context.Context, m bus.Msg, p subject.Parsed, a *schema.Arrive, id string, err error) error {
	if fail.IsRetryable(err) && m.Delivered < maxDeliveries {
		return err
	}
	cause := fmt.Errorf("the arrival could not be recorded (%d tries): %w; arrive again", m.Delivered, err)
	zerolog.Ctx(ctx).Error().Err(err).Uint64("delivered", m.Delivered).Msg("arrival given up; the trainer is told")
	if rerr := s.reject(ctx, p, a, id, cause); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// rejectUndecodable answers an arrival that cannot be read (a trainer in
// another language with a wrong schema version or a misspelt field, say)
// on the rejection subject of the role its subject or header names, so
// that its trainer learns why.
func (s *Service) rejectUndecodable(ctx context.Context, m bus.Msg, p subject.Parsed, cause error) error {
	role := p.Role
	if role == "" {
		role = m.Header.Get(schema.HdrRole)
	}
	if !subjectToken(role) {
		return cause // nobody to tell: the message is rejected and logged
	}
	zerolog.Ctx(ctx).Warn().Err(cause).Msg("arrival cannot be decoded")
	return s.Bus.Publish(ctx, &schema.Result{Rollout: p.Rollout, Role: role, Status: schema.ResultInvalid,
		Reason: "arrival cannot be decoded: " + cause.Error(), ArrivalID: trainerID(m), Rejected: true})
}

// reject tells the trainer why its arrival was refused, on the rejection
// subject of the role its subject names (the body's, on the subject of
// before roles were in it), whatever that role is: a trainer that arrived
// as "plannner" waits on rollout.N.result.plannner.rejected.
func (s *Service) reject(ctx context.Context, p subject.Parsed, a *schema.Arrive, id string, cause error) error {
	role := p.Role
	if role == "" {
		role = a.Role
	}
	if !subjectToken(role) {
		return s.status(ctx, p.Rollout, "rejected", -1, cause.Error())
	}
	return s.Bus.Publish(ctx, &schema.Result{
		Rollout: p.Rollout, Role: role, Status: schema.ResultInvalid, Reason: cause.Error(), ArrivalID: id, Rejected: true,
	})
}

// trainerID is what an arrival or a cancel, m, is named by in the
// session and the answers to it (schema.TrainerMsgID): its Nats-Msg-Id,
// or seq:<n> when it has none or one too long to take.
func trainerID(m bus.Msg) string {
	return schema.TrainerMsgID(m.Header.Get(jetstream.MsgIDHeader), m.Seq)
}

// subjectToken reports whether s can be one token of a subject.
func subjectToken(s string) bool {
	return s != "" && s == subject.Token(s)
}

// lastArrived is the role whose arrival completed sess's barrier (the
// later of the two; the planner's at the same millisecond).
func lastArrived(sess *schema.Session) string {
	if sess.Roles[schema.RoleActor].ArrivedMs > sess.Roles[schema.RolePlanner].ArrivedMs {
		return schema.RoleActor
	}
	return schema.RolePlanner
}

// start fans out the rollout: its deadline, the start event and the first
// plan request of every episode. Every publish is idempotent.
func (s *Service) start(ctx context.Context, sess *schema.Session) error {
	// The deadline, the start and the first plan requests go out at once
	// (their acks awaited together): a start costs one round trip, not one
	// per step. If any fails, the effect stays in the outbox and all of it
	// is published again (message ids make that idempotent), so the
	// rollout's deadline is in place before the effect is settled.
	deadline := make(chan error, 1)
	go func() { deadline <- s.scheduleTimeout(ctx, sess.Rollout, schema.TimeoutRollout, sess.DeadlineMs()) }()
	version := sess.Roles[schema.RolePlanner].WeightVersion
	md, err := mode.For(sess.Config)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	var tasks []schema.Task
	if md.FirstPlannerTurn() > 1 {
		// The actor goes first: its first act is the task itself.
		tl, err := s.tasksOf(ctx, sess)
		if err != nil {
			return err
		}
		if tasks = tl.Tasks; len(tasks) < sess.Episodes {
			return fail.Permanentf("rollout %d: %d tasks for %d episodes", sess.Rollout, len(tasks), sess.Episodes)
		}
	}
	msgs := make([]schema.Message, 0, sess.Episodes+2)
	msgs = append(msgs, &schema.Start{Rollout: sess.Rollout, Episodes: sess.Episodes, DeadlineMs: sess.DeadlineMs(), AtMs: sess.StartedMs})
	for e := range sess.Episodes {
		var task schema.Task
		if tasks != nil {
			task = tasks[e]
		}
		msgs = append(msgs, md.Open(sess.Rollout, e, task, sess.Config, version))
	}
	msgs = append(msgs, &schema.Status{Rollout: sess.Rollout, Event: "started", Episode: -1, Detail: fmt.Sprintf("%d episodes", sess.Episodes), AtMs: s.nowMs()})
	err = s.Bus.PublishAll(ctx, msgs...)
	if derr := <-deadline; derr != nil {
		return derr
	}
	if err != nil {
		return fmt.Errorf("start episodes: %w", err)
	}
	s.cancelSchedules(ctx, sess.Rollout, schema.TimeoutBarrier)
	return nil
}

func (s *Service) status(ctx context.Context, n int64, event string, episode int, detail string) error {
	return s.Bus.Publish(ctx, &schema.Status{Rollout: n, Event: event, Episode: episode, Detail: detail, AtMs: s.nowMs()})
}

// isSHA256 says whether s is a SHA-256 in lower-case hex.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

package sessionstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// handleArrive records a role's arrival. The compare-and-set write that
// completes the pair is the one that starts the rollout, so racing and
// duplicated arrivals start it exactly once; the start itself is an effect
// recorded in the session with that write and published after it.
func (s *Service) handleArrive(ctx context.Context, m bus.Msg, p subject.Parsed) error {
	id := m.ID()
	var a schema.Arrive
	if err := schema.UnmarshalTrainer(m.Data, m.Header, &a); err != nil {
		return s.rejectUndecodable(ctx, m, p, fmt.Errorf("%s: %w", m.Subject, err))
	}
	log := zerolog.Ctx(ctx) // has the rollout and role, from the headers
	if err := schema.CheckRouting(m.Subject, m.Header, &a); err != nil {
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	}
	if err := s.validateArrival(&a); err != nil {
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	}
	if len(a.Tasks) > 0 || a.TasksObject != "" {
		// The first arrival with tasks wins; later lists are ignored.
		created, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(a.Rollout), &schema.TaskList{Tasks: a.Tasks, Object: a.TasksObject})
		if err != nil {
			return rolloutErr(a.Rollout, err)
		}
		if created && len(a.Tasks) > 0 {
			s.keepTasks(a.Rollout, a.Tasks) // the barrier and every episode end need them
		}
	}

	// The two arrivals of a rollout, when this process has both, take
	// turns: run together, they race on the session key, and the loser
	// backs off and reads again (the barrier's latency). Across replicas
	// the compare-and-set still decides.
	unlock, _ := s.arrivals.lock(a.Rollout)
	defer unlock()
	var late bool  // the role arrives at a rollout that ended without it
	var again bool // another arrival of a role that has arrived
	sess, rev, wrote, err := bus.MutateRev(ctx, s.Bus.Sessions, schema.SessionKey(a.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		late, again = false, false
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
			return false, nil
		}
		if v.State != schema.SessionWaiting {
			late = true // the rollout started or ended without this role
			return false, nil
		}
		if v.Roles == nil {
			v.Roles = map[string]schema.RoleInfo{}
		}
		v.Roles[a.Role] = schema.RoleInfo{Engine: a.Engine, WeightVersion: a.WeightVersion, ArrivedMs: s.nowMs(), ArrivalID: id}
		if a.Config != nil && (v.ConfigFrom == "" || a.Role == schema.RolePlanner) {
			v.Config, v.ConfigFrom = *a.Config, a.Role
		}
		if len(v.Roles) < 2 {
			return true, nil
		}
		tasks, err := s.tasks(ctx, a.Rollout)
		if err != nil && fail.IsRetryable(err) {
			return false, err
		}
		v.Config = v.Config.WithDefaults()
		v.StartedMs = s.nowMs()
		switch {
		case err != nil:
			s.end(v, schema.SessionDone, schema.ResultInvalid, "tasks unusable: "+err.Error())
		case len(tasks) == 0:
			s.end(v, schema.SessionDone, schema.ResultInvalid, "no tasks: neither arrival carried any")
		case v.Config.TargetGroups > groupCount(tasks):
			s.end(v, schema.SessionDone, schema.ResultInvalid, fmt.Sprintf("config: target_groups %d: the batch has only %d groups (distinct group_index)",
				v.Config.TargetGroups, groupCount(tasks)))
		default:
			v.State, v.Episodes = schema.SessionRunning, len(tasks)
			v.Settle(schema.EffectBarrier) // no need to schedule it any more
			v.Outbox = append(v.Outbox, schema.EffectStart)
		}
		return true, nil
	})
	if err != nil {
		return rolloutErr(a.Rollout, err)
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	switch {
	case again && sess.Final():
		// A rollout id names one rollout: a trainer that submits a finished
		// one again (a training run restarted from rollout 0, say) is told,
		// not handed the old result as if it were new.
		err := fail.Invalidf("rollout %d already ended (%s at %s): its result stays on %s; a rollout id names one rollout for as long as planact keeps its history (%v)",
			a.Rollout, sess.Status, time.UnixMilli(sess.FinishedMs).UTC().Format(time.RFC3339), subject.Result(a.Rollout, a.Role), s.Bus.Provisioning.History)
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, p, &a, id, err)
	case again:
		log.Info().Str("state", sess.State).Msg("the role arrived again; the rollout goes on with its first arrival")
	case late && (sess.State == schema.SessionTimeout || sess.State == schema.SessionAborted):
		// It ended waiting for this very role: tell it, instead of leaving
		// its trainer to wait for a result that will never come.
		status := schema.ResultTimeout
		if sess.State == schema.SessionAborted {
			status = schema.ResultAborted
		}
		log.Warn().Str("state", sess.State).Msg("arrival after the rollout ended without this role")
		return s.Bus.Publish(ctx, &schema.Result{Rollout: a.Rollout, Role: a.Role, Status: status,
			Reason: "arrived after the rollout ended: " + sess.Reason})
	}
	if wrote {
		// The trainer's weights as it arrives: the role's current version,
		// which staleness is counted from.
		if err := s.noteVersion(ctx, a.Role, a.WeightVersion); err != nil {
			return err
		}
	}
	switch {
	case wrote && sess.State == schema.SessionWaiting:
		log.Info().Msg("arrived, waiting for the other role")
		_ = s.status(ctx, a.Rollout, "arrived", -1, a.Role)
	case wrote && sess.State == schema.SessionRunning:
		log.Info().Int("episodes", sess.Episodes).Msg("both roles arrived, rollout starts")
		telemetry.RolloutsStarted.Inc()
		telemetry.BarrierWaitSeconds.WithLabelValues(a.Role).Observe(float64(sess.StartedMs-sess.CreatedMs) / 1000)
	case !wrote:
		log.Info().Str("state", sess.State).Msg("arrival delivered again")
	}
	return s.settle(ctx, sess, rev)
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
	if a.Engine.Protocol != "" && !slices.Contains(engine.Protocols, a.Engine.Protocol) {
		return fail.Invalidf("engine protocol %q: want one of %s", a.Engine.Protocol, strings.Join(engine.Protocols, ", "))
	}
	if a.Config != nil && len(a.Tasks) > 0 && a.Config.TargetGroups > groupCount(a.Tasks) {
		return fail.Invalidf("config: target_groups %d: the batch has only %d groups (distinct group_index)", a.Config.TargetGroups, groupCount(a.Tasks))
	}
	if len(a.Tasks) > 0 && a.TasksObject != "" {
		return fail.Invalidf("arrival carries both tasks and tasks_object")
	}
	for i, t := range a.Tasks {
		if t.Prompt == "" {
			return fail.Invalidf("task %d has an empty prompt", i)
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
		// The session must outlive the rollout: it is kept for the history.
		if life := schema.Seconds(cfg.BarrierTimeoutS + cfg.RolloutTimeoutS); life >= s.Bus.Provisioning.History {
			return fail.Invalidf("config: barrier_timeout_s + rollout_timeout_s = %v: want less than the history planact keeps (%v)", life, s.Bus.Provisioning.History)
		}
	}
	return nil
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
		Reason: "arrival cannot be decoded: " + cause.Error(), ArrivalID: m.ID(), Rejected: true})
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

// subjectToken reports whether s can be one token of a subject.
func subjectToken(s string) bool {
	return s != "" && s == subject.Token(s)
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
	msgs := make([]schema.Message, 0, sess.Episodes+2)
	msgs = append(msgs, &schema.Start{Rollout: sess.Rollout, Episodes: sess.Episodes, DeadlineMs: sess.DeadlineMs(), AtMs: sess.StartedMs})
	for e := range sess.Episodes {
		msgs = append(msgs, &schema.PlanRequest{Rollout: sess.Rollout, Episode: e, Turn: 1, WeightVersion: version})
	}
	msgs = append(msgs, &schema.Status{Rollout: sess.Rollout, Event: "started", Episode: -1, Detail: fmt.Sprintf("%d episodes", sess.Episodes), AtMs: s.nowMs()})
	err := s.Bus.PublishAll(ctx, msgs...)
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

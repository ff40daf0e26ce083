package sessionstore

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// handleArrive records a role's arrival. The compare-and-set write that
// completes the pair is the one that starts the rollout, so racing and
// duplicated arrivals start it exactly once.
func (s *Service) handleArrive(ctx context.Context, m bus.Msg) error {
	var a schema.Arrive
	if err := m.Decode(&a); err != nil {
		return s.rejectUndecodable(ctx, m, err)
	}
	log := zerolog.Ctx(ctx) // has the rollout and role, from the headers
	if a.AtMs == 0 {
		a.AtMs = s.nowMs() // names the arrival in a rejection's message id
	}
	if err := validateArrival(&a); err != nil {
		log.Warn().Err(err).Msg("arrival rejected")
		return s.reject(ctx, &a, err)
	}
	if len(a.Tasks) > 0 || a.TasksObject != "" {
		// The first arrival with tasks wins; later lists are ignored.
		if _, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(a.Rollout), &schema.TaskList{Tasks: a.Tasks, Object: a.TasksObject}); err != nil {
			return rolloutErr(a.Rollout, err)
		}
	}

	var rejectReason string
	var late bool // the role arrives at a rollout that ended without it
	sess, wrote, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(a.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		rejectReason, late = "", false
		if !exists {
			trace := bus.TraceFrom(ctx)
			if trace == "" {
				trace = bus.NewTraceID()
			}
			*v = schema.Session{Rollout: a.Rollout, State: schema.SessionWaiting, Trace: trace, CreatedMs: s.nowMs()}
		}
		if v.State != schema.SessionWaiting {
			_, arrived := v.Roles[a.Role]
			late = !arrived
			return false, nil // late or duplicate: the rollout already started or ended
		}
		if _, dup := v.Roles[a.Role]; dup {
			return false, nil
		}
		if v.Roles == nil {
			v.Roles = map[string]schema.RoleInfo{}
		}
		v.Roles[a.Role] = schema.RoleInfo{Engine: a.Engine, WeightVersion: a.WeightVersion, ArrivedMs: s.nowMs()}
		if a.Config != nil && (v.ConfigFrom == "" || a.Role == schema.RolePlanner) {
			v.Config, v.ConfigFrom = *a.Config, a.Role
		}
		if len(v.Roles) < 2 {
			return true, nil
		}
		tasks, _, err := session.LoadTasks(ctx, s.Bus.Sessions, s.Bus.Objects, a.Rollout)
		if err != nil && fail.IsRetryable(err) {
			return false, err
		}
		v.Config = v.Config.WithDefaults()
		v.StartedMs = s.nowMs()
		if err != nil {
			v.State, v.Reason, v.FinishedMs = schema.SessionDone, "tasks unusable: "+err.Error(), s.nowMs()
			rejectReason = v.Reason
			return true, nil
		}
		if len(tasks) == 0 {
			v.State, v.Reason, v.FinishedMs = schema.SessionDone, "no tasks: neither arrival carried any", s.nowMs()
			rejectReason = v.Reason
			return true, nil
		}
		v.State, v.Episodes = schema.SessionRunning, len(tasks)
		return true, nil
	})
	if err != nil {
		return rolloutErr(a.Rollout, err)
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	if late && (sess.State == schema.SessionTimeout || sess.State == schema.SessionAborted) {
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
	if rejectReason != "" {
		if wrote || m.Delivered > 1 {
			return s.publishResults(ctx, sess, nil, schema.ResultInvalid, rejectReason, false)
		}
		return nil
	}
	switch {
	case sess.State == schema.SessionWaiting && (wrote || m.Delivered > 1):
		// A redelivery may follow a crash between the write and the
		// schedule; scheduling is idempotent (the deadline is in the id).
		log.Info().Msg("arrived, waiting for the other role")
		_ = s.status(ctx, a.Rollout, "arrived", -1, a.Role)
		return s.scheduleTimeout(ctx, a.Rollout, schema.TimeoutBarrier, sess.CreatedMs, sess.Config)
	case sess.State == schema.SessionRunning && (wrote || m.Delivered > 1):
		// A redelivered arrival may have crashed between the write and the
		// fan-out; the fan-out is idempotent by message id.
		log.Info().Int("episodes", sess.Episodes).Msg("both roles arrived, rollout starts")
		if wrote {
			telemetry.RolloutsStarted.Inc()
		}
		return s.start(ctx, sess)
	case !wrote:
		log.Info().Str("state", sess.State).Msg("duplicate or late arrival ignored")
	}
	return nil
}

// validateArrival checks what a trainer sent before anything is stored.
func validateArrival(a *schema.Arrive) error {
	if a.Role != schema.RolePlanner && a.Role != schema.RoleActor {
		return fail.Invalidf("role %q: want planner or actor", a.Role)
	}
	if a.Rollout < 0 {
		return fail.Invalidf("rollout %d: must not be negative", a.Rollout)
	}
	if a.Engine.URL == "" {
		return fail.Invalidf("%s arrived without an engine url", a.Role)
	}
	switch a.Engine.Protocol {
	case "", "sglang", "openai":
	default:
		return fail.Invalidf("engine protocol %q: want sglang or openai", a.Engine.Protocol)
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
		if err := a.Config.WithDefaults().Validate(); err != nil {
			return fail.E(fail.Invalid, err)
		}
	}
	return nil
}

// rejectUndecodable answers an arrival that cannot be read (a trainer in
// another language with a wrong schema version, say) on the result subject
// of the role its header names, so that its trainer learns why.
func (s *Service) rejectUndecodable(ctx context.Context, m bus.Msg, cause error) error {
	p, err := subject.Parse(m.Subject)
	role := m.Header.Get(schema.HdrRole)
	if err != nil || (role != schema.RolePlanner && role != schema.RoleActor) {
		return cause // nobody to tell: the message is rejected and logged
	}
	zerolog.Ctx(ctx).Warn().Err(cause).Msg("arrival cannot be decoded")
	return s.Bus.Publish(ctx, &schema.Result{Rollout: p.Rollout, Role: role, Status: schema.ResultInvalid,
		Reason: "arrival cannot be decoded: " + cause.Error(), ArrivalMs: s.nowMs()})
}

// reject tells the trainer why its arrival was refused.
func (s *Service) reject(ctx context.Context, a *schema.Arrive, cause error) error {
	if a.Role != schema.RolePlanner && a.Role != schema.RoleActor {
		return s.status(ctx, a.Rollout, "rejected", -1, cause.Error())
	}
	return s.Bus.Publish(ctx, &schema.Result{
		Rollout: a.Rollout, Role: a.Role, Status: schema.ResultInvalid, Reason: cause.Error(), ArrivalMs: a.AtMs,
	})
}

// start fans out the rollout: the start event, the rollout's deadline and
// the first plan request of every episode.
func (s *Service) start(ctx context.Context, sess schema.Session) error {
	// The deadline first: whatever fails after it, the rollout will end.
	if err := s.scheduleTimeout(ctx, sess.Rollout, schema.TimeoutRollout, sess.StartedMs, sess.Config); err != nil {
		return err
	}
	s.cancelSchedules(ctx, sess.Rollout, schema.TimeoutBarrier)
	deadline := sess.StartedMs + schema.Seconds(sess.Config.RolloutTimeoutS).Milliseconds()
	if err := s.Bus.Publish(ctx, &schema.Start{Rollout: sess.Rollout, Episodes: sess.Episodes, DeadlineMs: deadline, AtMs: sess.StartedMs}); err != nil {
		return err
	}
	version := sess.Roles[schema.RolePlanner].WeightVersion
	reqs := make([]schema.Message, sess.Episodes)
	for e := range reqs {
		reqs[e] = &schema.PlanRequest{Rollout: sess.Rollout, Episode: e, Turn: 1, WeightVersion: version}
	}
	if err := s.Bus.PublishAll(ctx, reqs...); err != nil {
		return fmt.Errorf("start episodes: %w", err)
	}
	return s.status(ctx, sess.Rollout, "started", -1, fmt.Sprintf("%d episodes", sess.Episodes))
}

// scheduleTimeout publishes a scheduled message that JetStream delivers on
// the time-out subject at the deadline, so the time-out fires even if this
// process is gone by then.
func (s *Service) scheduleTimeout(ctx context.Context, n int64, kind string, fromMs int64, cfg schema.Config) error {
	cfg = cfg.WithDefaults()
	secs := cfg.BarrierTimeoutS
	if kind == schema.TimeoutRollout {
		secs = cfg.RolloutTimeoutS
	}
	deadline := fromMs + schema.Seconds(secs).Milliseconds()
	t := &schema.Timeout{Rollout: n, TimeoutKind: kind, DeadlineMs: deadline}
	return s.Bus.Publish(ctx, t,
		jetstream.WithScheduleAt(msTime(deadline)),
		jetstream.WithScheduleTarget(subject.Timeout(n, kind)))
}

func (s *Service) status(ctx context.Context, n int64, event string, episode int, detail string) error {
	return s.Bus.Publish(ctx, &schema.Status{Rollout: n, Event: event, Episode: episode, Detail: detail, AtMs: s.nowMs()})
}

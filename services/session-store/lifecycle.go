package sessionstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// handleEpisodeEnd counts an episode end; the end that completes the count
// ends the rollout, in the same write. Ends of one rollout that arrive
// together are recorded in one write (see endQueue): episodes that end at
// the same moment do not race on the session.
func (s *Service) handleEpisodeEnd(ctx context.Context, m bus.Msg) error {
	var end schema.EpisodeEnd
	if err := m.Decode(&end); err != nil {
		return err
	}
	n := end.Rollout
	mine := &pendingEnd{end: &end, done: make(chan struct{})}
	s.ends.add(n, mine)
	unlock, _ := s.ends.locks.lock(n)
	select {
	case <-mine.done:
		unlock() // recorded with others, by the handler that wrote them
		return mine.err
	default:
	}
	batch := s.ends.take(n) // mine, and those that came while the last write ran
	sess, rev, err := s.recordEnds(ctx, n, batch)
	for _, p := range batch {
		if p.err == nil {
			p.err = err
		}
		close(p.done)
	}
	unlock()
	if err != nil {
		return rolloutErr(n, err)
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	for _, p := range batch {
		if p.wrote {
			e := p.end
			zerolog.Ctx(ctx).Debug().Int("episode", e.Episode).Str("status", e.Status).Int("ended", sess.EndedCount()).Int("episodes", sess.Episodes).Msg("episode ended")
			recordEpisode(&sess, e)
			_ = s.Bus.Publish(ctx, &schema.Status{Rollout: n, Event: "episode-" + e.Status, Episode: e.Episode,
				Detail: fmt.Sprintf("%d/%d", sess.EndedCount(), sess.Episodes), Ended: sess.EndedCount(), Episodes: sess.Episodes, Acts: sess.Acts, AtMs: s.nowMs()})
		}
	}
	if mine.err != nil {
		return rolloutErr(n, mine.err)
	}
	return s.settle(ctx, sess, rev)
}

// recordEnds marks the episodes of batch ended in rollout n's session, in
// one write, with what follows: a group complete, the rollout over. An end
// that names no episode of the rollout gets its own error.
func (s *Service) recordEnds(ctx context.Context, n int64, batch []*pendingEnd) (schema.Session, uint64, error) {
	// The tasks are read before the write when the rollout may group its
	// episodes. The index's copy of its config may be older than the
	// session (a first arrival without one), and a list cached under the
	// number may be an earlier rollout's, so the write itself decides: a
	// grouped session whose tasks were not read, or not its own, is
	// written again after reading the list it names.
	var tl schema.TaskList
	read, checked := false, false
	if cfg, ok := s.index.config(n); !ok || cfg.Grouped() {
		var err error
		if tl, err = s.taskList(ctx, n); err != nil {
			return schema.Session{}, 0, err
		}
		read = true
	}
	for {
		sess, rev, need, err := s.writeEnds(ctx, n, batch, tl, read, checked)
		if !errors.Is(err, errTasksUnread) {
			return sess, rev, err
		}
		if tl, err = s.tasksOf(ctx, &need); err != nil {
			return schema.Session{}, 0, err
		}
		read, checked = true, true
	}
}

// errTasksUnread: the session groups its episodes, and its tasks were not
// read (or those read are not the ones it names).
var errTasksUnread = errors.New("the rollout's tasks were not read")

// writeEnds records the ends of batch with the tasks of tl (read says
// whether it was; checked, whether it is the list the session names). It
// returns errTasksUnread, and the session it read, when it needs them.
func (s *Service) writeEnds(ctx context.Context, n int64, batch []*pendingEnd, tl schema.TaskList, read, checked bool) (schema.Session, uint64, schema.Session, error) {
	tasks := tl.Tasks
	var need schema.Session
	sess, rev, _, err := bus.MutateRev(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, exists bool) (bool, error) {
		if !exists {
			return false, fail.Permanentf("episode end for rollout %d, which has no session", n)
		}
		if v.State == schema.SessionRunning && v.Config.Grouped() && (!read || !checked && refusedList(v, tl)) {
			need = *v
			return false, errTasksUnread
		}
		changed := false
		for _, p := range batch {
			p.wrote, p.err = false, nil
			e := p.end.Episode
			switch {
			case v.State != schema.SessionRunning:
				continue
			case e < 0 || e >= v.Episodes:
				p.err = fail.Invalidf("rollout %d has no episode %d", n, e)
				continue
			case !v.MarkEnded(e):
				continue // counted before (a redelivery)
			}
			p.wrote, changed = true, true
			v.Acts += len(p.end.Acts)
			// The group of the episode is complete when all its tasks
			// ended: it is delivered (or filtered) at once.
			if v.Config.Grouped() && e < len(tasks) {
				g, members := groupOf(tasks, e)
				complete := true
				for _, m := range members {
					if _, ended := slices.BinarySearch(v.Ended, m); !ended {
						complete = false
					}
				}
				if complete && !v.Owes(schema.EffectGroup(g)) {
					if _, known := v.Group(g); !known {
						v.Outbox = append(v.Outbox, schema.EffectGroup(g))
					}
				}
			}
			if v.EndedCount() == v.Episodes {
				s.end(v, schema.SessionDone, schema.ResultOK, "")
			}
		}
		return changed, nil
	})
	return sess, rev, need, err
}

// pendingEnd is an episode end waiting to be recorded.
type pendingEnd struct {
	end   *schema.EpisodeEnd
	done  chan struct{} // closed once recorded (or refused)
	wrote bool
	err   error
}

// endQueue gathers the episode ends of each rollout that wait for the
// rollout's write in progress; the handler that writes next records them
// all (group commit).
type endQueue struct {
	mu    sync.Mutex
	q     map[int64][]*pendingEnd
	locks rolloutLocks
}

func (q *endQueue) add(n int64, p *pendingEnd) {
	q.mu.Lock()
	if q.q == nil {
		q.q = map[int64][]*pendingEnd{}
	}
	q.q[n] = append(q.q[n], p)
	q.mu.Unlock()
}

func (q *endQueue) take(n int64) []*pendingEnd {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.q[n]
	delete(q.q, n)
	return out
}

// handleTimeout ends a rollout whose deadline passed while it was still in
// the state the time-out guards, and removes the results of one whose
// retention passed.
func (s *Service) handleTimeout(ctx context.Context, m bus.Msg) error {
	var t schema.Timeout
	if err := m.Decode(&t); err != nil {
		return err
	}
	if t.TimeoutKind == schema.TimeoutRetention {
		return s.retire(ctx, t.Rollout)
	}
	return s.timeOut(ctx, t.Rollout, t.TimeoutKind)
}

// timeOut ends rollout n with a time-out of kind (barrier or rollout) if it
// is still in the state that kind guards and its deadline has passed: a
// scheduled message fires on a whole second and may be early.
func (s *Service) timeOut(ctx context.Context, n int64, kind string) error {
	var early time.Duration
	sess, rev, _, err := bus.MutateRev(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, exists bool) (bool, error) {
		early = 0
		switch {
		case !exists:
			return false, nil
		case kind == schema.TimeoutBarrier && v.State == schema.SessionWaiting:
			if left := v.BarrierDeadlineMs() - s.nowMs(); left > 0 {
				early = time.Duration(left) * time.Millisecond
				return false, nil
			}
			s.end(v, schema.SessionTimeout, schema.ResultTimeout, "barrier time-out: the other role never arrived")
			return true, nil
		case kind == schema.TimeoutRollout && v.State == schema.SessionRunning:
			if left := v.DeadlineMs() - s.nowMs(); left > 0 {
				early = time.Duration(left) * time.Millisecond
				return false, nil
			}
			// Partial when some episodes ended (their samples come), time-out when none did.
			status := schema.ResultTimeout
			if v.EndedCount() > 0 {
				status = schema.ResultPartial
			}
			s.end(v, schema.SessionTimeout, status, fmt.Sprintf("rollout time-out: %d of %d episodes ended", v.EndedCount(), v.Episodes))
			return true, nil
		}
		return false, nil // the rollout moved on: nothing to do
	})
	if err != nil {
		return rolloutErr(n, err)
	}
	if early > 0 {
		return fail.After(early, fmt.Errorf("rollout %d: %s time-out fired %v before its deadline", n, kind, early))
	}
	return s.settle(bus.WithTrace(ctx, sess.Trace), sess, rev)
}

// handleCancel aborts a waiting or running rollout. Every cancel is
// answered (answerCancel), naming it by its message id: "cancelled" once
// the rollout is aborted (its results follow on the result subjects, if
// they are not out yet), "rejected" (saying why) when there is nothing to
// abort (the rollout had already ended, or is not known, and no arrival of
// the cancel's role stored before it waits to be recorded), when the
// cancel could not be recorded, when it cannot be read, or when its reason
// is over schema.MaxReason or its message id over schema.MaxControlID (it
// is named seq:<n> then).
func (s *Service) handleCancel(ctx context.Context, m bus.Msg, p subject.Parsed) error {
	id := trainerID(m)
	var c schema.Cancel
	if err := schema.UnmarshalTrainer(m.Data, m.Header, &c); err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("cancel rejected")
		return s.answerCancel(ctx, p.Rollout, cancelRole(p, &c), id, schema.CancelRefused, err.Error())
	}
	if err := schema.CheckRouting(m.Subject, m.Header, &c); err != nil {
		err = fmt.Errorf("cancel refused: %w", err)
		zerolog.Ctx(ctx).Warn().Err(err).Msg("cancel rejected")
		return s.answerCancel(ctx, p.Rollout, cancelRole(p, &c), id, schema.CancelRefused, err.Error())
	}
	if err := schema.CheckMsgID(fmt.Sprintf("cancel of rollout %d by %s", c.Rollout, c.Role), m.Header.Get(jetstream.MsgIDHeader)); err != nil {
		// Repeated in the session and the answer's subject, id and
		// detail: refused (answered as seq:<n>), as a pause's is.
		zerolog.Ctx(ctx).Warn().Err(err).Msg("cancel rejected")
		return s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelRefused, err.Error())
	}
	if len(c.Reason) > schema.MaxReason {
		// It is repeated in the session, in each role's result and in
		// every answer that the rollout had ended (whose message id holds
		// it): refused as a pause's is, never cut short in silence.
		err := fmt.Errorf("cancel of rollout %d: reason of %d bytes: want at most %d (planact repeats it in the rollout's results and answers)",
			c.Rollout, len(c.Reason), schema.MaxReason)
		zerolog.Ctx(ctx).Warn().Err(err).Msg("cancel rejected")
		return s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelRefused, err.Error())
	}
	reason := "aborted by the " + c.Role + " trainer"
	if c.Reason != "" {
		reason += ": " + c.Reason
	}
	var unknown bool
	sess, rev, wrote, err := bus.MutateRev(ctx, s.Bus.Sessions, schema.SessionKey(c.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		unknown = !exists
		if !exists || v.Final() {
			return false, nil
		}
		s.end(v, schema.SessionAborted, schema.ResultAborted, reason)
		v.CancelledBy = id
		return true, nil
	})
	if err == nil && unknown {
		// An arrival stored before this cancel (its own role's, on the
		// same stream, or the other's) may not be recorded yet (the
		// trainers' messages are handled at once, up to Concurrency): the
		// cancel waits for it rather than answer that the rollout is not
		// known, and the rollout then run, uncancelled.
		var pending string
		if pending, err = s.pendingArrival(ctx, m, &c); err == nil && pending != "" {
			err = fail.Transientf("rollout %d is not known yet: the arrival %s, stored before this cancel, is not recorded", c.Rollout, pending)
		}
	}
	if err != nil {
		err = rolloutErr(c.Rollout, err)
		// Not recorded: given up (it cannot pass, or this was the last
		// delivery the consumer makes), it is answered, not left to its
		// trainer's time-out. Delivered decides only to answer here,
		// never what happened: the error says the cancel was not recorded.
		if fail.IsRetryable(err) && m.Delivered < maxDeliveries {
			return err
		}
		zerolog.Ctx(ctx).Error().Err(err).Uint64("delivered", m.Delivered).Msg("cancel given up; the trainer is told")
		if serr := s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelNotRecorded,
			fmt.Sprintf("could not be recorded (%d tries): %v; cancel again", m.Delivered, err)); serr != nil {
			return errors.Join(err, serr)
		}
		return err
	}
	if unknown {
		// Nothing to abort: whoever cancelled is told.
		zerolog.Ctx(ctx).Warn().Msg("cancel of a rollout planact does not know")
		return s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelNothingToAbort,
			fmt.Sprintf("rollout %d is not known (never arrived, or past the history)", c.Rollout))
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	if !wrote && sess.CancelledBy != id {
		// It ended before (or by another cancel): nothing to abort. Its
		// results stay where they are; the trainer is told how it ended.
		zerolog.Ctx(ctx).Info().Str("status", sess.Status).Msg("cancel of a rollout that had already ended")
		if err := s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelNothingToAbort,
			fmt.Sprintf("rollout %d had already ended (%s); nothing to abort", c.Rollout, endedAs(&sess, c.Role))); err != nil {
			return err
		}
		return s.settle(ctx, sess, rev)
	}
	if wrote {
		zerolog.Ctx(ctx).Warn().Str("reason", reason).Msg("rollout aborted")
	}
	// The abort is recorded: the cancel is answered before the effects
	// settle. Settled first, a settle that kept failing (results that
	// cannot be assembled yet) left the cancel unanswered after the last
	// delivery, though the rollout was aborted and the sweep publishes its
	// results; and its trainer waited for the whole assembly.
	if err := s.answerCancel(ctx, c.Rollout, c.Role, id, schema.CancelAborted, fmt.Sprintf("rollout %d aborted", c.Rollout)); err != nil {
		return err
	}
	return s.settle(ctx, sess, rev)
}

// cancelRole is the role of the trainer that sent a cancel that cannot be
// taken: the one its subject names (only that role's trainer may publish
// there), else the one its body names; "" when neither does.
func cancelRole(p subject.Parsed, c *schema.Cancel) string {
	if schema.CheckRole(p.Role) == nil {
		return p.Role
	}
	if schema.CheckRole(c.Role) == nil {
		return c.Role
	}
	return ""
}

// answerCancel answers the cancel id of rollout n by role (outcome, and
// why): on the rollout's status subject, naming the cancel in cancel_id
// and at the head of the detail ("cancel <id> by the <role> trainer: ",
// which clients before cancel_id go by), and, as the last message of a
// subject of its own that the role's trainer may read from the stream
// (subject.CancelAnswer), for a trainer that missed the first: the
// status subject holds the rollout's later events too.
func (s *Service) answerCancel(ctx context.Context, n int64, role, id, outcome, why string) error {
	who := "cancel " + id
	if role != "" {
		who += " by the " + role + " trainer"
	}
	event := "rejected"
	if outcome == schema.CancelAborted {
		event = "cancelled"
	}
	st := &schema.Status{Rollout: n, Event: event, Episode: -1, Detail: who + ": " + why,
		CancelID: id, CancelOutcome: outcome, AtMs: s.nowMs()}
	if err := s.Bus.Publish(ctx, st); err != nil {
		return err
	}
	if role == "" || n < 0 {
		return nil // no trainer's subject to hold it
	}
	body, err := schema.Marshal(st)
	if err != nil {
		return fail.E(fail.Permanent, err)
	}
	return s.Bus.Publish(ctx, bus.Encoded{Message: storedAnswer{Status: st, subject: subject.CancelAnswer(n, role, id)}, Body: body})
}

// storedAnswer is a cancel's answer on its own subject: the status event,
// under an id of its own (the status subject's is in the same stream, and
// a copy under its id would be dropped as a duplicate).
type storedAnswer struct {
	*schema.Status
	subject string
}

func (a storedAnswer) Subject() string { return a.subject }
func (a storedAnswer) MsgID() string   { return "answer." + a.Status.MsgID() }

// pendingArrival returns the message id of an arrival for the cancel c's
// rollout that is neither recorded in a session nor refused, and was
// stored before the cancel m: its own role's (on the same stream, in
// order) or the other role's (on its own stream, stored earlier by the
// server's clock); "" when there is none. The caller found no session:
// such an arrival is still being handled (or waits for a delivery), and
// the rollout it starts is the one cancelled. Every arrival stored before
// the cancel counts, not only the last of its subject: one sent again
// after the cancel (by either role) hid the one before it, still pending.
func (s *Service) pendingArrival(ctx context.Context, m bus.Msg, c *schema.Cancel) (string, error) {
	if m.Seq == 0 || m.Subject != subject.Cancel(c.Rollout, c.Role) {
		return "", nil // not from the role's stream: no order to go by
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		stream, subj := bus.StreamTrainer(role), subject.Arrive(c.Rollout, role)
		var refused map[string]bool // read once an arrival is found
		for from := uint64(1); ; {
			am, err := s.Bus.NextMsg(ctx, stream, subj, from)
			if err != nil {
				return "", err
			}
			if am == nil || role == c.Role && am.Seq > m.Seq || role != c.Role && (m.Time.IsZero() || am.Time.After(m.Time)) {
				break // stored after the cancel, as every later one is
			}
			from = am.Seq + 1
			id := trainerID(bus.Msg{Subject: am.Subject, Header: am.Header, Seq: am.Seq})
			if refused == nil {
				if refused, err = s.refusedArrivals(ctx, c.Rollout, role); err != nil {
					return "", err
				}
			}
			if !refused[id] {
				return id, nil
			}
		}
	}
	return "", nil
}

// refusedArrivals returns the ids of the arrivals of role for rollout n
// that were refused: no rollout starts from them.
func (s *Service) refusedArrivals(ctx context.Context, n int64, role string) (map[string]bool, error) {
	refused := map[string]bool{}
	for from := uint64(1); ; {
		rm, err := s.Bus.NextMsg(ctx, bus.StreamRollout, subject.Rejected(n, role), from)
		if err != nil || rm == nil {
			return refused, err
		}
		from = rm.Seq + 1
		var r schema.Result
		if err := rm.Decode(&r); err != nil {
			return nil, err
		}
		refused[r.ArrivalID] = true
	}
}

// end records in v that the rollout ended: its final state, the result
// status and why, and the effects that follow (results, cleanup).
func (s *Service) end(v *schema.Session, state, status, reason string) {
	v.State, v.Status, v.Reason, v.FinishedMs = state, status, reason, s.nowMs()
	v.Settle(schema.EffectBarrier, schema.EffectStart) // nothing to start any more
	v.Outbox = append(v.Outbox, schema.EffectResults, schema.EffectCleanup)
}

// endedAs says how the finished rollout sess ended, for the role asking
// (asker) first and then the other: when, and each role's result status
// and why. Each role's result has its own status (the actor's can be
// failed where the planner's is ok), so none is given for the whole
// rollout. Before their publishing is recorded (they may be out already)
// it gives the status decided when the rollout ended, and where each
// role's result is. Of a session recorded before each role's was,
// it gives the first arrived role's (the session's status then) and
// sends to the other's result subject.
func endedAs(sess *schema.Session, asker string) string {
	at := time.UnixMilli(sess.FinishedMs).UTC().Format(time.RFC3339)
	if _, out := resultsOut(sess); !out {
		s := fmt.Sprintf("%s at %s", sess.Status, at)
		if sess.Reason != "" {
			s += ": " + sess.Reason
		}
		return s + fmt.Sprintf("; each role's result has a status of its own: %s, %s", subject.Result(sess.Rollout, schema.RolePlanner), subject.Result(sess.Rollout, schema.RoleActor))
	}
	roles := []string{schema.RolePlanner, schema.RoleActor}
	if asker == schema.RoleActor {
		roles = []string{schema.RoleActor, schema.RolePlanner}
	}
	first := schema.RoleActor // the role whose result the session's status is
	if _, ok := sess.Roles[schema.RolePlanner]; ok {
		first = schema.RolePlanner
	}
	parts := []string{"at " + at}
	for _, role := range roles {
		ri, arrived := sess.Roles[role]
		status, reason := ri.ResultStatus, ri.ResultReason
		if arrived && status == "" && role == first {
			status, reason = sess.Status, sess.Reason
		}
		switch {
		case !arrived:
			parts = append(parts, fmt.Sprintf("the %s had not arrived", role))
		case status == "":
			parts = append(parts, fmt.Sprintf("the %s's result: not recorded in the session (%s has it)", role, subject.Result(sess.Rollout, role)))
		case reason == "":
			parts = append(parts, fmt.Sprintf("the %s's result: %s", role, status))
		default:
			parts = append(parts, fmt.Sprintf("the %s's result: %s (%s)", role, status, reason))
		}
	}
	return strings.Join(parts, "; ")
}

// settle publishes the effects in sess's outbox, in order, and then
// records them as done. Every effect is idempotent, so a settle that
// crashes half-way is completed by whoever sees the session next. Settling
// may decide more (a delivered group may end an over-sampled rollout):
// those effects are settled in turn.
// rev is the revision of sess when the caller read or wrote it (0 if
// unknown): the write that settles needs no read then.
func (s *Service) settle(ctx context.Context, sess schema.Session, rev uint64) error {
	if len(sess.Outbox) == 0 {
		return nil
	}
	ctx = bus.WithTrace(ctx, sess.Trace)
	unlock, waited := s.locks.lock(sess.Rollout)
	defer unlock()
	if waited {
		// Another handler settled meanwhile: go on from what it left.
		fresh, freshRev, found, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout))
		if err != nil {
			return rolloutErr(sess.Rollout, err)
		}
		if !found {
			return nil
		}
		sess, rev = fresh, freshRev
	}
	for len(sess.Outbox) > 0 {
		next, nextRev, err := s.settleOnce(ctx, sess, rev)
		if err != nil {
			if next.Final() {
				// The results' patience counts from their first failure
				// (or a group's before them), not from one while the
				// rollout ran, which another replica may have settled.
				s.failing.note(identify(&next), s.Now())
			}
			return rolloutErr(sess.Rollout, err)
		}
		if slices.Equal(next.Outbox, sess.Outbox) {
			return nil // nothing settled (the session changed meanwhile): the next reader goes on
		}
		sess, rev = next, nextRev
	}
	s.failing.settled(identify(&sess))
	return nil
}

// givingUp says whether the finished rollout sess has failed to settle
// for longer than ResultPatience: what cannot be delivered then is given
// up, and the results go out failed, saying why.
func (s *Service) givingUp(sess *schema.Session) bool {
	since, failing := s.failing.since(identify(sess))
	return sess.Final() && failing && s.Now().Sub(since) > s.ResultPatience
}

func (s *Service) settleOnce(ctx context.Context, sess schema.Session, rev uint64) (schema.Session, uint64, error) {
	var done []string
	var res *published
	var groups []schema.GroupState
	var objects []string
	var undelivered []lostGroup // groups given up: the results go out failed, saying why
	for _, effect := range sess.Outbox {
		var err error
		switch {
		case effect == schema.EffectBarrier:
			err = s.scheduleTimeout(ctx, sess.Rollout, schema.TimeoutBarrier, sess.BarrierDeadlineMs())
		case strings.HasPrefix(effect, "version:"):
			role := strings.TrimPrefix(effect, "version:")
			err = s.noteVersion(ctx, role, sess.Roles[role].WeightVersion)
		case effect == schema.EffectStart:
			err = s.start(ctx, &sess)
		case strings.HasPrefix(effect, "group:"):
			var g int
			if _, err = fmt.Sscanf(effect, "group:%d", &g); err != nil {
				err = fail.Permanentf("effect %q: %w", effect, err)
				break
			}
			var gs schema.GroupState
			var eps map[int]*episode
			if gs, sess, rev, eps, err = s.decideGroup(ctx, sess, rev, g); err == nil && gs.State == schema.GroupDelivered {
				var objs []string
				objs, err = s.deliverGroup(ctx, &sess, g, eps)
				objects = append(objects, objs...)
			}
			if err == nil {
				groups = append(groups, gs)
			} else if !sess.Final() && !fail.IsRetryable(err) {
				// Never to be delivered, while the rollout runs: recorded
				// failed, so that the groups behind it in the outbox are
				// still delivered (and target_groups reached).
				zerolog.Ctx(ctx).Error().Err(err).Int("group", g).Msg("group could not be delivered; recorded failed")
				var ferr error
				if gs, sess, rev, ferr = s.failGroup(ctx, sess, rev, g, err); ferr != nil {
					err = ferr
				} else {
					groups, err = append(groups, gs), nil
				}
			} else if sess.Final() && (!fail.IsRetryable(err) || s.givingUp(&sess)) {
				// Never to be delivered (or not within the patience): the
				// results behind it are not held back for ever.
				zerolog.Ctx(ctx).Error().Err(err).Int("group", g).Msg("group could not be delivered; the results go out failed")
				undelivered, err = append(undelivered, lostGroup{g, err}), nil
			}
		case effect == schema.EffectResults:
			res, err = s.publishResults(ctx, &sess, undelivered)
			if res != nil {
				objects = append(objects, res.objects...)
			}
		case effect == schema.EffectCleanup:
			err = s.cleanup(ctx, &sess, res, objects)
		default:
			err = fail.Permanentf("unknown effect %q in the outbox", effect)
		}
		if err != nil {
			return sess, rev, fmt.Errorf("%s: %w", effect, err)
		}
		done = append(done, effect)
	}
	var ended bool                    // this write settles the results: the rollout is over
	var started bool                  // this write settles the start: the rollout runs
	var announced []schema.GroupState // the groups whose effects this write settles
	final, finalRev, _, err := bus.MutateFrom(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), sess, rev, func(v *schema.Session, exists bool) (bool, error) {
		ended, started, announced = false, false, nil
		if !exists {
			return false, nil
		}
		ended = v.Owes(schema.EffectResults) && slices.Contains(done, schema.EffectResults)
		started = v.Owes(schema.EffectStart) && slices.Contains(done, schema.EffectStart)
		for _, gs := range groups {
			if v.Owes(schema.EffectGroup(gs.Index)) {
				announced = append(announced, gs)
			}
		}
		changed := v.Settle(done...)
		if ended && v.ResultsMs == 0 {
			// Their retention runs from now, however late they went out
			// (after a crash, or a patience of tries).
			v.ResultsMs, changed = res.atMs, true
		}
		for _, obj := range objects {
			if !slices.Contains(v.Objects, obj) {
				v.Objects, changed = append(v.Objects, obj), true
			}
		}
		if res != nil && v.Final() && (v.Status != res.status || v.Reason != res.reason) {
			// The session tells what the trainers were told.
			v.Status, v.Reason, changed = res.status, res.reason, true
		}
		if res != nil && v.Final() {
			// Each role's own: the answers to a cancel or an arrival after
			// the end name each, never one role's for the whole rollout.
			for role, rr := range res.roles {
				if ri, ok := v.Roles[role]; ok && (ri.ResultStatus != rr.status || ri.ResultReason != rr.reason) {
					ri.ResultStatus, ri.ResultReason = rr.status, rr.reason
					v.Roles[role], changed = ri, true
				}
			}
		}
		return changed, nil
	})
	if err != nil {
		return sess, rev, err
	}
	// Said once: a settle run again (another replica's, a redelivery)
	// finds the effect settled and says nothing, whatever the duplicate
	// window; the status's id is the group's verdict.
	for _, gs := range announced {
		_ = s.Bus.Publish(ctx, &schema.Status{Rollout: sess.Rollout, Event: "group-" + gs.State, Episode: -1,
			Detail: fmt.Sprintf("group %d %s", gs.Index, gs.Reason), AtMs: s.nowMs()})
	}
	if started {
		// Counted where the start is settled, once: the handling that wrote
		// it may have failed to settle it, and a redelivery or the sweep
		// settled it instead.
		telemetry.RolloutsStarted.Inc()
		telemetry.BarrierWaitSeconds.WithLabelValues(lastArrived(&final)).Observe(float64(final.StartedMs-final.CreatedMs) / 1000)
	}
	if ended {
		recordRollout(&final)
	}
	if res != nil && res.first {
		telemetry.RolloutsFinished.WithLabelValues(final.Status).Inc()
		zerolog.Ctx(ctx).Info().Str("status", final.Status).Str("reason", final.Reason).Msg("rollout finished")
		_ = s.status(ctx, sess.Rollout, "finished", -1, final.Status)
	}
	return final, finalRev, nil
}

// failGroup records group g of the running rollout sess as failed, for
// cause (an error no try mends): it is not delivered and does not count
// toward target_groups. A verdict of delivered recorded before the
// delivery failed is replaced (the group was not delivered); any other is
// kept. It returns the group's state and the session as written.
func (s *Service) failGroup(ctx context.Context, sess schema.Session, rev uint64, g int, cause error) (schema.GroupState, schema.Session, uint64, error) {
	failed := schema.GroupState{Index: g, State: schema.GroupFailed, Reason: clipTo(cause.Error(), maxFilterReason)}
	var gs schema.GroupState
	written, writtenRev, _, err := bus.MutateFrom(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), sess, rev, func(v *schema.Session, exists bool) (bool, error) {
		if !exists {
			return false, fail.Permanentf("group %d of rollout %d, which has no session", g, sess.Rollout)
		}
		gs = failed
		i := slices.IndexFunc(v.Groups, func(x schema.GroupState) bool { return x.Index == g })
		switch {
		case i < 0:
			v.Groups = append(v.Groups, gs)
		case v.Groups[i].State == schema.GroupDelivered:
			gs.Scores = v.Groups[i].Scores // the rewards it was decided on
			v.Groups[i] = gs
		default:
			gs = v.Groups[i]
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return schema.GroupState{}, sess, rev, err
	}
	return gs, written, writtenRev, nil
}

// cleanup removes what a finished rollout no longer needs: its run state
// and its tasks (the results are published), its pending time-outs; and it
// schedules the removal of its result objects after the retention, counted
// from when the results went out. res is what the results turned out to be
// when they were published in this settle, objects the objects it left
// (groups' and results'), not yet in sess.
func (s *Service) cleanup(ctx context.Context, sess *schema.Session, res *published, objects []string) error {
	n := sess.Rollout
	s.cancelSchedules(ctx, n, schema.TimeoutBarrier, schema.TimeoutRollout)
	s.forgetTasks(n)
	if err := s.Bus.Purge(ctx, "KV_"+bus.BucketRuns, fmt.Sprintf("$KV.%s.%d.>", bus.BucketRuns, n)); err != nil {
		return err
	}
	tl, _, found, err := bus.GetFresh[schema.TaskList](ctx, s.Bus.Sessions, schema.TasksKey(n))
	if err != nil {
		return err
	}
	if found && tl.Object != "" {
		if store := s.Bus.Tasks[tl.From]; store != nil {
			if err := store.Delete(ctx, tl.Object); err != nil && !isNotFound(err) {
				return fail.Transientf("delete task object %s/%s: %w", bus.ObjectTasks(tl.From), tl.Object, err)
			}
		}
	}
	if err := s.Bus.Purge(ctx, "KV_"+bus.BucketSession, fmt.Sprintf("$KV.%s.%s", bus.BucketSession, schema.TasksKey(n))); err != nil {
		return err
	}
	// The groups' objects are in the session already, or came in this
	// settle; the results' too when they are large.
	if len(sess.Objects) == 0 && len(objects) == 0 {
		return nil
	}
	from, out := resultsOut(sess)
	switch {
	case res != nil && sess.ResultsMs == 0:
		from = res.atMs // published in this settle, and recorded with it
	case !out:
		from = s.nowMs() // never before its results (the outbox has them first)
	}
	return s.scheduleTimeout(ctx, n, schema.TimeoutRetention, from+s.Bus.Provisioning.ResultRetention.Milliseconds())
}

// resultsOut says when the results of the rollout sess went out, which
// their retention is counted from, and whether they did.
func resultsOut(sess *schema.Session) (atMs int64, out bool) {
	switch {
	case sess.ResultsMs > 0:
		return sess.ResultsMs, true
	case !sess.Final() || sess.Owes(schema.EffectResults):
		return 0, false
	}
	return sess.FinishedMs, true // settled before that was recorded
}

// retire removes the result objects of rollout n once their retention has
// passed, and any run state written after the cleanup by a message that
// was already in flight.
func (s *Service) retire(ctx context.Context, n int64) error {
	sess, _, found, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(n))
	if err != nil || !found || !sess.Final() {
		return err
	}
	from, out := resultsOut(&sess)
	if !out {
		return nil // their cleanup schedules the retention once they are out
	}
	if left := from + s.Bus.Provisioning.ResultRetention.Milliseconds() - s.nowMs(); left > 0 {
		return fail.After(time.Duration(left)*time.Millisecond, fmt.Errorf("rollout %d: retention not over yet", n))
	}
	for _, obj := range sess.Objects {
		bucket, name, _ := cut(obj)
		store := s.resultStore(bucket)
		if store == nil {
			continue
		}
		if err := store.Delete(ctx, name); err != nil && !isNotFound(err) {
			return fail.Transientf("delete %s: %w", obj, err)
		}
	}
	if err := s.Bus.Purge(ctx, "KV_"+bus.BucketRuns, fmt.Sprintf("$KV.%s.%d.>", bus.BucketRuns, n)); err != nil {
		return err
	}
	_, _, err = bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(n), func(v *schema.Session, exists bool) (bool, error) {
		if !exists || len(v.Objects) == 0 {
			return false, nil
		}
		v.Objects = nil
		return true, nil
	})
	if err == nil {
		zerolog.Ctx(ctx).Debug().Int64("rollout", n).Msg("results retired")
	}
	return err
}

func (s *Service) resultStore(bucket string) jetstream.ObjectStore {
	for role, store := range s.Bus.Results {
		if bus.ObjectResults(role) == bucket {
			return store
		}
	}
	return nil
}

// scheduleTimeout publishes a scheduled message that JetStream delivers on
// the time-out subject at the deadline, so the time-out fires even if this
// process is gone by then. Schedules have whole seconds, so it is set on
// the second after the deadline; the handler checks the deadline itself.
func (s *Service) scheduleTimeout(ctx context.Context, n int64, kind string, deadlineMs int64) error {
	t := &schema.Timeout{Rollout: n, TimeoutKind: kind, DeadlineMs: deadlineMs}
	at := time.UnixMilli(deadlineMs).Truncate(time.Second).Add(time.Second)
	return s.Bus.Publish(ctx, t, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget(subject.Timeout(n, kind)))
}

// cancelSchedules removes pending time-outs of the rollout; a time-out that
// fires anyway finds the rollout moved on and does nothing.
func (s *Service) cancelSchedules(ctx context.Context, n int64, kinds ...string) {
	for _, kind := range kinds {
		_ = s.Bus.Purge(ctx, bus.StreamTimeout, subject.TimeoutSchedule(n, kind))
	}
}

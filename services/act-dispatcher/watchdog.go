package actdispatcher

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// The watchdog is the last line against a bug nobody knows of yet: an
// episode that made no progress for a while (no message on its plan and act
// subjects) is driven on again from what JetStream holds, the way a
// workflow engine re-issues a lost task. Whatever the episode last did
// decides what is done again: the planner is asked again, the planner's
// output parsed again, the plan's run state advanced and its acts without
// an outcome re-issued, an answer or parse error handled again. Every
// replica runs it; what it publishes has message ids derived from what it
// saw, so replicas that see the same stall publish once.

// watchdog looks at the episodes of every running rollout every Stall/4.
func (s *Service) watchdog(ctx context.Context) error {
	every := max(s.Stall/4, 200*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		running := s.follow.Running()
		s.moved.keep(running)
		for _, sess := range running {
			for _, e := range s.mayHaveStalled(&sess, s.clock()) {
				if ctx.Err() != nil {
					break
				}
				if err := s.probe(ctx, &sess, e); err != nil {
					s.Log.Warn().Err(err).Int64("rollout", sess.Rollout).Int("episode", e).Msg("watchdog could not drive the episode on; will try again")
				}
			}
		}
	}
}

// mayHaveStalled lists the episodes of sess that the watchdog must read
// the streams for at now: those not ended, but for the ones known to have
// moved within the stall. An episode's progress, as probe reads it, is at
// least its rollout's start and the stream time of any of its plan
// messages this replica handled; and no episode is stalled before Stall
// (stallFor is never less). So one seen moving within Stall needs no read,
// and a rollout that started within it none at all: at thousands of
// episodes a sweep would otherwise cost two reads per episode every
// Stall/4 (at 4,096 in flight, about 110 a second: 4-5% of the step's
// NATS messages).
func (s *Service) mayHaveStalled(sess *schema.Session, now time.Time) []int {
	if sess.StartedMs > 0 && now.Sub(time.UnixMilli(sess.StartedMs)) < s.Stall {
		return nil
	}
	var out []int
	for e := 0; e < sess.Episodes; e++ {
		if _, ended := slices.BinarySearch(sess.Ended, e); ended {
			continue
		}
		if at, ok := s.moved.at(sess.Rollout, e); ok && now.Sub(at) < s.Stall {
			continue
		}
		out = append(out, e)
	}
	return out
}

// moved keeps, for each episode of the rollouts that run, the latest
// stream time of the plan messages of it that this replica handled: a
// lower bound of the episode's last progress that needs no read. Another
// replica's messages may have moved it later; the watchdog's read finds
// those.
type moved struct {
	mu sync.Mutex
	m  map[int64]map[int]time.Time
}

func (v *moved) note(n int64, e int, t time.Time) {
	if t.IsZero() {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[int64]map[int]time.Time{}
	}
	if v.m[n] == nil {
		v.m[n] = map[int]time.Time{}
	}
	if t.After(v.m[n][e]) {
		v.m[n][e] = t
	}
}

func (v *moved) at(n int64, e int) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.m[n][e]
	return t, ok
}

// forget drops rollout n, which ended.
func (v *moved) forget(n int64) {
	v.mu.Lock()
	delete(v.m, n)
	v.mu.Unlock()
}

// keep drops the rollouts that are not running (they ended; or a message
// came before this replica saw its rollout start, and a read stands in).
func (v *moved) keep(running []schema.Session) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for n := range v.m {
		if !slices.ContainsFunc(running, func(s schema.Session) bool { return s.Rollout == n }) {
			delete(v.m, n)
		}
	}
}

// probe drives episode e of sess on if it made no progress for too long.
func (s *Service) probe(ctx context.Context, sess *schema.Session, e int) error {
	n := sess.Rollout
	last, err := s.Bus.LastMsg(ctx, bus.StreamPlan, fmt.Sprintf("plan.%d.*.%d", n, e))
	if err != nil {
		return err
	}
	lastAct, err := s.Bus.LastMsg(ctx, bus.StreamAct, fmt.Sprintf("act.%d.*.%d.*", n, e))
	if err != nil {
		return err
	}
	progress := time.UnixMilli(sess.StartedMs)
	var planSeq, actSeq uint64
	if last != nil {
		progress, planSeq = later(progress, last.Time), last.Seq
	}
	if lastAct != nil {
		progress, actSeq = later(progress, lastAct.Time), lastAct.Seq
	}
	// A paused role holds its work (a weight swap may take longer than a
	// stall): no stall while it is paused, and none counted from before
	// the pause ended. The pause's time-out bounds the wait.
	held, since := s.heldSince()
	if held {
		return nil
	}
	progress = later(progress, since)
	stalled := s.clock().Sub(progress)
	if stalled < s.stallFor(sess.Config, last) {
		return nil
	}
	// What is published again is named after what was seen: replicas that
	// see the same stall publish one message, the next stall another.
	tag := fmt.Sprintf("w%d-%d", planSeq, actSeq)
	ctx = bus.WithTrace(ctx, sess.Trace)
	log := s.Log.With().Int64("rollout", n).Int("episode", e).Str("tag", tag).Logger()
	// Its sweep goes on to other episodes: an episode's end that must wait
	// for the acts of an abandoned turn is tried again at the next sweep.
	ctx = withoutWaiting(log.WithContext(ctx))
	info, err := s.sessions.Get(ctx, n)
	if err != nil {
		return err
	}
	if !info.Active() {
		return nil
	}
	end, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(n, e))
	if err != nil {
		return err
	}
	action, err := s.driveOn(ctx, info, e, last, end, tag)
	if action != "" && err == nil {
		// A try that failed drove nothing on: the next sweep tries again
		// (the same tag), and counts it when it does.
		telemetry.Recoveries.WithLabelValues(Name, action).Inc()
		log.Warn().Str("action", action).Dur("stalled", stalled.Round(time.Second)).Msg("watchdog: episode made no progress; driven on")
	}
	if err != nil && action != "" {
		return fmt.Errorf("%s: %w", action, err)
	}
	return err
}

// driveOn does again the step of episode e that last moved, and says what
// it did.
func (s *Service) driveOn(ctx context.Context, info *session.Info, e int, last, end *bus.StoredMsg, tag string) (string, error) {
	n := info.Session.Rollout
	if end != nil {
		// Ended, and the session-store has not counted it.
		return "episode-end", s.Bus.Republish(ctx, end, tag)
	}
	if last == nil {
		// Not even the first plan request is there (lost): its own id may
		// still be in the duplicate window, so it goes out under another.
		// The rollout's mode says what that first message is.
		md, err := mode.For(info.Session.Config)
		if err != nil {
			return "", fail.E(fail.Invalid, err)
		}
		task, err := info.Task(e)
		if err != nil {
			return "", err
		}
		first := md.Open(n, e, task, info.Session.Config, plannerVersion(info))
		return "plan-request", s.Bus.PublishAs(ctx, first, first.MsgID()+"."+tag)
	}
	p, err := subject.Parse(last.Subject)
	if err != nil {
		return "", err
	}
	switch p.Verb {
	case "req", "partial":
		return "plan-request", s.askAgain(ctx, n, e, tag)
	case "out":
		return "plan-output", s.Bus.Republish(ctx, last, tag)
	case "dag":
		var d schema.PlanDAG
		if err := schema.Unmarshal(last.Data, &d); err != nil {
			return "", err
		}
		if d.Partial {
			// A partial plan may be parsed after its turn's final output
			// (the plan-parser takes the plan so far and the final output
			// apart): once that output is out, the planner has written the
			// turn, and what the output was parsed into drives it on.
			over, err := s.finalOut(ctx, &d)
			if err != nil {
				return "", err
			}
			if !over {
				return "plan-request", s.askAgain(ctx, n, e, tag) // the planner stopped mid-plan
			}
			if action, err := s.driveDecided(ctx, info, &d); action != "" || err != nil {
				return action, err
			}
		}
		return "run", s.driveRun(ctx, info, last, &d, tag)
	case "answer":
		var a schema.PlanAnswer
		if err := schema.Unmarshal(last.Data, &a); err != nil {
			return "", err
		}
		return "answer", s.handleAnswer(ctx, info, &a)
	case "error":
		var pe schema.PlanError
		if err := schema.Unmarshal(last.Data, &pe); err != nil {
			return "", err
		}
		return "parse-error", s.handleParseError(ctx, info, &pe)
	}
	return "", fmt.Errorf("last message %s: nothing to drive on", last.Subject)
}

// driveDecided handles again the answer or parse error that decided the
// turn of the partial plan d, if its final output was one; it returns ""
// when it was not (a plan: the run is driven on).
func (s *Service) driveDecided(ctx context.Context, info *session.Info, d *schema.PlanDAG) (string, error) {
	n, e := d.Rollout, d.Episode
	if m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanAnswer(n, e)); err != nil {
		return "", err
	} else if m != nil {
		var a schema.PlanAnswer
		if err := schema.Unmarshal(m.Data, &a); err != nil {
			return "", fail.Permanentf("%s sequence %d: %w", m.Subject, m.Seq, err)
		}
		if a.Turn == d.Turn {
			return "answer", s.handleAnswer(ctx, info, &a)
		}
	}
	if m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanError(n, e)); err != nil {
		return "", err
	} else if m != nil {
		var pe schema.PlanError
		if err := schema.Unmarshal(m.Data, &pe); err != nil {
			return "", fail.Permanentf("%s sequence %d: %w", m.Subject, m.Seq, err)
		}
		if pe.Turn == d.Turn {
			return "parse-error", s.handleParseError(ctx, info, &pe)
		}
	}
	return "", nil
}

// askAgain publishes the episode's last plan request again.
func (s *Service) askAgain(ctx context.Context, n int64, e int, tag string) error {
	req, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(n, e))
	if err != nil || req == nil {
		return err
	}
	return s.Bus.Republish(ctx, req, tag)
}

// driveRun moves the turn of the plan d on: a finished turn publishes its
// next step again; otherwise the plan is published again, naming the turn's
// runner, and the replica that handles the copy takes the turn over from
// what is recorded (its outcomes, the acts released without one).
func (s *Service) driveRun(ctx context.Context, info *session.Info, last *bus.StoredMsg, d *schema.PlanDAG, tag string) error {
	r, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(d.Rollout, d.Episode, d.Turn))
	if err != nil {
		return err
	}
	if found && r.Finished {
		return s.publishOutcome(ctx, info, &r)
	}
	var extra []string
	if found {
		extra = []string{HdrTakeover, strconv.FormatUint(r.Runner, 10)}
	}
	return s.Bus.Republish(ctx, last, tag, extra...)
}

// stallFor is how long an episode of a rollout with cfg, whose last plan
// message is last, may go without progress: the watchdog's setting, or
// longer while it waits for acts or a planner turn that may legitimately
// take longer with their time-outs and retries. (Driving on work that is
// in fact still running costs a second generation, never a second sample.)
func (s *Service) stallFor(cfg schema.Config, last *bus.StoredMsg) time.Duration {
	cfg = cfg.WithDefaults()
	verb := ""
	if last != nil {
		if p, err := subject.Parse(last.Subject); err == nil {
			verb = p.Verb
		}
	}
	switch verb {
	case "req", "partial", "out":
		return max(s.Stall, schema.Seconds(cfg.PlannerTimeoutS)+s.PlannerSlack)
	case "dag":
		var d struct {
			Partial bool `json:"partial"`
		}
		if schema.Unmarshal(last.Data, &d) == nil && d.Partial {
			// The planner may still be writing the turn: a partial plan is
			// published only when a node is complete, and the rest of the
			// turn may take the planner's whole time-out, while the acts
			// released run.
			return max(s.Stall, s.actBudget(cfg), schema.Seconds(cfg.PlannerTimeoutS)+s.PlannerSlack)
		}
		return max(s.Stall, s.actBudget(cfg))
	case "answer", "error":
		if cfg.StreamPlans {
			// The episode's end may wait for the acts of the turn's
			// partial run, abandoned, until its deadline (abandon.go).
			return max(s.Stall, s.abandonedFor(cfg))
		}
	}
	return s.Stall
}

// heldSince says whether a role is paused now, and else when the last
// pause of either role ended, as this replica saw it: the work of an
// episode waits for one role or the other, and a wait for a resume is no
// stall.
func (s *Service) heldSince() (bool, time.Time) {
	var since time.Time
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		paused, ended := s.follow.Gate(role).Held()
		if paused {
			return true, time.Time{}
		}
		since = later(since, ended)
	}
	return false, since
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

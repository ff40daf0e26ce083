package actdispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
)

// A streamed turn's run is created from a partial plan, and its acts start
// while the planner still writes. When the turn's final output turns out
// not a plan (an answer, a parse error), no final plan completes the run:
// it is abandoned. Its acts already released may be generating, and each
// generation is a sample, so the abandonment is recorded in the run
// (schema.Run.Abandoned), before anything acts on it, by whoever sees the
// final output first: its handler, the turn's runner, or the episode's
// end. From then on:
//
//   - nothing is merged into the run or released from it: the write that
//     records it is a compare-and-set, so a runner's release written
//     before it is seen by it, and one after it fails and reads it;
//   - the turn's runner lets the acts it started run to their end, and
//     stops them at the recorded deadline; the nodes it released itself
//     after the final output (the run was created late) never started,
//     and are recorded skipped;
//   - the turn's plan message, delivered again (its runner stopped), takes
//     up the acts without an outcome until the deadline, attached to
//     their generations on the gateways where those still run;
//   - the episode's end waits until every act released has an outcome,
//     and records the outcome of one still without one at the deadline
//     as failed (timeout), so that it lists every act released; a
//     redelivery or the watchdog doing it again waits for, or finds, the
//     same outcomes (an act has one).
//
// The deadline is an act's whole budget plus the plan consumer's ack wait
// (within which a runner that stopped is replaced) from the abandonment.

// abandonedFor is how long the acts of a turn abandoned now may still run.
func (s *Service) abandonedFor(cfg schema.Config) time.Duration {
	return s.actBudget(cfg) + s.RunAckWait
}

// abandon records on the run of turn of episode e of rollout n, if it has
// one that no final plan completed, that the turn's final output was not a
// plan (why), with the deadline of its acts. It returns the run as it is
// now, its revision, and whether there is one.
func (s *Service) abandon(ctx context.Context, cfg schema.Config, n int64, e, turn int, why string) (schema.Run, uint64, bool, error) {
	var found bool
	r, rev, wrote, err := bus.MutateRev(ctx, s.Bus.Runs, schema.RunKey(n, e, turn), func(r *schema.Run, exists bool) (bool, error) {
		found = exists
		if !exists || r.Finished || r.Complete || r.Abandoned != nil {
			return false, nil
		}
		now := time.Now()
		r.Abandoned = &schema.Abandonment{AtMs: now.UnixMilli(), UntilMs: now.Add(s.abandonedFor(cfg)).UnixMilli(), Why: why}
		return true, nil
	})
	if wrote {
		zerolog.Ctx(ctx).Info().Str("run", schema.RunKey(n, e, turn)).Str("why", why).Msg("the turn's partial run is abandoned: nothing more is released, its acts run to their end")
	}
	return r, rev, found, err
}

// abandonTurn records turn's run abandoned (why) in a rollout whose
// plans are streamed: only those have runs no final plan completes.
func (s *Service) abandonTurn(ctx context.Context, info *session.Info, n int64, e, turn int, why string) error {
	if !info.Session.Config.StreamPlans {
		return nil
	}
	_, _, _, err := s.abandon(ctx, info.Session.Config, n, e, turn, why)
	return err
}

// errRolloutEnded: the rollout ended while its episode's end waited for
// acts; there is nothing to end any more.
var errRolloutEnded = errors.New("the rollout ended")

// awaitAbandoned waits until every act that the abandoned runs released
// has an outcome, and returns the outcomes of their nodes, by key. An act
// without one when its run's deadline has passed is recorded failed (a
// time-out) then: its runner, if it still runs, stops at that deadline
// too, and an outcome published after this one is refused (an act has
// one). A node released to take the result of an act of its run that
// makes the same call gets its outcome from that act's (resolveWaiter).
// It returns errRolloutEnded if the rollout ends meanwhile; and does not
// wait for the watchdog (withoutWaiting), whose sweep goes on.
func (s *Service) awaitAbandoned(ctx context.Context, n int64, e int, runs []*schema.Run) (map[string]*schema.ActDone, error) {
	if len(runs) == 0 {
		return nil, nil
	}
	ctx, stop := s.follow.Rollout(ctx, n)
	defer stop()
	var sub *nats.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}()
	wake := make(chan struct{}, 1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if context.Cause(ctx) == session.ErrRolloutOver {
			return nil, errRolloutEnded
		}
		out := map[string]*schema.ActDone{}
		waiting, until := 0, time.Time{}
		for _, r := range runs {
			got, err := s.published(ctx, r)
			if err != nil {
				return nil, err
			}
			deadline := time.UnixMilli(r.Abandoned.UntilMs)
			for _, node := range r.Nodes {
				d := got[node.Key]
				if d == nil && node.Status == schema.NodeReleased && node.CachedFrom == "" {
					if time.Now().Before(deadline) {
						waiting++
						if until.IsZero() || deadline.Before(until) {
							until = deadline
						}
						continue
					}
					if d, err = s.recordUnfinished(ctx, r, node); err != nil {
						return nil, err
					}
				}
				if d != nil {
					out[node.Key] = d
				}
			}
			// A node that waits for the result of an act of the run making
			// the same call gets its outcome once that act has one, as the
			// runner would have given it: nobody else gives it one.
			for _, node := range r.Nodes {
				if node.Status != schema.NodeReleased || node.CachedFrom == "" || out[node.Key] != nil {
					continue
				}
				if first := out[node.CachedFrom]; first != nil {
					if out[node.Key], err = s.resolveWaiter(ctx, r, node, first); err != nil {
						return nil, err
					}
				}
				// else it waits with its act (counted above)
			}
		}
		if waiting == 0 {
			return out, nil
		}
		if !mayWait(ctx) {
			return nil, fail.Transientf("the episode's end waits for %d acts of its abandoned turns, until %s at the latest", waiting, until.UTC().Format(time.RFC3339))
		}
		if sub == nil {
			// Followed before the next read: an outcome published between
			// the last read and the subscription is found by that read.
			var err error
			sub, err = s.Bus.NC.Subscribe(subject.ActDones(n, e), func(*nats.Msg) {
				select {
				case wake <- struct{}{}:
				default:
				}
			})
			if err != nil {
				return nil, fail.Transientf("follow %s: %w", subject.ActDones(n, e), err)
			}
			zerolog.Ctx(ctx).Info().Int("acts", waiting).Time("until", until).Msg("the episode's end waits for the acts of its abandoned turns")
			continue
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-ctx.Done():
			if context.Cause(ctx) == session.ErrRolloutOver {
				return nil, errRolloutEnded
			}
			return nil, context.Cause(ctx)
		}
	}
}

// recordUnfinished records the outcome of node, released by the abandoned
// run r and without an outcome at its deadline: failed, a time-out. It
// returns the outcome the stream holds (another's, if one came first).
func (s *Service) recordUnfinished(ctx context.Context, r *schema.Run, node *schema.NodeState) (*schema.ActDone, error) {
	d := &schema.ActDone{
		Rollout: r.Rollout, Episode: r.Episode, Turn: r.Turn, Key: node.Key, NodeID: node.Node.ID, Tool: node.Node.Tool,
		Input: node.Input, Status: schema.ActFailed, ErrorKind: schema.ActErrTimeout,
		Error: fmt.Sprintf("no outcome by %s, the deadline of its abandoned turn (%s)",
			time.UnixMilli(r.Abandoned.UntilMs).UTC().Format(time.RFC3339), r.Abandoned.Why),
		ReleasedMs: node.ReleasedMs, EndedMs: nowMs(), Replica: s.replica(),
	}
	// With the retries recorded of it: its runner's generations may have
	// reached an engine.
	stored, err := publishActOutcome(ctx, s.Bus, d)
	if err != nil {
		return nil, fmt.Errorf("outcome of unfinished act %s: %w", node.Key, err)
	}
	if stored {
		zerolog.Ctx(ctx).Warn().Str("node", node.Key).Msg("an act of an abandoned turn has no outcome at the turn's deadline; recorded failed")
		return d, nil
	}
	got, err := s.outcome(ctx, r.Rollout, r.Episode, node.Key)
	if err == nil && got == nil {
		err = fail.Transientf("act %s: the outcome the stream refused as a second one is not there", node.Key)
	}
	return got, err
}

// resolveWaiter publishes (once) the outcome of node, released in the
// abandoned run r to take the result of the act first of the same call:
// cached with its output, or failed with it, as the runner's apply and
// publishCached would have; it returns the outcome published.
func (s *Service) resolveWaiter(ctx context.Context, r *schema.Run, node *schema.NodeState, first *schema.ActDone) (*schema.ActDone, error) {
	n := *node
	if first.Status == schema.ActDoneOK {
		n.Status, n.Output = schema.NodeCached, first.Output
	} else {
		n.Status, n.Error = schema.NodeFailed, "duplicate of "+node.CachedFrom+", which failed: "+first.Error
	}
	t := &runner{s: s, run: schema.Run{Rollout: r.Rollout, Episode: r.Episode, Turn: r.Turn, Nodes: []*schema.NodeState{&n}},
		known: map[string]*schema.ActDone{}}
	if err := t.publishCached(ctx); err != nil {
		return nil, err
	}
	return t.known[n.Key], nil
}

// waitKey marks a context whose work must not wait for acts (mayWait).
type waitKey struct{}

// withoutWaiting is ctx for work that must not wait for the acts of
// abandoned turns: the watchdog's, whose sweep goes on to other episodes
// (it tries again at its next sweep).
func withoutWaiting(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitKey{}, true)
}

func mayWait(ctx context.Context) bool {
	no, _ := ctx.Value(waitKey{}).(bool)
	return !no
}

// errAbandonedDeadline cuts the acts of an abandoned turn still running at
// its deadline.
var errAbandonedDeadline = errors.New("the deadline of the abandoned turn passed")

// abandonedNow reports whether the runner's turn is abandoned: recorded
// so, or found so now (its run incomplete, and the turn's final output an
// answer or a parse error), which it records first.
func (t *runner) abandonedNow(ctx context.Context) (bool, error) {
	if t.run.Abandoned != nil {
		return true, nil
	}
	if t.run.Complete || t.run.Finished {
		return false, nil
	}
	over, err := t.s.superseded(ctx, t.run.Rollout, t.run.Episode, t.run.Turn)
	if err != nil || !over {
		return false, err
	}
	r, rev, found, err := t.s.abandon(ctx, t.info.Session.Config, t.run.Rollout, t.run.Episode, t.run.Turn, "the turn's final output is not a plan")
	if err != nil {
		return false, err
	}
	if !found {
		return false, fail.Permanentf("run %s is gone (its rollout ended)", t.key)
	}
	// Read anew: a run finished or completed meanwhile goes on as such.
	t.run, t.rev = r, rev
	return r.Abandoned != nil, nil
}

// finishAbandoned runs what is left of an abandoned turn (t.run.Abandoned
// is set): nothing is released any more; the nodes newly released by this
// handler, which never started, are recorded skipped; those released
// before without an outcome that this runner does not run (a runner that
// stopped released them: they may be generating) are run again, attached
// to their generations where those still run; and every act runs to its
// end, until the turn's deadline at the latest.
func (t *runner) finishAbandoned(ctx context.Context, newly []*schema.NodeState) error {
	t.closeOffers() // no plan is merged any more
	ab := t.run.Abandoned
	until := time.UnixMilli(ab.UntilMs)
	if err := t.publishCached(ctx); err != nil {
		return err
	}
	fresh := map[string]bool{}
	for _, n := range newly {
		fresh[n.Key] = true
		if err := t.skip(ctx, n, "not run: "+ab.Why); err != nil {
			return err
		}
	}
	var again []*schema.NodeState
	for _, n := range t.run.Nodes {
		if !time.Now().Before(until) {
			break // past the deadline: the episode's end records them
		}
		if n.Status != schema.NodeReleased || n.CachedFrom != "" || fresh[n.Key] || t.mine[n.Key] || t.known[n.Key] != nil {
			continue
		}
		d, err := t.s.outcome(ctx, t.run.Rollout, t.run.Episode, n.Key)
		if err != nil {
			return err
		}
		if d == nil {
			again = append(again, n)
		}
	}
	if len(again) > 0 {
		t.log.Info().Int("acts", len(again)).Time("until", until).Msg("taking the abandoned turn up: acts released without an outcome run again until its deadline")
	}
	// Their requests tell the gateways the deadline; the acts this runner
	// started before are cut there.
	actx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	t.start(actx, again, "released by an earlier runner of the turn, which is gone: it may have generated it too")
	cut := time.AfterFunc(time.Until(until), func() { t.cut(errAbandonedDeadline) })
	defer cut.Stop()
	t.acts.Wait()
	if err := t.halted(); err != nil && !errors.Is(err, errHandedOver) {
		return err // an outcome not published: the turn is handed back
	}
	// Acts cut by anything but the deadline (the replica stops, the
	// rollout ends) may have no outcome: the turn is handed back, so that
	// the plan message, delivered again, takes them up (runTurn drops the
	// error of a rollout that ended).
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), errAbandonedDeadline) {
		return context.Cause(ctx)
	}
	return nil
}

// skip records that node n, released, was not run (why).
func (t *runner) skip(ctx context.Context, n *schema.NodeState, why string) error {
	now := nowMs()
	d := &schema.ActDone{
		Rollout: t.run.Rollout, Episode: t.run.Episode, Turn: t.run.Turn, Key: n.Key, NodeID: n.Node.ID, Tool: n.Node.Tool,
		Input: n.Input, Status: schema.ActSkip, Error: why, ReleasedMs: n.ReleasedMs, EndedMs: now, Replica: t.s.replica(),
	}
	if _, err := t.s.Bus.PublishOnce(ctx, d); err != nil {
		return fmt.Errorf("outcome of skipped node %s: %w", n.Key, err)
	}
	t.known[n.Key] = d
	return nil
}

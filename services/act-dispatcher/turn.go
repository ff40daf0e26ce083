package actdispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// A turn is run by one replica, its runner: the handler of the plan message
// that created the turn's run state keeps that message in progress until the
// turn is over. The runner holds the run in memory, executes the acts it
// releases, and writes the run state only when a decision must be recorded
// before it is acted on: the nodes it releases (before they run) and the end
// of the turn (before the next planner turn is asked for). An act's outcome
// is recorded by its act.N.done.E.K message, one per act ever. Acts of one
// turn that finish together therefore never race on the run state, and a
// wide turn costs two writes, not one per act.
//
// If the runner's replica stops, JetStream hands its plan message to another
// replica, whose handler finds the message's sequence in the run (Runner)
// and takes the turn over from what is recorded: the outcomes published,
// the nodes released without one (run again: the stream keeps the first
// outcome of an act run twice), the nodes answered from the cache (their
// outcomes published again, stored only where none is). Delivered again
// to the replica whose runner holds it, the message waits for that runner
// instead, so that one delivery owns the turn. A plan message of the same
// turn handled elsewhere (a streamed plan grows on several replicas) is
// merged into the run by compare-and-set, and the runner, which follows
// the turn's plan subject while its plan is incomplete (and reads the run
// again once it follows), merges it too; one handled on the runner's own
// replica is handed to the runner, and acknowledged once the run records
// it (or, the runner stopping first, merged by its handler).
// Every write is a compare-and-set of the runner's view: a runner that
// loses one (another runner took over, a plan was merged) reads the run
// again and decides anew.

// act is one node to execute.
type act struct {
	Rollout    int64
	Episode    int
	Turn       int
	Key        string
	Node       plan.Node
	ReleasedMs int64

	try     int            // the generation asked of the actor-gateways now (actor.go)
	taken   bool           // a gateway took that try: the next is a new one
	retries []schema.Retry // generations sent again beyond its attempts
	aborted string         // the gateway whose run of the last try a pause aborted
	// rerun says why another runner may have generated it already: a
	// retry outstanding until a gateway starts a generation of one of its
	// tries (the tries answered from what a gateway kept of them, or
	// attached to a generation running, are the other runner's).
	rerun string
	// resend is the retry outstanding when the last exchange ended with no
	// generation answering it (no gateway at all, a refusal, an error, its
	// deadline): the copies sent before may have reached one that went, so
	// a generation its next exchange starts is that retry.
	resend       *schema.Retry
	resendReason string
}

// runner runs one turn.
type runner struct {
	s     *Service
	info  *session.Info
	key   string
	seq   uint64 // the plan message that owns the turn
	prior map[string]priorAct
	log   *zerolog.Logger

	run schema.Run // as this runner last read or wrote it, with the outcomes it knows applied
	rev uint64

	known    map[string]*schema.ActDone // outcomes, by node key (those published of cached nodes too)
	mine     map[string]bool            // nodes this runner executes (or executed)
	awaiting time.Time                  // since when it waits for outcomes of nodes it does not run

	mu    sync.Mutex
	inbox []*schema.ActDone
	// heard are the nodes whose outcome was heard published on the turn's
	// subjects (follow): the outcome the stream holds is read, not the one
	// heard, which may be a second outcome the stream refused.
	heard []string
	dag   *schema.PlanDAG // the newest plan handed over, not merged yet
	// offered are the handlers of the plans handed over that wait until
	// the run records them (true), or the runner stops first (false);
	// taken, those of the plans a step took and has not recorded yet (the
	// runner's own).
	offered []chan bool
	taken   []chan bool
	wake    chan struct{}
	closed  bool
	// halt, once set, ends the runner: an act whose outcome could not be
	// published (the turn is handed back, to be run again from what is
	// recorded), or errHandedOver (the watchdog gave the turn to another
	// handler of this replica).
	halt error

	acts  sync.WaitGroup
	ended chan struct{} // closed once the turn's handler no longer runs it
	// cut ends the context the turn's acts run in (runTurn's): the acts of
	// an abandoned turn still running at its deadline (finishAbandoned).
	cut context.CancelCauseFunc
}

// runners are the turns this replica runs, by run key.
type runners struct {
	mu sync.Mutex
	m  map[string]*runner
}

func (rs *runners) get(key string) *runner {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.m[key]
}

// claim makes r the runner of the turn key on this replica, unless a
// runner of the same plan message runs it here already: that one is
// returned, and r is not put.
func (rs *runners) claim(key string, r *runner) (busy *runner) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if cur := rs.m[key]; cur != nil && cur.seq == r.seq {
		return cur
	}
	rs.m[key] = r
	return nil
}

func (rs *runners) remove(key string, r *runner) {
	rs.mu.Lock()
	if rs.m[key] == r {
		delete(rs.m, key)
	}
	rs.mu.Unlock()
}

// wait returns once the runner's handler has ended, or ctx has.
func (r *runner) wait(ctx context.Context) error {
	select {
	case <-r.ended:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// offer hands a plan of the turn to the runner; false when it has stopped
// taking them (the turn is over or its runner stopping). recorded, if not
// nil, is told once whether the run records the plan (or a newer one
// handed over with it), or the runner stopped first.
func (r *runner) offer(d *schema.PlanDAG, recorded chan bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.dag == nil || newer(d, r.dag) {
		r.dag = d
	}
	if recorded != nil {
		r.offered = append(r.offered, recorded)
	}
	r.notify()
	return true
}

// recorded tells the handlers of the plans the last step took that the run
// records them.
func (r *runner) recorded() {
	for _, c := range r.taken {
		c <- true
	}
	r.taken = nil
}

// closeOffers stops the runner taking plans, and tells the handlers of
// those it took and did not record that it did not: each then merges its
// plan into the run itself.
func (r *runner) closeOffers() {
	r.mu.Lock()
	r.closed = true
	waiting := append(r.taken, r.offered...)
	r.offered, r.taken = nil, nil
	r.mu.Unlock()
	for _, c := range waiting {
		c <- false
	}
}

// newer reports whether plan a supersedes plan b of the same turn.
func newer(a, b *schema.PlanDAG) bool {
	if a.Partial != b.Partial {
		return !a.Partial
	}
	return a.Seq > b.Seq
}

func (r *runner) deliver(d *schema.ActDone) {
	r.mu.Lock()
	r.inbox = append(r.inbox, d)
	r.notify()
	r.mu.Unlock()
}

// stop ends the runner with err at its next step (the first err counts).
func (r *runner) stop(err error) {
	r.mu.Lock()
	if r.halt == nil {
		r.halt = err
	}
	r.notify()
	r.mu.Unlock()
}

func (r *runner) halted() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.halt
}

func (r *runner) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// hear tells the runner that an outcome of node key was published by
// another replica.
func (r *runner) hear(key string) {
	r.mu.Lock()
	r.heard = append(r.heard, key)
	r.notify()
	r.mu.Unlock()
}

// take returns what arrived since the last call; the handlers of the plan
// wait until the step that took it records it (recorded).
func (r *runner) take() ([]*schema.ActDone, []string, *schema.PlanDAG) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, heard, d := r.inbox, r.heard, r.dag
	r.inbox, r.heard, r.dag = nil, nil, nil
	r.taken = append(r.taken, r.offered...)
	r.offered = nil
	return in, heard, d
}

// oldPlan is how old a plan message may be before its rollout's state is
// read again from the leader (overSince): the session cache may be up to
// a second old.
const oldPlan = time.Second

// overSince says whether the rollout of info, which the session cache
// shows running, has ended since (or is another rollout of its number), on
// a read from the leader. A plan message stored a while ago (delivered
// again after its ack was lost in a NATS restart) may be for a turn that
// ran, whose rollout then ended and had its run states removed: run
// again, its acts would call an engine a second time (make chaos found
// one), while the cached session still showed the rollout running.
func (s *Service) overSince(ctx context.Context, info *session.Info) (bool, error) {
	over, state, err := s.rolloutOver(ctx, info)
	if err != nil || !over {
		return false, err
	}
	zerolog.Ctx(ctx).Info().Str("state", state).Msg("an old plan message of a rollout that is over since; dropped")
	return true, nil
}

// rolloutOver says whether the rollout of info is over, on a read from the
// leader: its session is not running, is gone, or is another rollout's of
// the number (created at another time). state is the session's state as
// read ("" when it is gone). A cached session decides no skip: it may be
// up to a second old, and the rollout of its number another.
func (s *Service) rolloutOver(ctx context.Context, info *session.Info) (over bool, state string, err error) {
	sess, _, found, err := bus.GetFresh[schema.Session](ctx, s.Bus.Sessions, schema.SessionKey(info.Session.Rollout))
	if err != nil {
		return false, "", err
	}
	return !found || sess.State != schema.SessionRunning || sess.CreatedMs != info.Session.CreatedMs, sess.State, nil
}

// handleDAG takes a plan of a turn: it hands it to this replica's runner of
// the turn, or creates the run and runs the turn, or takes over a turn whose
// runner was this very message (redelivered: the replica that ran it
// stopped) or one the watchdog hands over, or merges the plan into a turn
// another replica runs.
func (s *Service) handleDAG(ctx context.Context, info *session.Info, m bus.Msg, d *schema.PlanDAG) error {
	key := schema.RunKey(d.Rollout, d.Episode, d.Turn)
	takeover, handed := parseSeq(m.Header.Get(HdrTakeover))
	if d.Partial {
		over, err := s.finalOut(ctx, d)
		if err != nil {
			return err
		}
		if over {
			// The final output decides the turn from here: a late partial
			// starts nothing. But the partial that created the run runs
			// it, final plan merged or not, or the turn abandoned (its
			// final output not a plan: the acts released run to their
			// end): dropped, it would leave the turn to no one when its
			// replica stopped.
			if owns, err := s.ownsTurn(ctx, key, m.Seq, handed, takeover); err != nil || !owns {
				return err
			}
		}
	}
	for {
		t := s.runners.get(key)
		if t == nil {
			break
		}
		if handed {
			if t.seq == takeover {
				// The watchdog hands over the turn this replica's runner
				// holds without progress: that runner stops, and this
				// handler runs the turn from what is recorded.
				t.stop(errHandedOver)
			}
			break
		}
		if t.seq != m.Seq {
			// The runner merges the plan at its next step. The message is
			// acknowledged once the run records it: a runner that stops
			// first (an outcome not published, the replica stopping)
			// leaves it to this handler, which merges it below. Before,
			// it was acknowledged as soon as the runner took it, and a
			// final plan lost with the runner left the turn incomplete for
			// good when a partial was the stream's last plan.
			recorded := make(chan bool, 1)
			if !t.offer(d, recorded) {
				break
			}
			select {
			case ok := <-recorded:
				if ok {
					return nil
				}
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			break
		}
		// The runner's own message, delivered again (its progress
		// signals were lost: a NATS restart). Acknowledged, it would end
		// the claim of the delivery that runs the turn, and nothing would
		// be delivered again if this replica died; it stays in progress
		// until the runner ends, then goes on from what is recorded (the
		// turn handed back is run here, a finished one published again).
		zerolog.Ctx(ctx).Info().Msg("the plan message of the turn running here came again; it waits for the runner")
		if err := t.wait(ctx); err != nil {
			return err
		}
		if errors.Is(t.halted(), errHandedOver) {
			return nil // the watchdog gave the turn to another message
		}
	}
	// The watchdog's copy (handed) is no exception: delivered again after
	// its ack was lost, it is as old as any other plan message.
	if s.runners.get(key) == nil && s.clock().Sub(m.Time) > oldPlan {
		if over, err := s.overSince(ctx, info); err != nil || over {
			return err
		}
	}
	prior, err := s.priorActs(ctx, info, d.Episode, d.Turn)
	if err != nil {
		return err
	}
	cfg := info.Session.Config
	var mine, finished bool
	var conflicts []string
	var newly, cached []*schema.NodeState
	// A turn's first plan finds no state yet: written without a read first
	// when this replica runs nothing of it (the guess is checked by the
	// write, which only creates).
	mutate := bus.MutateRev[schema.Run]
	if s.runners.get(key) == nil && !handed {
		mutate = bus.MutateNew[schema.Run]
	}
	gone := false
	run, rev, _, err := mutate(ctx, s.Bus.Runs, key, func(r *schema.Run, exists bool) (bool, error) {
		mine, finished, gone, conflicts, newly, cached = false, false, false, nil, nil, nil
		if !exists && handed {
			// The watchdog hands over a run it read: gone since, its
			// rollout ended (run states are removed then), though the
			// session cache may show it running for a second more.
			// Created afresh, its acts would run again, an engine called
			// twice for an act with no retry recorded. A turn left to no
			// one is driven on by the watchdog's next look, with no copy
			// handed over.
			gone = true
			return false, nil
		}
		if exists && r.Finished {
			finished = true
			return false, nil
		}
		var changed bool
		if !exists || r.Abandoned == nil { // nothing is merged into an abandoned run
			changed, conflicts = applyPlan(r, exists, d, cfg.Schedule, cfg.FailurePolicy)
		}
		switch {
		case !exists:
			r.Runner, mine = m.Seq, true
		case r.Runner == m.Seq:
			mine = true // this message runs the turn: its replica stopped
		case handed && r.Runner == takeover:
			r.Runner, mine, changed = m.Seq, true, true // handed over by the watchdog
		}
		if !mine {
			return changed, nil
		}
		newly, cached = advance(r, prior)
		stamp(newly, cached)
		return changed || len(newly) > 0 || len(cached) > 0, nil
	})
	if err != nil {
		return err
	}
	log := zerolog.Ctx(ctx)
	if gone {
		log.Info().Uint64("takeover", takeover).Msg("a plan handed over by the watchdog whose run is gone (its rollout ended); dropped")
		return nil
	}
	if len(conflicts) > 0 {
		log.Warn().Strs("nodes", conflicts).Msg("the final plan differs from nodes already released from a partial plan; kept them as released")
	}
	if finished {
		// Over, and perhaps its next step lost in a crash: published again
		// (message ids make it idempotent).
		return s.publishOutcome(ctx, info, &run)
	}
	if !mine {
		log.Debug().Bool("partial", d.Partial).Msg("plan merged into the turn another replica runs")
		return nil
	}
	t := &runner{
		s: s, info: info, key: key, seq: m.Seq, prior: prior, log: log, run: run, rev: rev,
		known: map[string]*schema.ActDone{}, mine: map[string]bool{}, wake: make(chan struct{}, 1), ended: make(chan struct{}),
	}
	if busy := s.runners.claim(key, t); busy != nil {
		// Another delivery of this message took the turn up here
		// meanwhile: one runs it, this one waits and goes on from what
		// that one recorded.
		if err := busy.wait(ctx); err != nil {
			return err
		}
		return s.handleDAG(ctx, info, m, d)
	}
	defer func() {
		s.runners.remove(key, t)
		close(t.ended)
	}()
	log.Debug().Bool("partial", d.Partial).Int("nodes", len(run.Nodes)).Int("released", len(newly)).Msg("running the turn")
	return t.runTurn(ctx, newly)
}

// ownsTurn reports whether the plan message seq runs the turn key (its run
// names it the runner) or is handed it by the watchdog (it names the
// runner, takeover), read from the leader: a message dropped on a stale
// read leaves the turn to no one. It owns a run no final plan completed
// too, once the turn's final output was an answer or a parse error: the
// acts the run released, abandoned, still run to their end, and the
// owner takes up those its runner left without an outcome (abandon.go).
func (s *Service) ownsTurn(ctx context.Context, key string, seq uint64, handed bool, takeover uint64) (bool, error) {
	r, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, key)
	if err != nil || !found {
		return false, err
	}
	return r.Runner == seq || handed && r.Runner == takeover, nil
}

// stamp records when nodes were released.
func stamp(lists ...[]*schema.NodeState) {
	now := nowMs()
	for _, l := range lists {
		for _, n := range l {
			if n.ReleasedMs == 0 {
				n.ReleasedMs = now
			}
		}
	}
}

// runTurn runs the turn until it is over: newly are the acts the write
// that made this runner released.
func (t *runner) runTurn(ctx context.Context, newly []*schema.NodeState) (err error) {
	n := t.run.Rollout
	// Stopped at once when the rollout ends (cancel, time-out, enough groups).
	ctx, stop := t.s.follow.Rollout(ctx, n)
	defer stop()
	ctx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	t.cut = cut
	defer func() {
		t.closeOffers()
		// Acts still running stop with ctx; their outcomes, if any, are
		// published by them and found by whoever runs the turn next.
		stop()
		t.acts.Wait()
		if err != nil && context.Cause(ctx) == session.ErrRolloutOver {
			err = nil // nothing more to do for a rollout that ended
		}
	}()
	// A turn whose final output was not a plan (found now, or recorded by
	// whoever found it first) releases nothing more; what it released runs
	// to its end, and the nodes just released (the run created after that
	// output) never start.
	if abandoned, err := t.abandonedNow(ctx); err != nil {
		return err
	} else if abandoned {
		return t.finishAbandoned(ctx, newly)
	}
	// Released before this runner came (its replica stopped): their
	// outcomes, or they run again; and the outcomes of the nodes answered
	// from the cache, recorded before they were published (the runner
	// that recorded them may have stopped in between).
	if err := t.recover(ctx, newly); err != nil {
		return err
	}
	if err := t.publishCached(ctx); err != nil {
		return err
	}
	t.start(ctx, newly, "")
	var subs []*nats.Subscription
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		switch err := t.halted(); {
		case errors.Is(err, errHandedOver):
			t.log.Warn().Msg("the watchdog handed the turn over; this runner stops")
			return nil
		case err != nil:
			// Handed back: the plan message is delivered again and its
			// handler runs the turn on from what is recorded, the act
			// whose outcome was lost among those run again.
			return err
		}
		done, err := t.step(ctx)
		if errors.Is(err, errSuperseded) {
			return t.finishAbandoned(ctx, nil)
		}
		if err != nil || done {
			return err
		}
		// Others' work this runner waits for: a plan still growing on
		// other replicas, outcomes of acts it does not run. It follows
		// their subjects (no consumer), and takes over acts whose runner
		// went quiet for longer than they may legitimately take.
		if len(subs) == 0 && (!t.run.Complete || len(t.others()) > 0) {
			if subs, err = t.follow(ctx); err != nil {
				return err
			}
			// What another replica recorded before the subscriptions (a
			// plan its handler merged) reaches none of them: the run is
			// read from the leader once, then check reads what was
			// published. Before, a final plan merged meanwhile was never
			// seen when a partial was the stream's last plan.
			if over, err := t.reread(ctx); errors.Is(err, errSuperseded) {
				return t.finishAbandoned(ctx, nil)
			} else if err != nil || over {
				return err
			}
			if err := t.check(ctx); errors.Is(err, errSuperseded) {
				return t.finishAbandoned(ctx, nil)
			} else if err != nil {
				return err
			}
			continue
		}
		select {
		case <-t.wake:
		case <-tick.C:
			if len(subs) > 0 {
				if err := t.check(ctx); errors.Is(err, errSuperseded) {
					return t.finishAbandoned(ctx, nil)
				} else if err != nil {
					return err
				}
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// step applies what arrived, records the decisions it implies, and starts
// the acts released. It returns true once the turn is over.
func (t *runner) step(ctx context.Context) (bool, error) {
	outcomes, heard, d := t.take()
	for _, o := range outcomes {
		if _, ok := t.known[o.Key]; !ok {
			t.known[o.Key] = o
		}
	}
	for _, key := range heard {
		if t.known[key] != nil {
			continue
		}
		// What was heard may be an outcome the stream refused, the act
		// having run twice: the one it holds counts, read from its leader
		// (none yet: the act's own run, or check, finds it).
		o, err := t.s.outcome(ctx, t.run.Rollout, t.run.Episode, key)
		if err != nil {
			return false, err
		}
		if o != nil {
			t.known[key] = o
		}
	}
	for {
		next := t.run.Clone()
		changed := false
		if d != nil && next.Abandoned == nil {
			changed, _ = applyPlan(&next, true, d, next.Schedule, t.info.Session.Config.FailurePolicy)
		}
		applied := t.apply(&next)
		newly, cached := advance(&next, t.prior)
		stamp(newly, cached)
		finished := next.Complete && allTerminal(&next)
		next.Finished = finished
		if !changed && len(newly) == 0 && len(cached) == 0 && !finished {
			// Nothing to record: outcomes are recorded by their messages,
			// and so are the waiters they resolve (published now); the
			// plan taken, if any, is in the run already.
			if applied {
				t.run = next
			}
			t.recorded()
			return false, t.publishCached(ctx)
		}
		rev, conflict, err := bus.Update(ctx, t.s.Bus.Runs, t.key, &next, t.rev)
		if err != nil {
			return false, err
		}
		if conflict {
			if over, err := t.reread(ctx); err != nil || over {
				return over, err
			}
			continue
		}
		t.run, t.rev = next, rev
		t.recorded()
		if err := t.publishCached(ctx); err != nil {
			return false, err
		}
		t.start(ctx, newly, "")
		if finished {
			t.s.recordTurn(ctx, t.info, t.run.Rollout, t.run.Episode, t.run.Turn, "plan", attribute.Int("planact.nodes", len(t.run.Nodes)))
			return true, t.s.finishTurn(ctx, t.info, &t.run)
		}
		return false, nil
	}
}

// apply gives the nodes of r the outcomes the runner knows, as recording
// them in the run would: waiters on a call get its result (their outcomes
// are then to be published), a failure stops the pending nodes unless the
// policy skips (stopsTurn: a candidate's only once its step has no
// answer). It reports whether it changed r.
func (t *runner) apply(r *schema.Run) (changed bool) {
	policy := t.info.Session.Config.FailurePolicy
	for _, n := range r.Nodes {
		d, ok := t.known[n.Key]
		if !ok || n.Status != schema.NodeReleased || n.CachedFrom != "" {
			continue
		}
		n.Status, n.Output, n.Error, n.ErrorKind = d.Status, d.Output, d.Error, d.ErrorKind
		if d.Status == schema.ActCached {
			n.Status = schema.NodeCached
		}
		resolveWaiters(r, n)
		if after, stop := stopsTurn(r, n); stop && policy != schema.PolicySkip {
			skipPending(r, "not run: the turn stopped after "+after)
		}
		changed = true
	}
	return changed
}

// reread reads the run from the leader after a lost compare-and-set; it
// returns true when this runner is done with the turn: another finished it,
// or took it over (the watchdog handed it on); and errSuperseded when the
// turn was abandoned (abandon.go).
func (t *runner) reread(ctx context.Context) (bool, error) {
	r, rev, found, err := bus.GetFresh[schema.Run](ctx, t.s.Bus.Runs, t.key)
	if err != nil {
		return false, err
	}
	if !found {
		return false, fail.Permanentf("run %s is gone (its rollout ended)", t.key)
	}
	t.run, t.rev = r, rev
	if r.Finished {
		return true, t.s.publishOutcome(ctx, t.info, &r)
	}
	if r.Runner != t.seq {
		t.log.Warn().Uint64("runner", r.Runner).Msg("the turn was taken over; this runner stops")
		return true, nil
	}
	if r.Abandoned != nil {
		return false, errSuperseded
	}
	return false, nil
}

// recover finds, for the nodes released before this runner came (not in
// newly), the outcomes published meanwhile; those without one run again.
func (t *runner) recover(ctx context.Context, newly []*schema.NodeState) error {
	fresh := map[string]bool{}
	for _, n := range newly {
		fresh[n.Key] = true
	}
	var again []*schema.NodeState
	for _, n := range t.run.Nodes {
		if n.Status != schema.NodeReleased || n.CachedFrom != "" || fresh[n.Key] {
			continue
		}
		d, err := t.s.outcome(ctx, t.run.Rollout, t.run.Episode, n.Key)
		if err != nil {
			return err
		}
		if d != nil {
			t.known[n.Key] = d
			continue
		}
		again = append(again, n)
	}
	if len(again) > 0 {
		t.log.Info().Int("acts", len(again)).Msg("taking the turn over: acts released without an outcome run again")
		t.start(ctx, again, "released by an earlier runner of the turn, which is gone: it may have generated it too")
	}
	return nil
}

// others are the released nodes whose outcome the runner waits for but
// does not produce: another runner's.
func (t *runner) others() []*schema.NodeState {
	var out []*schema.NodeState
	for _, n := range t.run.Nodes {
		if n.Status == schema.NodeReleased && n.CachedFrom == "" && !t.mine[n.Key] {
			if _, ok := t.known[n.Key]; !ok {
				out = append(out, n)
			}
		}
	}
	return out
}

// follow subscribes to the turn's plans and its act outcomes, so that what
// other replicas do reaches this runner; the run read again and check then
// find what was recorded and published before the subscriptions.
func (t *runner) follow(ctx context.Context) ([]*nats.Subscription, error) {
	n, e, turn := t.run.Rollout, t.run.Episode, t.run.Turn
	nc := t.s.Bus.NC
	var subs []*nats.Subscription
	// What is heard is a hint, never the only word: a message that cannot
	// be read is logged and decides nothing here, for the stream decides
	// on it. The consumer hands the same plan to a handler, where it is an
	// error, and check, at the next tick, reads the stream's last plan (an
	// error there too) and the outcomes of the acts it waits for
	// (Service.outcome: likewise).
	unreadable := func(m *nats.Msg, err error) {
		t.log.Error().Err(err).Str("subject", m.Subject).Msg("a message heard on the turn's subjects cannot be read; the stream's copy decides")
	}
	onDAG := func(m *nats.Msg) {
		var d schema.PlanDAG
		if err := schema.Unmarshal(m.Data, &d); err != nil {
			unreadable(m, err)
			return
		}
		if d.Turn == turn {
			t.offer(&d, nil)
		}
	}
	// An outcome heard is not taken as it is: a subscriber hears every
	// outcome published, the stream keeps only an act's first (another
	// runner's run of the act may come second, or reach this server
	// first). Those this replica published are its acts' own, each of
	// which hands the runner the outcome the stream keeps (runAct).
	onDone := func(m *nats.Msg) {
		var d schema.ActDone
		if err := schema.Unmarshal(m.Data, &d); err != nil {
			unreadable(m, err)
			return
		}
		if d.Turn == turn && (d.Replica == "" || d.Replica != t.s.replica()) {
			t.hear(d.Key)
		}
	}
	for _, f := range []struct {
		subj string
		cb   nats.MsgHandler
	}{{subject.PlanDAG(n, e), onDAG}, {subject.ActDones(n, e), onDone}} {
		sub, err := nc.Subscribe(f.subj, f.cb)
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return nil, fail.Transientf("follow %s: %w", f.subj, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// check reads what the runner waits for from the streams (in case it was
// published before it followed, or a message was missed): the turn's newest
// plan, the outcomes of others' acts. Acts whose runner stayed quiet for
// longer than an act may take are taken over.
func (t *runner) check(ctx context.Context) error {
	if !t.run.Complete {
		m, err := t.s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanDAG(t.run.Rollout, t.run.Episode))
		if err != nil {
			return err
		}
		if m != nil {
			// One that cannot be read decides nothing: taken for absent,
			// the turn would wait for a plan the stream may hold.
			var d schema.PlanDAG
			if err := schema.Unmarshal(m.Data, &d); err != nil {
				t.log.Error().Err(err).Str("subject", m.Subject).Uint64("seq", m.Seq).Msg("the turn's last plan cannot be read")
				return fail.Permanentf("%s sequence %d: %w", m.Subject, m.Seq, err)
			}
			if d.Turn == t.run.Turn {
				t.offer(&d, nil)
			}
		}
		// The planner's final output may not be a plan at all (it answered,
		// or wrote something the parser refused): then no final plan comes,
		// and the answer or error moves the episode on without this run,
		// abandoned: the acts it released run to their end.
		if abandoned, err := t.abandonedNow(ctx); err != nil || abandoned {
			if abandoned {
				return errSuperseded
			}
			return err
		}
	}
	others := t.others()
	if len(others) == 0 {
		t.awaiting = time.Time{}
		return nil
	}
	if held, since := t.s.heldSince(); held || t.awaiting.IsZero() {
		// Counted from now while a role is paused: the other runner's acts
		// wait for the resume, no sign it is gone.
		t.awaiting = time.Now()
	} else {
		t.awaiting = later(t.awaiting, since)
	}
	var quiet []*schema.NodeState
	for _, n := range others {
		d, err := t.s.outcome(ctx, t.run.Rollout, t.run.Episode, n.Key)
		if err != nil {
			return err
		}
		if d != nil {
			t.deliver(d)
		} else {
			quiet = append(quiet, n)
		}
	}
	if len(quiet) > 0 && time.Since(t.awaiting) > t.s.actBudget(t.info.Session.Config) {
		t.log.Warn().Int("acts", len(quiet)).Msg("acts released by another runner have no outcome after their whole budget; run here")
		t.start(ctx, quiet, "released by another runner of the turn, silent for the act's whole budget: it may have generated it too")
		t.awaiting = time.Time{}
	}
	return nil
}

// errHandedOver ends a runner whose turn the watchdog handed to another
// handler on this replica.
var errHandedOver = errors.New("the turn was handed over")

// errSuperseded stops a runner's work on a turn that was decided by an
// answer or a parse error after its partial plan: it finishes the acts
// released (finishAbandoned).
var errSuperseded = errors.New("the turn's final output is not a plan")

// superseded reports whether the final planner output of turn of episode
// e of rollout n was parsed into an answer or an error instead of a plan.
func (s *Service) superseded(ctx context.Context, n int64, e, turn int) (bool, error) {
	for _, subj := range []string{subject.PlanAnswer(n, e), subject.PlanError(n, e)} {
		m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subj)
		if err != nil || m == nil {
			if err != nil {
				return false, err
			}
			continue
		}
		var v struct {
			Turn int `json:"turn"`
		}
		// One that cannot be read decides nothing: taken for absent, the
		// turn would go on releasing acts though its final output may be
		// an answer.
		if err := schema.Unmarshal(m.Data, &v); err != nil {
			return false, fail.Permanentf("%s sequence %d: %w", m.Subject, m.Seq, err)
		}
		if v.Turn >= turn {
			return true, nil
		}
	}
	return false, nil
}

// publishCached publishes the outcomes of the run's nodes answered from the
// cache (or failed with the call they repeat) that the runner does not know
// published, so that the act stream tells every node's story. The run
// records such a node before its outcome is published, so whoever runs the
// turn next (or finds it finished) publishes again what it cannot know was
// published. Like every act's outcome, each is stored only if its subject
// holds none: publishing again is harmless, however late it comes.
func (t *runner) publishCached(ctx context.Context) error {
	now := nowMs()
	for _, n := range t.run.Nodes {
		if n.CachedFrom == "" || t.known[n.Key] != nil {
			continue
		}
		var status, kind string
		switch n.Status {
		case schema.NodeCached:
			status = schema.ActCached
		case schema.NodeFailed:
			status, kind = schema.ActFailed, schema.ActErrDuplicate
		default:
			continue // waits for the call it repeats
		}
		d := &schema.ActDone{
			Rollout: t.run.Rollout, Episode: t.run.Episode, Turn: t.run.Turn, Key: n.Key, NodeID: n.Node.ID, Tool: n.Node.Tool,
			Input: n.Input, Status: status, Output: n.Output, Error: n.Error, ErrorKind: kind,
			ReleasedMs: n.ReleasedMs, StartedMs: now, EndedMs: now, Replica: t.s.replica(),
		}
		if _, err := t.s.Bus.PublishOnce(ctx, d); err != nil {
			return fmt.Errorf("outcome of cached node %s: %w", n.Key, err)
		}
		t.known[n.Key] = d
	}
	return nil
}

// start executes nodes, each on its own goroutine within the replica's
// bound on acts in flight; each outcome is published (the first of an act
// run twice wins) and handed to the runner.
// rerun, when the nodes were released by another runner, says so: an act's
// generation that does not attach to one already on a gateway is then a
// retry, recorded in its outcome.
func (t *runner) start(ctx context.Context, nodes []*schema.NodeState, rerun string) {
	for _, n := range nodes {
		t.mine[n.Key] = true
		a := &act{Rollout: t.run.Rollout, Episode: t.run.Episode, Turn: t.run.Turn, Key: n.Key, Node: n.Node, ReleasedMs: n.ReleasedMs, rerun: rerun}
		t.acts.Add(1)
		go func() {
			defer t.acts.Done()
			d, err := t.s.runAct(ctx, t.info, a)
			if err != nil {
				if ctx.Err() == nil {
					t.log.Warn().Err(err).Str("node", a.Key).Msg("act outcome could not be published; the turn is handed back and the act run again")
					t.stop(fail.Transientf("act %s: outcome not published: %w", a.Key, err))
				}
				return
			}
			if d != nil {
				t.deliver(d)
			}
		}()
	}
}

// publishOutcome publishes an act's outcome once, with the retries the
// gateways recorded of it (publishActOutcome; a variable, so that a test
// can make it fail as a server that goes away does).
var publishOutcome = publishActOutcome

// runAct executes an act within the replica's bound on acts in flight and
// publishes its outcome; it returns the outcome the stream holds (another
// run's, when the act ran twice), or nil when the act was abandoned (its
// rollout ended, the replica stops).
func (s *Service) runAct(ctx context.Context, info *session.Info, a *act) (*schema.ActDone, error) {
	slots := s.slotsFor(info, a)
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil
	}
	inFlight := telemetry.ActsInFlight.WithLabelValues(s.replicaName())
	inFlight.Inc()
	done, err := s.execute(ctx, info, a)
	inFlight.Dec()
	<-slots
	if err != nil || done == nil {
		return nil, err
	}
	stored, err := publishOutcome(ctx, s.Bus, done)
	if err != nil {
		return nil, err
	}
	if !stored {
		zerolog.Ctx(ctx).Info().Str("node", a.Key).Msg("the act already has an outcome (run twice); the first counts")
		if done, err = s.outcome(ctx, a.Rollout, a.Episode, a.Key); err != nil || done == nil {
			return nil, fail.Transientf("act %s: the outcome the stream refused as a second one is not there (%v)", a.Key, err)
		}
	}
	return done, nil
}

package actdispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/session"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// handlePlan reacts to what the plan-parser made of a planner turn.
func (s *Service) handlePlan(ctx context.Context, m bus.Msg) error {
	p, err := subject.Parse(m.Subject)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	s.moved.note(p.Rollout, p.Episode, m.Time)
	switch p.Verb {
	case "dag":
		var d schema.PlanDAG
		if err := m.Decode(&d); err != nil {
			return err
		}
		info, ctx, err := s.info(ctx, d.Rollout)
		if err != nil || info == nil {
			return err
		}
		return s.handleDAG(ctx, info, m, &d)
	case "answer":
		var a schema.PlanAnswer
		if err := m.Decode(&a); err != nil {
			return err
		}
		info, ctx, err := s.info(ctx, a.Rollout)
		if err != nil || info == nil {
			return err
		}
		s.recordTurn(ctx, info, a.Rollout, a.Episode, a.Turn, "answer")
		return s.handleAnswer(ctx, info, &a)
	case "error":
		var pe schema.PlanError
		if err := m.Decode(&pe); err != nil {
			return err
		}
		info, ctx, err := s.info(ctx, pe.Rollout)
		if err != nil || info == nil {
			return err
		}
		s.recordTurn(ctx, info, pe.Rollout, pe.Episode, pe.Turn, "error", attribute.String("planact.error_kind", pe.ErrorKind))
		return s.handleParseError(ctx, info, &pe)
	}
	return fail.Invalidf("act-dispatcher: unexpected subject %s", m.Subject)
}

// handleAnswer ends the episode the planner answered. A streamed turn's
// partial run is recorded abandoned first (abandon.go).
func (s *Service) handleAnswer(ctx context.Context, info *session.Info, a *schema.PlanAnswer) error {
	if err := s.abandonTurn(ctx, info, a.Rollout, a.Episode, a.Turn, "the turn's final output is an answer"); err != nil {
		return err
	}
	status := schema.EpisodeCompleted
	if a.FinishReason == "length" {
		status = schema.EpisodeTruncated
	}
	return s.endEpisode(ctx, info, a.Rollout, a.Episode, a.Turn, status, a.Answers, "answered")
}

// finalOut reports whether the planner output that ends the turn of the
// partial plan d has been published: from then on the final DAG, answer or
// error decides, and a late partial must not start a run of its own.
func (s *Service) finalOut(ctx context.Context, d *schema.PlanDAG) (bool, error) {
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(d.Rollout, d.Episode))
	if err != nil || m == nil {
		return false, err
	}
	var out schema.PlanOutput
	if err := schema.Unmarshal(m.Data, &out); err != nil {
		return false, err
	}
	return out.Turn >= d.Turn, nil
}

// publishOutcome publishes again what a finished run implies (a crash may
// have come between the write that finished it and its publishes): the
// outcomes answered from the cache (each stored only if none is), and the
// turn's next step (message ids make it idempotent).
func (s *Service) publishOutcome(ctx context.Context, info *session.Info, run *schema.Run) error {
	t := &runner{s: s, run: *run, known: map[string]*schema.ActDone{}}
	if err := t.publishCached(ctx); err != nil {
		return err
	}
	if run.Finished {
		return s.finishTurn(ctx, info, run)
	}
	return nil
}

// handleParseError applies the rollout's parse-error policy. A streamed
// turn's partial run is recorded abandoned first (abandon.go): whatever
// follows, the episode's end or the next turn, nothing more of it runs but
// what it released.
func (s *Service) handleParseError(ctx context.Context, info *session.Info, pe *schema.PlanError) error {
	cfg := info.Session.Config
	reason := pe.ErrorKind + ": " + pe.Message
	if err := s.abandonTurn(ctx, info, pe.Rollout, pe.Episode, pe.Turn, "the turn's final output is a parse error ("+pe.ErrorKind+")"); err != nil {
		return err
	}
	switch {
	case pe.ErrorKind == schema.PlanErrStale:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeAborted, nil, reason)
	case pe.ErrorKind == schema.PlanErrTokenDrift:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeQuarantined, nil, reason)
	case pe.ErrorKind == schema.PlanErrPlannerUnavailable || pe.ErrorKind == schema.PlanErrPlannerRejected:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeFailed, nil, reason)
	case pe.ErrorKind == schema.PlanErrContextFull:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeTruncated, nil, reason)
	case cfg.ParseErrorPolicy == schema.ParseEnd:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeFailed, nil, reason)
	case pe.Turn >= cfg.MaxTurns:
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, schema.EpisodeTruncated, nil, "max_turns after "+reason)
	}
	if status, why, err := s.abandonedEnds(ctx, info, pe, reason); err != nil || status != "" {
		if err != nil {
			return err
		}
		return s.endEpisode(ctx, info, pe.Rollout, pe.Episode, pe.Turn, status, nil, why)
	}
	return s.Bus.Publish(ctx, &schema.PlanRequest{
		Rollout: pe.Rollout, Episode: pe.Episode, Turn: pe.Turn + 1,
		Observation: ErrorObservation(pe.Message), WeightVersion: plannerVersion(info),
	})
}

// abandonedEnds says how the episode of the parse error pe (reason) ends,
// when the partial run of its streamed turn has an act that drifted or was
// refused as stale, as finishTurn ends it when a finished turn has one:
// else "" (the planner is asked for the next turn). Only outcomes already
// published are seen (the turn's acts may still run: the episode's end
// decides on the others'), and the decision stands: once the next turn was
// asked for, a redelivery of pe asks again, rather than end an episode
// whose next turn runs.
func (s *Service) abandonedEnds(ctx context.Context, info *session.Info, pe *schema.PlanError, reason string) (string, string, error) {
	if !info.Session.Config.StreamPlans {
		return "", "", nil
	}
	m, err := s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanReq(pe.Rollout, pe.Episode))
	if err != nil {
		return "", "", err
	}
	if m != nil {
		var req schema.PlanRequest
		if err := schema.Unmarshal(m.Data, &req); err != nil {
			return "", "", fmt.Errorf("%s: %w", m.Subject, err)
		}
		if req.Turn > pe.Turn {
			return "", "", nil
		}
	}
	r, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(pe.Rollout, pe.Episode, pe.Turn))
	if err != nil || !found || r.Finished {
		return "", "", err
	}
	outcomes, err := s.published(ctx, &r)
	if err != nil {
		return "", "", err
	}
	status, why := abandonedVerdict([]*schema.Run{&r}, outcomes, "", reason)
	return status, why, nil
}

// finishTurn decides what follows a turn whose nodes have all finished:
// the next planner turn, or the episode's end. failure_policy acts on the
// steps that failed (stepFailures): an ensemble step whose candidates all
// failed or answered nothing is one, a step some of whose candidates
// answered is not. An act refused as stale or that drifted ends the
// episode, a candidate's too.
func (s *Service) finishTurn(ctx context.Context, info *session.Info, r *schema.Run) error {
	cfg := info.Session.Config
	failed := stepFailures(r)
	stale, drift := "", ""
	for _, n := range r.Nodes {
		if n.Status == schema.NodeFailed {
			if n.ErrorKind == schema.ActErrStale && stale == "" {
				stale = n.Error
			}
			if n.ErrorKind == schema.ActErrTokenDrift && drift == "" {
				drift = fmt.Sprintf("act %s (turn %d): %s", n.Node.ID, r.Turn, n.Error)
			}
		}
	}
	switch {
	case drift != "":
		// An act's engine took another input than its prompt: the episode
		// is never trained on.
		return s.endEpisode(ctx, info, r.Rollout, r.Episode, r.Turn, schema.EpisodeQuarantined, nil, "token_drift: "+drift)
	case stale != "":
		// Weights too old to start work with: the episode stops.
		return s.endEpisode(ctx, info, r.Rollout, r.Episode, r.Turn, schema.EpisodeAborted, nil, "stale: "+stale)
	case cfg.FailurePolicy == schema.PolicyFail && len(failed) > 0:
		return s.endEpisode(ctx, info, r.Rollout, r.Episode, r.Turn, schema.EpisodeFailed, nil, "act failed: "+strings.Join(failed, "; "))
	case r.Turn >= cfg.MaxTurns:
		return s.endEpisode(ctx, info, r.Rollout, r.Episode, r.Turn, schema.EpisodeTruncated, nil, "max_turns")
	}
	md, err := mode.For(cfg)
	if err != nil {
		return fail.E(fail.Invalid, err)
	}
	obs := md.Observation(r, cfg)
	if cfg.FailurePolicy == schema.PolicyReplan && len(failed) > 0 {
		obs += "Some steps failed (" + strings.Join(failed, "; ") + "). Re-plan the remaining steps, or answer if you can.\n"
	}
	return s.Bus.Publish(ctx, &schema.PlanRequest{
		Rollout: r.Rollout, Episode: r.Episode, Turn: r.Turn + 1, Observation: obs, WeightVersion: plannerVersion(info),
	})
}

// endEpisode publishes the episode's end, with the keys of its acts: the
// nodes of its turns that have an outcome in the ACT stream, where its
// samples are. A finished turn's run records each node's outcome (a cached
// node's published before the run finished the turn). A turn that did not
// finish (a partial plan the answer or a parse error abandoned) is listed
// by the outcomes published: its run says only what its runner had written
// when it last wrote it. Such a run is recorded abandoned first, if no one
// did, so that nothing more is released from it; the end then waits until
// every act it released has an outcome, or the turn's deadline has passed
// (abandon.go): an act still generating is listed with its sample. The
// outcomes of the cached nodes it recorded are published first (their
// runner may have stopped before it did), so that nothing listed lacks its
// outcome.
func (s *Service) endEpisode(ctx context.Context, info *session.Info, n int64, e, turns int, status string, answers []string, reason string) error {
	var runs, open []*schema.Run
	for t := 1; t <= turns; t++ {
		r, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, schema.RunKey(n, e, t))
		if err != nil {
			return err
		}
		if !found {
			continue // a turn that ended without a plan (answer, parse error)
		}
		if !r.Finished && r.Abandoned == nil {
			if r, _, found, err = s.abandon(ctx, info.Session.Config, n, e, t, "the episode ended: "+reason); err != nil {
				return err
			} else if !found {
				continue
			}
		}
		runs = append(runs, &r)
		if r.Finished {
			continue
		}
		abandoned := &runner{s: s, run: r, known: map[string]*schema.ActDone{}}
		if err := abandoned.publishCached(ctx); err != nil {
			return err
		}
		if r.Abandoned != nil {
			open = append(open, &r)
		}
	}
	outcomes, err := s.awaitAbandoned(ctx, n, e, open)
	if errors.Is(err, errRolloutEnded) {
		return nil // nothing to end: the rollout is over
	}
	if err != nil {
		return err
	}
	if outcomes == nil {
		outcomes = map[string]*schema.ActDone{}
	}
	var acts []string
	for _, r := range runs {
		if r.Finished {
			for _, node := range r.Nodes {
				switch node.Status {
				case schema.NodeDone, schema.NodeFailed, schema.NodeCached:
					acts = append(acts, node.Key)
				}
			}
			continue
		}
		if r.Abandoned == nil {
			// Neither finished nor abandoned (complete: its final plan
			// merged; not seen happen): listed as published.
			got, err := s.published(ctx, r)
			if err != nil {
				return err
			}
			for k, d := range got {
				outcomes[k] = d
			}
		}
		for _, node := range r.Nodes {
			if outcomes[node.Key] != nil {
				acts = append(acts, node.Key)
			}
		}
	}
	status, reason = abandonedVerdict(runs, outcomes, status, reason)
	// An episode ends once: its end is stored only where its subject holds
	// none, beyond the duplicate window too, and counted only then. Its
	// answer, parse error or finished turn handled again (a redelivery,
	// the watchdog) comes here again: before, each time was counted, and
	// planact_episodes_ended_total ran ahead of the episodes.
	stored, err := s.Bus.PublishOnce(ctx, &schema.EpisodeEnd{
		Rollout: n, Episode: e, Turns: turns, Status: status, Answers: answers, Reason: reason, Acts: acts, AtMs: nowMs(),
	})
	if err != nil {
		return err
	}
	if !stored {
		zerolog.Ctx(ctx).Debug().Str("status", status).Msg("the episode's end is published already; the first counts")
		return nil
	}
	zerolog.Ctx(ctx).Info().Str("status", status).Strs("answers", answers).Str("reason", reason).Msg("episode ended")
	telemetry.EpisodesEnded.WithLabelValues(status).Inc()
	return nil
}

// abandonedVerdict is how an episode ends (status, reason) given the
// outcomes, by node key, of the acts of its runs that did not finish (a
// streamed turn whose final output was an answer or a parse error):
// finishTurn, which ends the episode of a finished turn as its acts say,
// never sees theirs. As there, an act that drifted quarantines the
// episode, and else one refused as stale aborts it; else the status and
// reason it was to end with stand. Before, they stood whatever those acts
// said: the episode was trained on though an engine had generated from
// another input, or ended completed though an act's weights were too old
// to start it.
func abandonedVerdict(runs []*schema.Run, outcomes map[string]*schema.ActDone, status, reason string) (string, string) {
	var drift, stale string
	for _, r := range runs {
		if r.Finished {
			continue // finishTurn decided on its acts
		}
		for _, node := range r.Nodes {
			d := outcomes[node.Key]
			if d == nil || d.Status != schema.ActFailed {
				continue
			}
			switch {
			case d.ErrorKind == schema.ActErrTokenDrift && drift == "":
				drift = fmt.Sprintf("act %s (turn %d): %s", node.Node.ID, r.Turn, d.Error)
			case d.ErrorKind == schema.ActErrStale && stale == "":
				stale = d.Error
			}
		}
	}
	switch {
	case drift != "" && status != schema.EpisodeQuarantined:
		return schema.EpisodeQuarantined, "token_drift: " + drift + " (then: " + reason + ")"
	case drift == "" && stale != "" && status != schema.EpisodeQuarantined && status != schema.EpisodeAborted:
		return schema.EpisodeAborted, "stale: " + stale + " (then: " + reason + ")"
	}
	return status, reason
}

// published reads the outcomes of the nodes of run r from the ACT stream,
// in one read, by node key (absent where none is published).
func (s *Service) published(ctx context.Context, r *schema.Run) (map[string]*schema.ActDone, error) {
	subjects := make([]string, len(r.Nodes))
	for i, node := range r.Nodes {
		subjects[i] = subject.ActDone(r.Rollout, r.Episode, node.Key)
	}
	msgs, err := s.Bus.LastMsgsOnce(ctx, bus.StreamAct, subject.ActDones(r.Rollout, r.Episode), subjects)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*schema.ActDone, len(msgs))
	for i, node := range r.Nodes {
		m := msgs[subjects[i]]
		if m == nil {
			continue
		}
		var d schema.ActDone
		if err := schema.Unmarshal(m.Data, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", m.Subject, err)
		}
		out[node.Key] = &d
	}
	return out, nil
}

// priorActs gathers the successful calls of the episode's earlier turns,
// first occurrence of each call, for the duplicate guard. Earlier turns are
// finished (a turn starts only after the previous one finished), so their
// run states no longer change and are cached in memory, under the
// rollout's identity (see priorCache).
func (s *Service) priorActs(ctx context.Context, info *session.Info, e, turn int) (map[string]priorAct, error) {
	id := identify(&info.Session)
	prior := map[string]priorAct{}
	for t := 1; t < turn; t++ {
		acts, err := s.turnActs(ctx, id, schema.RunKey(id.n, e, t))
		if err != nil {
			return nil, err
		}
		for call, a := range acts {
			if _, seen := prior[call]; !seen {
				prior[call] = a
			}
		}
	}
	return prior, nil
}

// turnActs are the successful calls of one earlier turn of rollout id. A
// finished turn's run records them; a turn that did not finish (its
// partial plan abandoned for a parse error) has them from the outcomes
// published, as the episode's end lists its acts: what its run says
// depends on when its runner last wrote it.
func (s *Service) turnActs(ctx context.Context, id rolloutID, key string) (map[string]priorAct, error) {
	if acts, ok := s.prior.get(id, key); ok {
		return acts, nil
	}
	r, _, found, err := bus.GetFresh[schema.Run](ctx, s.Bus.Runs, key)
	if err != nil {
		return nil, err
	}
	acts := map[string]priorAct{}
	if !found {
		return acts, nil // a turn that ended without a plan (answer, parse error)
	}
	if !r.Finished {
		outcomes, err := s.published(ctx, &r)
		if err != nil {
			return nil, err
		}
		for _, n := range r.Nodes {
			if d := outcomes[n.Key]; d != nil && d.Status == schema.ActDoneOK {
				if _, seen := acts[callKey(n.Node)]; !seen {
					acts[callKey(n.Node)] = priorAct{Key: n.Key, Output: d.Output}
				}
			}
		}
		return acts, nil // not kept: an abandoned act may publish its outcome still
	}
	for _, n := range r.Nodes {
		if n.Status == schema.NodeDone {
			if _, seen := acts[callKey(n.Node)]; !seen {
				acts[callKey(n.Node)] = priorAct{Key: n.Key, Output: n.Output}
			}
		}
	}
	s.prior.put(id, key, acts)
	return acts, nil
}

// priorCache keeps the successful calls of finished turns, by rollout.
// Rollout numbers start again when a training run does (once the earlier
// run's sessions are gone) while a replica runs for days, so a rollout's
// turns are kept under its identity, never found by a later rollout of the
// number; and a rollout's are dropped when it ends.
type priorCache struct {
	mu    sync.Mutex
	m     map[int64]*rolloutPrior
	turns int // held, over all rollouts
}

// rolloutPrior are the finished turns of one rollout.
type rolloutPrior struct {
	id    rolloutID
	turns map[string]map[string]priorAct // finished turn's run key -> its successful calls
}

// maxPriorTurns bounds the finished turns a replica keeps.
const maxPriorTurns = 4096

func (c *priorCache) get(id rolloutID, key string) (map[string]priorAct, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.m[id.n]
	if r == nil || r.id != id {
		return nil, false
	}
	acts, ok := r.turns[key]
	return acts, ok
}

func (c *priorCache) put(id rolloutID, key string, acts map[string]priorAct) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || c.turns >= maxPriorTurns {
		c.m, c.turns = map[int64]*rolloutPrior{}, 0
	}
	r := c.m[id.n]
	if r == nil || r.id != id {
		// An earlier rollout of the number, whose end this replica did not
		// see (it started after, or the session expired): what it kept is
		// no one's any more.
		if r != nil {
			c.turns -= len(r.turns)
		}
		r = &rolloutPrior{id: id, turns: map[string]map[string]priorAct{}}
		c.m[id.n] = r
	}
	if _, ok := r.turns[key]; !ok {
		c.turns++
	}
	r.turns[key] = acts
}

// forget drops what rollout n's turns left.
func (c *priorCache) forget(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.m[n]; r != nil {
		c.turns -= len(r.turns)
		delete(c.m, n)
	}
}

func plannerVersion(info *session.Info) string {
	return info.Session.Roles[schema.RolePlanner].WeightVersion
}

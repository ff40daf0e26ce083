package sessionstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// episode is what assembly gathers about one episode from the streams, and
// the samples it gives.
type episode struct {
	task      schema.Task
	end       *schema.EpisodeEnd
	last      *schema.PlanOutput // the last planner output holds the whole trajectory
	acts      []*schema.ActDone
	reward    float64
	rewardErr string
	correct   bool
	ran       int // acts the actor model ran (one actor sample each, in training)

	planner *schema.Sample  // nil: none (did not end, or no trajectory)
	actor   []schema.Sample // one per executed act
}

// gather reads the episodes listed (all when which is nil) from the
// streams: of each episode the session records ended, its end, its last
// planner output (its trajectory) and the outcome of every act the end
// lists, each by subject from its stream's leader; it scores those that
// ended and builds their samples.
// own says which episodes' samples are wanted (nil: all): the trajectory
// of any other is read only when it counts for the stats (max_staleness
// set: its unchecked turns), and no sample of it is built.
func (s *Service) gather(ctx context.Context, sess *schema.Session, tasks []schema.Task, which []int, own func(schema.Task) bool) (map[int]*episode, error) {
	n := sess.Rollout
	if which == nil {
		for e := range tasks {
			which = append(which, e)
		}
	}
	eps := make(map[int]*episode, len(which))
	for _, e := range which {
		eps[e] = &episode{task: tasks[e]}
	}
	// An evaluation gives no samples: its episodes' trajectories are read
	// only when max_staleness makes their unchecked turns count, as any
	// rollout's are.
	wanted := func(e int) bool { return !sess.Config.Evaluation && (own == nil || own(tasks[e])) }
	counted := sess.Config.MaxStaleness > 0
	err := forEach(ctx, len(which), readers, func(ctx context.Context, i int) error {
		e := which[i]
		if _, ended := slices.BinarySearch(sess.Ended, e); !ended {
			// The session records which episodes ended within the
			// rollout: an end stored after it ended (a time-out, a cancel,
			// enough groups) is not one of them, whatever the stream
			// holds by the time the results are built.
			return nil
		}
		return s.readEpisode(ctx, n, e, eps[e], wanted(e) || counted)
	})
	if err != nil {
		return nil, err
	}
	newest, err := s.newestVersions(ctx)
	if err != nil {
		return nil, err
	}
	recorded := sess.Scores()
	md, err := mode.For(sess.Config)
	if err != nil {
		return nil, fail.E(fail.Invalid, err)
	}
	// The answered episodes (completed or truncated) no group verdict
	// scored are scored together, several at once, under one budget
	// (scoreAll).
	var unscored []*episode
	for _, e := range which {
		if ep := eps[e]; scoresAnswers(ep.end) {
			if _, ok := recorded[e]; !ok {
				unscored = append(unscored, ep)
			}
		}
	}
	if len(unscored) > 0 {
		budget, why := s.silent.budget(sess)
		spent, answered, err := scoreAll(ctx, s.scorer(sess.Config), unscored, budget, why)
		if err != nil {
			return nil, err
		}
		s.silent.note(sess, spent, answered)
	}
	for _, e := range which {
		ep := eps[e]
		if ep.end == nil {
			continue
		}
		if sc, ok := recorded[e]; ok {
			// Scored when its group was decided: the same reward again,
			// without asking the reward server twice.
			ep.reward, ep.correct, ep.rewardErr = sc.Reward, sc.Correct, sc.Error
		} else if scoresAnswers(ep.end) {
			// A reward that cannot be computed (the reward server is down)
			// costs that episode its reward, not the rollout its samples.
			if ep.rewardErr != "" {
				zerolog.Ctx(ctx).Warn().Str("error", ep.rewardErr).Int("episode", e).Msg("reward failed; episode scores 0")
			}
			ep.correct = reward.ExactMatch(strings.Join(ep.end.Answers, " "), ep.task.Label) == 1
		}
		for _, d := range ep.acts {
			if modelRan(d) {
				ep.ran++
			}
		}
		if !wanted(e) || ep.end.Status == schema.EpisodeQuarantined {
			continue // no samples: an evaluation scores episodes; a quarantined one is never trained on; others come from their group
		}
		if ps, ok := plannerSample(n, e, ep); ok {
			markStaleness(&ps, newest[schema.RolePlanner], sess.Config.MaxStaleness)
			ep.planner = &ps
		}
		// The actor's samples in the order the acts were planned: by turn,
		// then as the turn's plan lists its steps, as the end lists them
		// (readEpisode reads them in that order). Their keys compared as
		// strings would put t1-s10 before t1-s2.
		sort.SliceStable(ep.acts, func(i, j int) bool { return ep.acts[i].Turn < ep.acts[j].Turn })
		for _, d := range ep.acts {
			if as, ok := actorSample(n, e, ep, d); ok {
				markStaleness(&as, newest[schema.RoleActor], sess.Config.MaxStaleness)
				ep.actor = append(ep.actor, as)
			}
		}
		// The rollout's mode rewards the samples (they come with the
		// final answer's score).
		rw := mode.Episode{Task: ep.task, Config: sess.Config, End: ep.end, Last: ep.last, Score: ep.reward, Correct: ep.correct,
			Planner: ep.planner, Actor: ep.actor, Acts: sampledActs(ep), Outcomes: ep.acts}
		md.Rewards(&rw)
	}
	return eps, nil
}

// scoresAnswers says whether an episode that ended as end has its answers
// scored: one that completed, or was truncated (an answer cut at the token
// limit, or max_turns reached) and is trained on with what it answered;
// one with no answer scores as the reward function scores an empty one.
// A failed, aborted or quarantined episode's reward is not computed (0).
func scoresAnswers(end *schema.EpisodeEnd) bool {
	return end != nil && (end.Status == schema.EpisodeCompleted || end.Status == schema.EpisodeTruncated)
}

// sampledActs are the outcomes ep's actor samples came from, in their order.
func sampledActs(ep *episode) []*schema.ActDone {
	var acts []*schema.ActDone
	for _, d := range ep.acts {
		if modelRan(d) {
			acts = append(acts, d)
		}
	}
	return acts
}

// assemble builds both roles' results of a rollout: its stats, how every
// task ended for each role, and the samples: those of the groups delivered
// (as they were delivered) and, when the rollout neither filters groups nor
// stops at a number of them, those of every other episode that ended.
// Episodes that did not end (time-out, abort) give no samples.
func (s *Service) assemble(ctx context.Context, sess *schema.Session) (planner, actor result, err error) {
	n := sess.Rollout
	tl, err := s.tasksOf(ctx, sess)
	if err != nil {
		return result{}, result{}, err
	}
	tasks := tl.Tasks
	// The samples of the delivered groups are read as they were
	// delivered, so only the other episodes' samples are built here.
	eps, err := s.gather(ctx, sess, tasks, nil, ownSamples(sess))
	if err != nil {
		return result{}, result{}, err
	}
	if err := s.recordScores(ctx, sess, eps); err != nil {
		return result{}, result{}, err
	}
	// The delivered groups' samples, as they were delivered (read by
	// several readers, as the episodes are); when the results leave them
	// out, only what they count, as kept when they were delivered.
	leaveOut := sess.Config.LeavesOutGroups()
	roles, groups := []string{schema.RolePlanner, schema.RoleActor}, sess.Delivered()
	read := make([]groupCounts, len(roles)*len(groups))
	err = forEach(ctx, len(read), readers, func(ctx context.Context, i int) error {
		role, g := roles[i/len(groups)], groups[i%len(groups)]
		if c, ok := s.counted.get(identify(sess), role, g); ok && leaveOut {
			read[i] = c
			return nil
		}
		held, err := s.groupSamples(ctx, n, role, g)
		if leaveOut {
			read[i] = countHeld(held)
		} else {
			read[i] = groupCounts{held: held}
		}
		return err
	})
	if err != nil {
		return result{}, result{}, err
	}
	delivered := map[string]map[int]groupCounts{}
	for i, c := range read {
		role, g := roles[i/len(groups)], groups[i%len(groups)]
		if delivered[role] == nil {
			delivered[role] = map[int]groupCounts{}
		}
		delivered[role][g] = c
	}
	planner, actor = buildResults(sess, tasks, eps, delivered)
	return planner, actor, nil
}

// recordScores writes the reward server's answers that gather got for
// ended episodes no group verdict scored into the session (EndScores),
// before any result carries them: a result published again, or the other
// role's published later, carries the same answers, and the server is not
// asked again. A reward computed here (em, f1, a registered function) is
// the same every time and is not recorded. If another reader recorded
// answers of its own meanwhile, the samples built here rest on others:
// the error has the results assembled again, on what is recorded.
func (s *Service) recordScores(ctx context.Context, sess *schema.Session, eps map[int]*episode) error {
	if !remoteReward(sess.Config) {
		return nil
	}
	recorded := sess.Scores()
	var got []schema.EpisodeScore
	for e, ep := range eps {
		if _, ok := recorded[e]; !ok && scoresAnswers(ep.end) {
			got = append(got, schema.EpisodeScore{Episode: e, Reward: ep.reward, Correct: ep.correct, Error: ep.rewardErr})
		}
	}
	if len(got) == 0 {
		return nil
	}
	slices.SortFunc(got, func(a, b schema.EpisodeScore) int { return a.Episode - b.Episode })
	written, _, err := bus.Mutate(ctx, s.Bus.Sessions, schema.SessionKey(sess.Rollout), func(v *schema.Session, exists bool) (bool, error) {
		if !exists {
			return false, fail.Permanentf("rollout %d has no session to record its rewards in", sess.Rollout)
		}
		known, changed := v.Scores(), false
		for _, sc := range got {
			if _, ok := known[sc.Episode]; !ok {
				v.EndScores, changed = append(v.EndScores, sc), true
			}
		}
		return changed, nil
	})
	if err != nil {
		return err
	}
	sess.EndScores = written.EndScores
	now := written.Scores()
	for _, sc := range got {
		if now[sc.Episode] != sc {
			return fail.Transientf("rollout %d: episode %d's reward was recorded by another reader meanwhile; the results are assembled again on it", sess.Rollout, sc.Episode)
		}
	}
	return nil
}

// result is a role's result as assembly built it, its samples held apart
// (those of delivered groups as they were encoded) until it is published.
type result struct {
	*schema.Result
	samples []heldSample
	// tasksOnly marks a failed result that holds no sample by its making
	// (the samples could not be delivered or assembled: tasksOnly): it is
	// published as it is, naming the groups streamed it found.
	tasksOnly bool
}

// buildResults makes both roles' results from what assembly gathered: eps
// (the episodes, by index; those that did not end have no end) and the
// delivered groups, by role and group: their samples as they were
// delivered, or, when the results leave them out (result_samples
// undelivered), what they count. Every count in a result's stats is a
// count of what the result holds (with the groups it leaves out), and a
// state or status claims only what is true of it: a task is trained for a
// role only if that role's samples of it are in its result (or a group it
// leaves out), and a result is ok only if it delivers samples or says why
// it has none.
func buildResults(sess *schema.Session, tasks []schema.Task, eps map[int]*episode, delivered map[string]map[int]groupCounts) (planner, actor result) {
	n := sess.Rollout
	planner = result{Result: &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: sess.Status, Reason: sess.Reason}}
	actor = result{Result: &schema.Result{Rollout: n, Role: schema.RoleActor, Status: sess.Status, Reason: sess.Reason}}
	results := []*result{&planner, &actor}
	filtering, own, leaveOut := sess.Config.Filtering(), ownSamples(sess), sess.Config.LeavesOutGroups()
	stats := schema.Stats{Episodes: len(tasks), Failures: map[string]int{}, EpisodeStatus: map[string]int{}, Tokens: map[string]int{}}
	var turns, rewards float64
	for e := range tasks {
		ep := eps[e]
		if ep.end == nil {
			stats.EpisodeStatus[schema.TaskUnfinished]++
			continue
		}
		stats.Ended++
		stats.EpisodeStatus[ep.end.Status]++
		turns += float64(ep.end.Turns)
		rewards += ep.reward
		if ep.correct {
			stats.Correct++
		}
		for k, v := range failures(ep) {
			stats.Failures[k] += v
		}
		for _, d := range ep.acts {
			if d.Status == schema.ActCached {
				stats.CachedActs++
			}
		}
		stats.Acts += ep.ran
		countUnchecked(&stats, ep)
		if !own(ep.task) {
			continue // delivered groups come as they were delivered; others are not delivered
		}
		if ep.planner != nil {
			planner.samples = append(planner.samples, built(*ep.planner))
		}
		for _, smp := range ep.actor {
			actor.samples = append(actor.samples, built(smp))
		}
	}
	stats.Completed = stats.EpisodeStatus[schema.EpisodeCompleted]
	hasSample := map[string]map[string]bool{} // by role: the episodes with a sample in the result or a group left out
	for _, r := range results {
		hasSample[r.Role] = map[string]bool{}
		for _, g := range sess.Delivered() {
			c := delivered[r.Role][g]
			if leaveOut {
				r.GroupSamples += c.samples
				stats.Tokens[r.Role] += c.tokens
				for id := range c.sampled {
					hasSample[r.Role][id] = true
				}
			} else {
				r.samples = append(r.samples, c.held...)
			}
		}
		if leaveOut {
			r.DeliveredGroups = sess.Delivered()
		}
		// Samples come grouped as the tasks are (group_index, then index), so a
		// trainer computing group-relative advantages finds each group together
		// whatever order the tasks were sent in.
		sort.SliceStable(r.samples, func(i, j int) bool { return sampleBefore(&r.samples[i].sample, &r.samples[j].sample) })
		r.SampleCount = len(r.samples)
		for _, smp := range r.samples {
			stats.Tokens[r.Role] += smp.tokens
			hasSample[r.Role][smp.sample.RolloutID] = true
		}
	}
	if stats.Ended > 0 {
		c := float64(stats.Ended)
		stats.Accuracy = float64(stats.Correct) / c
		stats.MeanReward = rewards / c
		stats.MeanTurns = turns / c
		stats.ActsPerEpisode = float64(stats.Acts) / c
	}
	stats.StartedMs = sess.StartedMs
	if sess.FinishedMs > 0 && sess.StartedMs > 0 {
		stats.WallMs = sess.FinishedMs - sess.StartedMs
	}
	stats.Datasets = datasetStats(tasks, eps)
	var outcomes []schema.EpisodeOutcome
	if sess.Config.Evaluation {
		outcomes = episodeOutcomes(sess, tasks, eps)
		planner.Evaluation, actor.Evaluation = true, true
		planner.Episodes, actor.Episodes = outcomes, outcomes
	}
	for _, r := range results {
		has := hasSample[r.Role]
		var lost lostTasks
		r.Stats = stats
		r.Stats.TaskStates = map[string]int{}
		for e := range tasks {
			out := roleOutcome(taskOutcome(sess, e, eps[e], filtering), r.Role, has[episodeID(n, e)], eps[e], sess.Config)
			if out.State == schema.TaskFailed && eps[e].end != nil && eps[e].end.Status != schema.EpisodeFailed {
				// The episode did not fail; the role's share of it did.
				lost.tasks++
				if r.Role == schema.RoleActor {
					failed, _, _ := modelActs(eps[e], sess.Config)
					lost.acts.merge(failed)
				} else {
					lost.acts.add(out.Reason)
				}
			}
			r.Tasks = append(r.Tasks, out)
			r.Stats.TaskStates[out.State]++
		}
		r.Status, r.Reason = truth(r.Result, eps, lost)
		if short := shortOfTarget(sess); short != "" && r.Status == schema.ResultOK {
			r.Reason = strings.TrimPrefix(r.Reason+"; "+short, "; ")
		}
	}
	return planner, actor
}

// shortOfTarget says, of a rollout that asked for target_groups and ended
// with every episode (its status ok) before that many were delivered, how
// many were and what became of the others; "" when it did not fall short.
// Such a result is ok (everything the batch could give was delivered), but
// its trainer counts on K groups and is told it has fewer.
func shortOfTarget(sess *schema.Session) string {
	k := sess.Config.TargetGroups
	if k == 0 || sess.Config.Evaluation || sess.Status != schema.ResultOK || len(sess.Delivered()) >= k {
		return ""
	}
	states := map[string]int{}
	for _, gs := range sess.Groups {
		if gs.State != schema.GroupDelivered {
			states[gs.State]++
		}
	}
	why := ""
	if len(states) > 0 {
		why = " (the others: " + statesText(states) + ")"
	}
	return fmt.Sprintf("%d of the %d groups asked for (target_groups) were delivered: every episode had ended%s", len(sess.Delivered()), k, why)
}

// ownSamples says which episodes' samples a rollout's results take from
// assembly's own reading: none of an evaluation or of a rollout that
// filters groups (their results hold the delivered groups' samples, as
// they were delivered, and nothing else), else those of every episode
// outside the groups delivered.
func ownSamples(sess *schema.Session) func(schema.Task) bool {
	if sess.Config.Evaluation || sess.Config.Filtering() {
		return func(schema.Task) bool { return false }
	}
	delivered := map[int]bool{}
	for _, g := range sess.Delivered() {
		delivered[g] = true
	}
	return func(t schema.Task) bool { return !delivered[t.GroupIndex] }
}

// episodeOutcomes are an evaluation's episodes, scored, in episode order:
// what its results hold instead of samples.
func episodeOutcomes(sess *schema.Session, tasks []schema.Task, eps map[int]*episode) []schema.EpisodeOutcome {
	out := make([]schema.EpisodeOutcome, len(tasks))
	for e, t := range tasks {
		ep := eps[e]
		o := schema.EpisodeOutcome{Episode: e, GroupIndex: t.GroupIndex, Index: t.Index, Dataset: t.Dataset}
		if ep.end == nil {
			to := taskOutcome(sess, e, ep, false)
			o.Status, o.Reason = to.State, to.Reason // unfinished, or aborted: no reward
		} else {
			o.Status, o.Reason, o.Answers = ep.end.Status, ep.end.Reason, ep.end.Answers
			o.Reward, o.Correct, o.Turns, o.Acts = ep.reward, ep.correct, ep.end.Turns, ep.ran
			o.Failures = failures(ep)
		}
		out[e] = o
	}
	return out
}

// datasetStats are Stats' numbers per dataset, when the tasks name theirs.
func datasetStats(tasks []schema.Task, eps map[int]*episode) map[string]schema.DatasetStats {
	var out map[string]schema.DatasetStats
	sums := map[string]*struct{ rewards, turns float64 }{}
	for e, t := range tasks {
		if t.Dataset == "" {
			continue
		}
		if out == nil {
			out = map[string]schema.DatasetStats{}
		}
		ds := out[t.Dataset]
		if sums[t.Dataset] == nil {
			sums[t.Dataset] = &struct{ rewards, turns float64 }{}
			ds.EpisodeStatus, ds.Failures = map[string]int{}, map[string]int{}
		}
		ds.Episodes++
		ep := eps[e]
		if ep.end == nil {
			ds.EpisodeStatus[schema.TaskUnfinished]++
			out[t.Dataset] = ds
			continue
		}
		ds.Ended++
		ds.EpisodeStatus[ep.end.Status]++
		if ep.correct {
			ds.Correct++
		}
		ds.Acts += ep.ran
		for k, v := range failures(ep) {
			ds.Failures[k] += v
		}
		sums[t.Dataset].rewards += ep.reward
		sums[t.Dataset].turns += float64(ep.end.Turns)
		out[t.Dataset] = ds
	}
	for name, ds := range out {
		if ds.Ended > 0 {
			c := float64(ds.Ended)
			ds.Accuracy, ds.MeanReward = float64(ds.Correct)/c, sums[name].rewards/c
			ds.MeanTurns, ds.ActsPerEpisode = sums[name].turns/c, float64(ds.Acts)/c
		}
		if len(ds.Failures) == 0 {
			ds.Failures = nil
		}
		out[name] = ds
	}
	return out
}

// taskOutcome says how the task of episode e ended: every task ends in
// exactly one state, and the result reports it. It is the same for both
// roles; roleOutcome makes it true of one role's result.
func taskOutcome(sess *schema.Session, e int, ep *episode, filtering bool) schema.TaskOutcome {
	out := schema.TaskOutcome{Episode: e, GroupIndex: ep.task.GroupIndex, Index: ep.task.Index}
	gs, complete := sess.Group(ep.task.GroupIndex)
	switch {
	case ep.end == nil && sess.State == schema.SessionTimeout:
		out.State, out.Reason = schema.TaskUnfinished, "still running at the rollout's time-out"
	case ep.end == nil:
		out.State, out.Reason = schema.TaskAborted, "stopped: "+sess.Reason
	case ep.end.Status == schema.EpisodeFailed:
		out.State, out.Reason = schema.TaskFailed, ep.end.Reason
	case ep.end.Status == schema.EpisodeAborted:
		out.State, out.Reason = schema.TaskAborted, ep.end.Reason
	case ep.end.Status == schema.EpisodeQuarantined:
		out.State, out.Reason = schema.TaskQuarantined, ep.end.Reason
	case sess.Config.Evaluation:
		out.State = schema.TaskEvaluated
	case complete && gs.State == schema.GroupFiltered:
		out.State, out.Reason = schema.TaskFiltered, gs.Reason
	case complete && gs.State == schema.GroupSurplus:
		out.State, out.Reason = schema.TaskAborted, gs.Reason
	case complete && gs.State == schema.GroupFailed && filtering:
		// Its samples come only as a delivered group's, and it was not one.
		out.State, out.Reason = schema.TaskFailed, "its group could not be delivered: "+gs.Reason
	case complete || !filtering:
		out.State = schema.TaskTrained
	default:
		out.State, out.Reason = schema.TaskAborted, "its group was not complete when the rollout ended: "+sess.Reason
	}
	return out
}

// roleOutcome makes a task's outcome true of role's result: a task whose
// samples would be delivered is trained for the role only if has (the
// role's result holds samples of it). Otherwise, for the planner, it
// failed (its episode left no trajectory); for the actor, it failed when
// acts of it that the actor model was to run failed (the reason names the
// most frequent failure), and is empty when none was asked of the model
// (answered at once, from the cache, or by tools that are not the actor
// model only: HTTP, Go, a mode's own).
func roleOutcome(out schema.TaskOutcome, role string, has bool, ep *episode, cfg schema.Config) schema.TaskOutcome {
	if out.State != schema.TaskTrained || has {
		return out
	}
	if role == schema.RolePlanner {
		out.State, out.Reason = schema.TaskFailed, "no planner sample: the episode left no trajectory"
		return out
	}
	failed, cached, tools := modelActs(ep, cfg)
	if failed.total > 0 {
		cause, k := failed.most()
		out.State, out.Reason = schema.TaskFailed, fmt.Sprintf("no actor sample: %d act(s) failed (%d %s)", failed.total, k, cause)
		return out
	}
	out.State = schema.TaskEmpty
	switch {
	case len(ep.acts) == 0:
		out.Reason = "no actor sample: the planner ran no act"
	default:
		out.Reason = fmt.Sprintf("no actor sample: no act ran the actor model (%d from the cache, %d by other tools, %d skipped)",
			cached, tools, len(ep.acts)-cached-tools)
	}
	return out
}

// readers bounds the reads assembly has in flight at once.
const readers = 32

// readEpisode reads episode e's end, last planner output and act outcomes.
// It is called for an episode the session records as ended, so its end is
// in the stream (read from the leader, never a stale replica): one that is
// not is an error, never an episode that did not end, on which a group
// would be decided for good.
func (s *Service) readEpisode(ctx context.Context, n int64, e int, ep *episode, trajectory bool) error {
	m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(n, e))
	if err != nil {
		return err
	}
	if m == nil {
		return endMissing(n, e)
	}
	var end schema.EpisodeEnd
	if err := schema.Unmarshal(m.Data, &end); err != nil {
		return fmt.Errorf("%s: %w", m.Subject, err)
	}
	ep.end = &end
	if !trajectory {
		m = nil
	} else if m, err = s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, e)); err != nil {
		return err
	}
	if m != nil {
		var out schema.PlanOutput
		if err := schema.Unmarshal(m.Data, &out); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		ep.last = &out
	}
	// The outcomes in one read (each act's is written once).
	subjects := make([]string, len(end.Acts))
	for i, key := range end.Acts {
		subjects[i] = subject.ActDone(n, e, key)
	}
	outcomes, err := s.Bus.LastMsgsOnce(ctx, bus.StreamAct, subject.ActDones(n, e), subjects)
	if err != nil {
		return err
	}
	for i, key := range end.Acts {
		m := outcomes[subjects[i]]
		if m == nil {
			return fail.Permanentf("episode %d lists act %s, whose outcome is not in the ACT stream", e, key)
		}
		var d schema.ActDone
		if err := schema.Unmarshal(m.Data, &d); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		ep.acts = append(ep.acts, &d)
	}
	return nil
}

// endMissing is the error of episode e of rollout n, which the session
// records as ended, when its end is not in the stream.
func endMissing(n int64, e int) error {
	return fail.Permanentf("rollout %d: the session records episode %d as ended, but its end is not in the %s stream (%s): it cannot be read, and is not taken as not ended",
		n, e, bus.StreamRollout, subject.EpisodeEnd(n, e))
}

// forEach calls fn for 0..n-1 with at most workers calls at once, and
// returns the first error (the others stop at their next read).
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i := 0; i < n && ctx.Err() == nil; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}

// registered says whether the program registered the reward function name
// (reward.Register).
func registered(name string) bool {
	_, ok := reward.Lookup(name)
	return ok
}

// remoteReward says whether the rollout's reward is a reward server's
// (reward: URL): asked over the network, and not bound to answer the same
// twice, so its answers are recorded (schema.GroupState's Scores).
func remoteReward(cfg schema.Config) bool {
	return cfg.Reward != "em" && !registered(cfg.Reward) &&
		(strings.HasPrefix(cfg.Reward, "http://") || strings.HasPrefix(cfg.Reward, "https://"))
}

// scoreFunc scores an episode's answer to its task.
type scoreFunc func(ctx context.Context, t schema.Task, answer string) (float64, error)

// scorer returns the rollout's reward function. A score that is not a
// finite number (NaN or ±Inf from a registered function) is an error, not
// a reward: it would poison every mean and advantage computed from it.
func (s *Service) scorer(cfg schema.Config) scoreFunc {
	var fn scoreFunc
	switch {
	case cfg.Reward == "em":
		em, _ := reward.Builtin("em") // a task whose label holds no answer cannot be scored: an error
		fn = func(ctx context.Context, t schema.Task, a string) (float64, error) {
			return em(ctx, t.Prompt, a, t.Label)
		}
	case registered(cfg.Reward):
		registeredFn, _ := reward.Lookup(cfg.Reward)
		fn = func(ctx context.Context, t schema.Task, a string) (float64, error) {
			return registeredFn(ctx, t.Prompt, a, t.Label)
		}
	case remoteReward(cfg):
		r := reward.Remote{URL: cfg.Reward, HTTP: &http.Client{Timeout: 30 * time.Second}}
		fn = func(ctx context.Context, t schema.Task, a string) (float64, error) {
			// A few quick tries ride out a blip; a server that stays down
			// costs the episodes their rewards (scoreAll), not a hang.
			var err error
			for attempt, wait := 0, 100*time.Millisecond; attempt < 3; attempt, wait = attempt+1, 2*wait {
				var v float64
				if v, err = r.Score(ctx, t.Prompt, a, t.Label); err == nil || !fail.IsRetryable(err) {
					return v, err
				}
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}
			return 0, err
		}
	default:
		f1, _ := reward.Builtin("f1")
		fn = func(ctx context.Context, t schema.Task, a string) (float64, error) {
			return f1(ctx, t.Prompt, a, t.Label)
		}
	}
	return func(ctx context.Context, t schema.Task, a string) (float64, error) {
		v, err := fn(ctx, t, a)
		if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
			return 0, fmt.Errorf("reward %s: the score %v is not a finite number", cfg.Reward, v)
		}
		return v, err
	}
}

// Scoring runs scorers episodes at once. A reward server that stops
// answering (it accepts connections and says nothing, say) must not hold
// the rollout's results for its episodes one by one, three tries of 30 s
// each: once it has answered nothing for scoreBudget, the episodes not
// scored yet get a reward error, as a failed reward does (the episode
// scores 0, and its failures say "reward"), and none waits any more. The
// budget counts silence, not work: a slow server that keeps answering
// scores every episode.
//
// The budget is the rollout's, not each scoring pass's: a rollout scores
// in many passes (each group when it is decided, then what is left when
// the results are assembled), and a server silent for a whole budget in
// one of them would cost every later one a whole budget again, a minute
// per group. Once a pass has spent it with no score, the later passes of
// the rollout have a short one (a twelfth) to find the server back; a
// score that comes gives the next passes the whole budget again.
const scorers = 16

// scoreBudget is a variable so that a test can shorten it.
var scoreBudget = time.Minute

// errScoreBudget stops the scoring of a rollout whose reward server
// answered nothing for its budget.
var errScoreBudget = errors.New("scoring budget spent")

// silentScorers remembers, by rollout, that its reward server answered
// nothing for a whole scoring budget (and nothing since): this process's
// later scoring passes of the rollout have a short budget.
type silentScorers struct {
	mu sync.Mutex
	m  map[int64]int64 // rollout -> the CreatedMs of its session (the rollout's identity)
}

// maxSilentRollouts bounds what silentScorers keeps; past it, it starts
// afresh (a pass then has a whole budget again).
const maxSilentRollouts = 256

// budget is the scoring budget of sess's next pass, and why it is short
// when it is ("" when it is not).
func (c *silentScorers) budget(sess *schema.Session) (time.Duration, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if created, ok := c.m[sess.Rollout]; ok && created == sess.CreatedMs {
		return scoreBudget / 12, fmt.Sprintf("the reward server answered nothing for a whole budget of %v earlier in this rollout", scoreBudget)
	}
	return scoreBudget, ""
}

// note records how sess's pass went: a score came (the server answers), or
// the budget was spent without one.
func (c *silentScorers) note(sess *schema.Session, spent, answered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case answered:
		delete(c.m, sess.Rollout)
	case spent:
		if c.m == nil || len(c.m) >= maxSilentRollouts {
			c.m = map[int64]int64{}
		}
		c.m[sess.Rollout] = sess.CreatedMs
	}
}

func (c *silentScorers) forget(n int64) {
	c.mu.Lock()
	delete(c.m, n)
	c.mu.Unlock()
}

// scoreAll scores eps (ended completed or truncated, not scored before) with score,
// setting each one's reward, or its rewardErr (and a reward of 0), until
// the server has answered nothing for budget (short says why it is
// short, if it is). It reports whether the budget was spent, and whether
// any score came. Its error is ctx's only: a reward that cannot be had is
// the episode's.
func scoreAll(ctx context.Context, score scoreFunc, eps []*episode, budget time.Duration, short string) (spentAll, answered bool, err error) {
	if len(eps) == 0 {
		return false, false, nil
	}
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var mu sync.Mutex
	lastAnswer, lastFailure := time.Now(), error(nil)
	watched := make(chan struct{})
	defer close(watched)
	go func() {
		timer := time.NewTimer(budget)
		defer timer.Stop()
		for {
			select {
			case <-watched:
				return
			case <-timer.C:
			}
			mu.Lock()
			silent := time.Since(lastAnswer)
			mu.Unlock()
			if silent >= budget {
				stop(errScoreBudget)
				return
			}
			timer.Reset(budget - silent)
		}
	}()
	spent := func() string {
		mu.Lock()
		defer mu.Unlock()
		msg := fmt.Sprintf("reward: not scored: no score came for %v, the rollout's scoring budget", budget)
		if short != "" {
			msg += " (short: " + short + ")"
		}
		if lastFailure != nil {
			msg += " (last failure: " + lastFailure.Error() + ")"
		}
		return msg
	}
	sem := make(chan struct{}, scorers)
	var wg sync.WaitGroup
	for _, ep := range eps {
		acquired := false
		select {
		case sem <- struct{}{}:
			acquired = true
		case <-sctx.Done():
		}
		if sctx.Err() != nil {
			if acquired {
				<-sem
			}
			ep.reward, ep.rewardErr = 0, spent()
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			v, err := score(sctx, ep.task, strings.Join(ep.end.Answers, " | "))
			mu.Lock()
			if err == nil {
				lastAnswer, answered = time.Now(), true
			} else if sctx.Err() == nil {
				lastFailure = err
			}
			mu.Unlock()
			switch {
			case err == nil:
				ep.reward, ep.rewardErr = v, ""
			case context.Cause(sctx) == errScoreBudget:
				ep.reward, ep.rewardErr = 0, spent()
			default:
				ep.reward, ep.rewardErr = 0, err.Error()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return false, false, fmt.Errorf("score episodes: %w", err) // stopped: what the rewards would be is not known
	}
	return context.Cause(sctx) == errScoreBudget, answered, nil
}

// newestVersions reads each role's newest weight version (resumes and
// arrivals), what staleness is counted from.
func (s *Service) newestVersions(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		st, _, _, err := bus.GetFresh[schema.RoleState](ctx, s.Bus.Sessions, schema.RoleKey(role))
		if err != nil {
			return nil, err
		}
		out[role] = st.WeightVersion
	}
	return out, nil
}

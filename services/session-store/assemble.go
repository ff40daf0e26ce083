package sessionstore

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
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

	planner *schema.Sample  // nil: none (did not end, or no trajectory)
	actor   []schema.Sample // one per executed act
}

// gather reads the episodes listed (all when which is nil) from the
// streams: every episode's end, its last planner output (its trajectory)
// and the outcome of every act the end lists, each by subject from its
// stream's leader; it scores those that ended and builds their samples.
func (s *Service) gather(ctx context.Context, sess *schema.Session, tasks []schema.Task, which []int) (map[int]*episode, error) {
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
	err := forEach(ctx, len(which), readers, func(ctx context.Context, i int) error {
		return s.readEpisode(ctx, n, which[i], eps[which[i]])
	})
	if err != nil {
		return nil, err
	}
	newest, err := s.newestVersions(ctx)
	if err != nil {
		return nil, err
	}
	scorer := s.scorer(sess.Config)
	for _, e := range which {
		ep := eps[e]
		if ep.end == nil {
			continue
		}
		if ep.end.Status == schema.EpisodeCompleted {
			// A reward that cannot be computed (the reward server is down)
			// costs that episode its reward, not the rollout its samples.
			if ep.reward, err = scorer(ctx, ep.task, strings.Join(ep.end.Answers, " | ")); err != nil {
				ep.reward, ep.rewardErr = 0, err.Error()
				zerolog.Ctx(ctx).Warn().Err(err).Int("episode", e).Msg("reward failed; episode scores 0")
			}
			ep.correct = reward.ExactMatch(strings.Join(ep.end.Answers, " "), ep.task.Label) == 1
		}
		if ps, ok := plannerSample(n, e, ep); ok {
			markStaleness(&ps, newest[schema.RolePlanner], sess.Config.MaxStaleness)
			ep.planner = &ps
		}
		sort.Slice(ep.acts, func(i, j int) bool {
			a, b := ep.acts[i], ep.acts[j]
			if a.Turn != b.Turn {
				return a.Turn < b.Turn
			}
			return a.Key < b.Key
		})
		for _, d := range ep.acts {
			if as, ok := actorSample(n, e, ep, d); ok {
				markStaleness(&as, newest[schema.RoleActor], sess.Config.MaxStaleness)
				ep.actor = append(ep.actor, as)
			}
		}
		if sess.Config.SplitActReward && len(ep.actor) > 0 {
			for i := range ep.actor {
				ep.actor[i].Reward = ep.reward / float64(len(ep.actor))
			}
		}
	}
	return eps, nil
}

// assemble builds both roles' results of a rollout: its stats, how every
// task ended, and the samples: those of the groups delivered (as they were
// delivered) and, when the rollout neither filters groups nor stops at a
// number of them, those of every other episode that ended. Episodes that
// did not end (time-out, abort) give no samples.
func (s *Service) assemble(ctx context.Context, sess *schema.Session) (planner, actor *schema.Result, err error) {
	n := sess.Rollout
	status, reason := sess.Status, sess.Reason
	tasks, err := s.tasks(ctx, n)
	if err != nil {
		return nil, nil, err
	}
	eps, err := s.gather(ctx, sess, tasks, nil)
	if err != nil {
		return nil, nil, err
	}
	stats := schema.Stats{Episodes: len(tasks), Failures: map[string]int{}, EpisodeStatus: map[string]int{}, Tokens: map[string]int{}, TaskStates: map[string]int{}}
	planner = &schema.Result{Rollout: n, Role: schema.RolePlanner, Status: status, Reason: reason}
	actor = &schema.Result{Rollout: n, Role: schema.RoleActor, Status: status, Reason: reason}
	filtering := sess.Config.Filtering()
	delivered := map[int]bool{}
	for _, g := range sess.Delivered() {
		delivered[g] = true
	}
	var turns, rewards float64
	for e := range tasks {
		ep := eps[e]
		outcome := taskOutcome(sess, e, ep, filtering)
		planner.Tasks = append(planner.Tasks, outcome)
		stats.TaskStates[outcome.State]++
		if ep.end == nil {
			stats.EpisodeStatus[schema.TaskUnfinished]++
			continue
		}
		stats.Completed++
		stats.EpisodeStatus[ep.end.Status]++
		turns += float64(ep.end.Turns)
		rewards += ep.reward
		if ep.correct {
			stats.Correct++
		}
		if ep.rewardErr != "" {
			stats.Failures["reward"]++
		}
		for _, d := range ep.acts {
			if d.Status == schema.ActFailed && d.ErrorKind != schema.ActErrDuplicate {
				// A duplicate that failed with the act it repeats is that
				// act's failure, counted once.
				stats.Failures[d.ErrorKind]++
			}
			if d.Status == schema.ActCached {
				stats.CachedActs++
			}
		}
		stats.Acts += len(ep.actor)
		countUnchecked(&stats, ep)
		if delivered[ep.task.GroupIndex] || filtering {
			continue // delivered groups come as they were delivered; others are not delivered
		}
		if ep.planner != nil {
			planner.Samples = append(planner.Samples, *ep.planner)
		}
		actor.Samples = append(actor.Samples, ep.actor...)
	}
	actor.Tasks = planner.Tasks
	for _, g := range sess.Delivered() {
		for _, r := range []*schema.Result{planner, actor} {
			samples, err := s.groupSamples(ctx, n, r.Role, g)
			if err != nil {
				return nil, nil, err
			}
			r.Samples = append(r.Samples, samples...)
		}
	}
	for _, smp := range planner.Samples {
		stats.Tokens[schema.RolePlanner] += len(smp.Tokens)
	}
	for _, smp := range actor.Samples {
		stats.Tokens[schema.RoleActor] += len(smp.Tokens)
	}
	if stats.Completed > 0 {
		c := float64(stats.Completed)
		stats.Accuracy = float64(stats.Correct) / c
		stats.MeanReward = rewards / c
		stats.MeanTurns = turns / c
		stats.ActsPerEpisode = float64(stats.Acts) / c
	}
	stats.StartedMs = sess.StartedMs
	// Samples come grouped as the tasks are (group_index, then index), so a
	// trainer computing group-relative advantages finds each group together
	// whatever order the tasks were sent in.
	sort.SliceStable(planner.Samples, func(i, j int) bool { return sampleBefore(&planner.Samples[i], &planner.Samples[j]) })
	sort.SliceStable(actor.Samples, func(i, j int) bool { return sampleBefore(&actor.Samples[i], &actor.Samples[j]) })
	if sess.FinishedMs > 0 && sess.StartedMs > 0 {
		stats.WallMs = sess.FinishedMs - sess.StartedMs
	}
	status, reason = truth(status, reason, eps)
	planner.Status, planner.Reason, actor.Status, actor.Reason = status, reason, status, reason
	planner.Stats, actor.Stats = stats, stats
	return planner, actor, nil
}

// taskOutcome says how the task of episode e ended: every task ends in
// exactly one state, and the result reports it.
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
	case complete && gs.State == schema.GroupFiltered:
		out.State, out.Reason = schema.TaskFiltered, gs.Reason
	case complete && gs.State == schema.GroupSurplus:
		out.State, out.Reason = schema.TaskAborted, gs.Reason
	case complete || !filtering:
		out.State = schema.TaskTrained
	default:
		out.State, out.Reason = schema.TaskAborted, "its group was not complete when the rollout ended: "+sess.Reason
	}
	return out
}

// readers bounds the reads assembly has in flight at once.
const readers = 32

// readEpisode reads episode e's end, last planner output and act outcomes.
func (s *Service) readEpisode(ctx context.Context, n int64, e int, ep *episode) error {
	m, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(n, e))
	if err != nil || m == nil {
		return err // nil: the episode did not end
	}
	var end schema.EpisodeEnd
	if err := schema.Unmarshal(m.Data, &end); err != nil {
		return fmt.Errorf("%s: %w", m.Subject, err)
	}
	ep.end = &end
	if m, err = s.Bus.LastMsg(ctx, bus.StreamPlan, subject.PlanOut(n, e)); err != nil {
		return err
	}
	if m != nil {
		var out schema.PlanOutput
		if err := schema.Unmarshal(m.Data, &out); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		ep.last = &out
	}
	for _, key := range end.Acts {
		m, err := s.Bus.LastMsg(ctx, bus.StreamAct, subject.ActDone(n, e, key))
		if err != nil {
			return err
		}
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

// truth makes a result's status and reason say what happened to the
// episodes: a rollout whose episodes all failed is failed, not ok, and the
// reason names the most frequent cause.
func truth(status, reason string, eps map[int]*episode) (string, string) {
	failed, ended := 0, 0
	causes := map[string]int{}
	for _, ep := range eps {
		if ep.end == nil {
			continue
		}
		ended++
		if ep.end.Status == schema.EpisodeFailed {
			failed++
			causes[ep.end.Reason]++
		}
	}
	if failed == 0 {
		return status, reason
	}
	cause, most := "", 0
	for c, k := range causes {
		if k > most || k == most && c < cause {
			cause, most = c, k
		}
	}
	what := fmt.Sprintf("%d of %d episodes failed (%d: %s)", failed, len(eps), most, cause)
	if failed == len(eps) {
		what = fmt.Sprintf("all %d episodes failed (%d: %s)", len(eps), most, cause)
	}
	if reason != "" {
		what = reason + "; " + what
	}
	if status == schema.ResultOK && failed == ended && failed == len(eps) {
		status = schema.ResultFailed
	}
	return status, what
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

// plannerSample turns an episode's trajectory into one multi-turn sample:
// the prompt, then every turn's generated tokens (loss mask 1, their
// log-probs) and the observations planact appended (loss mask 0, log-prob
// 0: no model wrote them and no loss falls on them). When the engine did
// not return a turn's log-probs the sample has none at all (slime's
// rollout_log_probs left unset: the trainer computes its own), and
// metadata.log_probs_missing says which turn and why: a zero in their place
// would be trusted by an importance ratio.
func plannerSample(n int64, e int, ep *episode) (schema.Sample, bool) {
	out := ep.last
	if out == nil || len(out.Segments) == 0 || out.Segments[0].Kind != schema.SegPrompt {
		return schema.Sample{}, false
	}
	prompt := out.Segments[0]
	smp := schema.Sample{
		GroupIndex: ep.task.GroupIndex, Index: ep.task.Index, RolloutID: episodeID(n, e),
		Prompt: prompt.Text, Label: ep.task.Label, Reward: ep.reward, Status: ep.end.Status,
		Tokens: append([]int(nil), prompt.IDs...),
	}
	var resp strings.Builder
	missing, unchecked := "", ""
	for _, seg := range out.Segments[1:] {
		resp.WriteString(seg.Text)
		smp.Tokens = append(smp.Tokens, seg.IDs...)
		gen := seg.Kind == schema.SegGenerated
		if gen && missing == "" && len(seg.LogProbs) != len(seg.IDs) {
			missing = fmt.Sprintf("turn %d: %s", seg.Turn, logProbsMissing(seg.LogProbsMissing, len(seg.LogProbs), len(seg.IDs)))
		}
		if gen && unchecked == "" && seg.StalenessUnchecked != "" {
			unchecked = fmt.Sprintf("turn %d: %s", seg.Turn, seg.StalenessUnchecked)
		}
		for i := range seg.IDs {
			if gen {
				smp.LossMask = append(smp.LossMask, 1)
				lp := 0.0
				if i < len(seg.LogProbs) {
					lp = seg.LogProbs[i]
				}
				smp.RolloutLogProbs = append(smp.RolloutLogProbs, lp) // dropped below if any is missing
			} else {
				smp.LossMask = append(smp.LossMask, 0)
				smp.RolloutLogProbs = append(smp.RolloutLogProbs, 0)
			}
		}
		if gen {
			// One version per generated segment (each turn), as slime's
			// weight_versions: what generated it, in order.
			smp.WeightVersions = append(smp.WeightVersions, seg.Version)
		}
	}
	smp.Response = resp.String()
	smp.ResponseLength = len(smp.Tokens) - len(prompt.IDs)
	switch out.FinishReason {
	case "length":
		if smp.Status == schema.EpisodeCompleted {
			smp.Status = schema.EpisodeTruncated
		}
	case "abort":
		smp.Status = schema.EpisodeAborted
	}
	smp.Metadata = map[string]any{
		"rollout": n, "episode": e, "turns": ep.end.Turns, "answers": ep.end.Answers,
		"finish_reason": out.FinishReason, "end_reason": ep.end.Reason, "ended_ms": ep.end.AtMs,
	}
	if missing != "" {
		smp.RolloutLogProbs = nil
		smp.Metadata["log_probs_missing"] = missing
	}
	if unchecked != "" {
		smp.Metadata["staleness_unchecked"] = unchecked
	}
	if out.Truncated != "" && smp.Status == schema.EpisodeTruncated {
		smp.Metadata["truncated"] = out.Truncated // the limit that cut it
	}
	if ep.rewardErr != "" {
		smp.Metadata["reward_error"] = ep.rewardErr
	}
	return smp, true
}

// logProbsMissing says why a generation of n tokens has got log-probs for
// none, or not all, of them: why, what the engine's reply lacked, when it
// was recorded.
func logProbsMissing(why string, got, n int) string {
	if why != "" {
		return why
	}
	return fmt.Sprintf("%d log-probs for %d generated tokens", got, n)
}

// actorSample turns one executed act into a sample. Acts answered from the
// cache, skipped or failed before the model ran give none.
func actorSample(n int64, e int, ep *episode, d *schema.ActDone) (schema.Sample, bool) {
	g := d.Generation
	if g == nil || d.Status != schema.ActDoneOK {
		return schema.Sample{}, false
	}
	smp := schema.Sample{
		GroupIndex: ep.task.GroupIndex, Index: ep.task.Index, RolloutID: episodeID(n, e),
		Prompt: g.Prompt, Response: g.Text, Label: ep.task.Label, Reward: ep.reward,
		Tokens:         append(append([]int(nil), g.PromptIDs...), g.OutputIDs...),
		ResponseLength: len(g.OutputIDs),
		LossMask:       ones(len(g.OutputIDs)),
		Status:         schema.EpisodeCompleted,
	}
	// Log-probs the engine did not return are absent, never zeros.
	if len(g.LogProbs) == len(g.OutputIDs) {
		smp.RolloutLogProbs = append([]float64(nil), g.LogProbs...)
	}
	switch g.FinishReason {
	case "length":
		smp.Status = schema.EpisodeTruncated
	case "abort":
		smp.Status = schema.EpisodeAborted
	}
	if g.WeightVersion != "" {
		smp.WeightVersions = []string{g.WeightVersion}
	}
	smp.Metadata = map[string]any{
		"rollout": n, "episode": e, "turn": d.Turn, "node": d.NodeID, "key": d.Key, "tool": d.Tool,
		"input": d.Input, "attempts": d.Attempts, "latency_ms": g.LatencyMs,
		"started_ms": d.StartedMs, "ended_ms": d.EndedMs,
	}
	if len(g.LogProbs) != len(g.OutputIDs) {
		smp.Metadata["log_probs_missing"] = logProbsMissing(g.LogProbsMissing, len(g.LogProbs), len(g.OutputIDs))
	}
	if g.StalenessUnchecked != "" {
		smp.Metadata["staleness_unchecked"] = g.StalenessUnchecked
	}
	if g.Truncated != "" {
		smp.Metadata["truncated"] = g.Truncated // the limit that cut it
	}
	return smp, true
}

func sampleBefore(a, b *schema.Sample) bool {
	if a.GroupIndex != b.GroupIndex {
		return a.GroupIndex < b.GroupIndex
	}
	return a.Index < b.Index
}

func episodeID(n int64, e int) string { return fmt.Sprintf("%d-%d", n, e) }

func ones(n int) []int {
	m := make([]int, n)
	for i := range m {
		m[i] = 1
	}
	return m
}

// scorer returns the rollout's reward function.
func (s *Service) scorer(cfg schema.Config) func(ctx context.Context, t schema.Task, answer string) (float64, error) {
	switch {
	case cfg.Reward == "em":
		return func(_ context.Context, t schema.Task, a string) (float64, error) {
			return reward.ExactMatch(a, t.Label), nil
		}
	case strings.HasPrefix(cfg.Reward, "http://") || strings.HasPrefix(cfg.Reward, "https://"):
		r := reward.Remote{URL: cfg.Reward, HTTP: &http.Client{Timeout: 30 * time.Second}}
		return func(ctx context.Context, t schema.Task, a string) (float64, error) {
			// A few quick tries ride out a blip; a server that stays down
			// costs the episodes their rewards (see assemble), not a hang.
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
		return func(_ context.Context, t schema.Task, a string) (float64, error) { return reward.F1(a, t.Label), nil }
	}
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

// countUnchecked counts, by role, the generations of an ended episode
// that ran without their weights checked against max_staleness.
func countUnchecked(stats *schema.Stats, ep *episode) {
	add := func(role string) {
		if stats.StalenessUnchecked == nil {
			stats.StalenessUnchecked = map[string]int{}
		}
		stats.StalenessUnchecked[role]++
	}
	if ep.last != nil {
		for _, seg := range ep.last.Segments {
			if seg.Kind == schema.SegGenerated && seg.StalenessUnchecked != "" {
				add(schema.RolePlanner)
			}
		}
	}
	for _, d := range ep.acts {
		if d.Generation != nil && d.Generation.StalenessUnchecked != "" && d.Status == schema.ActDoneOK {
			add(schema.RoleActor)
		}
	}
}

// markStaleness records in a sample's metadata how many versions its oldest
// segment's weights are behind the trainer's newest (when versions end in
// numbers), and marks it stale past maxStaleness, so that the trainer can
// drop or re-weight it.
func markStaleness(smp *schema.Sample, newest string, maxStaleness int) {
	worst, known := int64(0), false
	for _, v := range smp.WeightVersions {
		if b, ok := schema.Behind(newest, v); ok {
			worst, known = max(worst, b), true
		}
	}
	if !known {
		return
	}
	smp.Metadata["staleness"] = worst
	if maxStaleness > 0 && worst > int64(maxStaleness) {
		smp.Metadata["stale"] = true
	}
}

package view

import (
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
)

// Building the views from the state. Everything here runs with the
// Reader's lock held and copies what it returns.

// summary is the list line of rollout r at time now.
func (r *rolloutState) summary(now time.Time) RolloutSummary {
	s := RolloutSummary{Rollout: r.n, Status: StatusWaiting, ArrivedAt: r.arrivedAt, StartedAt: r.startedAt, WeightVersions: map[string][]string{}}
	if r.start != nil {
		s.Status, s.Episodes = StatusRunning, r.start.Episodes
	} else if len(r.rejected) > 0 {
		roles := slices.Sorted(maps.Keys(r.rejected))
		reasons := make([]string, len(roles))
		for i, role := range roles {
			reasons[i] = role + " arrival refused: " + r.rejected[role]
		}
		s.Status, s.Reason = StatusRejected, strings.Join(reasons, "; ")
	}
	versions := map[string]map[string]bool{}
	for role, vs := range r.versions {
		versions[role] = maps.Clone(vs)
	}
	// The versions the trainers arrived with: of the arrivals planact
	// took, not of those it refused (a second arrival with other weights).
	for id, v := range r.arrivedWith {
		if r.refusedIDs[id] {
			continue
		}
		if versions[id.role] == nil {
			versions[id.role] = map[string]bool{}
		}
		versions[id.role][v] = true
	}
	for role, vs := range versions {
		s.WeightVersions[role] = slices.Sorted(maps.Keys(vs))
	}
	c := r.counts
	if !r.compacted {
		c = r.countEpisodes()
	}
	s.Acts, s.Ended, s.Quarantined = c.acts, c.ended, c.quarantined
	if r.scorer() != nil && s.Ended > 0 {
		acc, mean := c.correct/float64(s.Ended), c.rewards/float64(s.Ended)
		s.Accuracy, s.MeanReward = &acc, &mean
	}
	end := now
	if res := r.result; res != nil {
		s.Status, s.Reason, s.FinishedAt, end = res.Status, res.Reason, r.resultAt, r.resultAt
		if s.Episodes == 0 {
			s.Episodes = res.Stats.Episodes
		}
	}
	// The roles' results count the same episodes; one that holds none of
	// its samples (a failed one: they could not be delivered) counts no
	// episode figure, and the other's are taken, else the episodes' own
	// counts stand.
	scored := false
	for _, role := range bus.Roles {
		res := r.results[role]
		if res == nil {
			continue
		}
		s.Results = append(s.Results, RoleResult{Role: role, Status: res.Status, Reason: res.Reason})
		if st := res.Stats; !scored && st.Episodes > 0 && len(st.EpisodeStatus) > 0 {
			acc, mean := st.Accuracy, st.MeanReward
			s.Accuracy, s.MeanReward, scored = &acc, &mean, true
		}
	}
	if !r.startedAt.IsZero() {
		s.WallMs = end.Sub(r.startedAt).Milliseconds()
	}
	return s
}

// countEpisodes counts r's acts and ended episodes, and scores those.
func (r *rolloutState) countEpisodes() rolloutCounts {
	var c rolloutCounts
	score := r.scorer()
	for _, ep := range r.episodes {
		a := r.actCounts(ep)
		c.acts.Running += a.Running
		c.acts.Done += a.Done
		c.acts.Failed += a.Failed
		c.acts.Skipped += a.Skipped
		c.acts.Cached += a.Cached
		if ep.end == nil {
			continue
		}
		c.ended++
		if ep.end.Status == schema.EpisodeQuarantined {
			c.quarantined++
		}
		if score != nil {
			rw, ok := r.episodeReward(ep, score)
			c.rewards += rw
			if ok {
				c.correct++
			}
		}
	}
	return c
}

// add counts one act outcome of status.
func (c *ActCounts) add(status string) {
	switch status {
	case schema.ActDoneOK:
		c.Done++
	case schema.ActFailed:
		c.Failed++
	case schema.ActSkip:
		c.Skipped++
	case schema.ActCached:
		c.Cached++
	}
}

// scorer is the rollout's reward function, nil when the view cannot
// compute it (a reward server scores the rollout).
func (r *rolloutState) scorer() func(answer, label string) float64 {
	cfg := schema.Config{}
	if r.config != nil {
		cfg = *r.config
	}
	switch cfg.WithDefaults().Reward {
	case "em":
		return reward.ExactMatch
	case "f1":
		return reward.F1
	}
	return nil
}

// episodeReward scores an ended episode as the session-store does: a
// completed episode's answers against its task's label; any other ending
// scores 0. correct says whether the answer matches the label exactly.
func (r *rolloutState) episodeReward(ep *episodeState, score func(string, string) float64) (rw float64, correct bool) {
	if ep.end == nil || ep.end.Status != schema.EpisodeCompleted || ep.e >= len(r.tasks) {
		return 0, false
	}
	label := r.tasks[ep.e].Label
	return score(strings.Join(ep.end.Answers, " | "), label), reward.ExactMatch(strings.Join(ep.end.Answers, " "), label) == 1
}

// actCounts counts episode ep's acts: outcomes from ACT, and the acts the
// runs bucket says are released without an outcome yet.
func (r *rolloutState) actCounts(ep *episodeState) ActCounts {
	var c ActCounts
	for _, a := range ep.acts {
		c.add(a.Status)
	}
	// An episode that ended, or whose rollout did, runs nothing (its
	// outcomes, and the runs bucket's removal of its run states, may be
	// read a moment after: the view reads each stream on its own).
	for _, ts := range ep.turns {
		if ts.run == nil || ep.end != nil || r.result != nil {
			continue
		}
		for _, n := range ts.run.Nodes {
			if n.Status == schema.NodeReleased && ep.acts[n.Key] == nil {
				c.Running++
			}
		}
	}
	return c
}

// episodeSummary is episode ep of rollout r at time now.
func (r *rolloutState) episodeSummary(ep *episodeState, now time.Time) EpisodeSummary {
	s := EpisodeSummary{Rollout: r.n, Episode: ep.e, Status: EpisodeRunning, Acts: r.actCounts(ep)}
	if ep.e < len(r.tasks) {
		s.Question, s.Label = r.tasks[ep.e].Prompt, r.tasks[ep.e].Label
	}
	for t := range ep.turns {
		s.Turns = max(s.Turns, t)
	}
	end := now
	if ep.end != nil {
		s.Status, s.Reason, s.Answers, s.Turns, end = ep.end.Status, ep.end.Reason, ep.end.Answers, ep.end.Turns, ep.endedAt
		if score := r.scorer(); score != nil {
			rw, correct := r.episodeReward(ep, score)
			s.Reward, s.Correct = &rw, correct
		}
	} else if r.result != nil {
		// The rollout ended without this episode (its deadline, a
		// cancel): it is not running, and never ends.
		s.Status, end = EpisodeUnfinished, r.resultAt
	}
	if first := ep.turns[1]; first != nil && !first.askedAt.IsZero() {
		s.WallMs = end.Sub(first.askedAt).Milliseconds()
	}
	return s
}

// episodeSummaries lists every episode of r that the rollout has, in
// order, including those that have not produced a message yet.
func (r *rolloutState) episodeSummaries(now time.Time) []EpisodeSummary {
	count := 0
	if r.start != nil {
		count = r.start.Episodes
	}
	for e := range r.episodes {
		count = max(count, e+1)
	}
	out := make([]EpisodeSummary, 0, count)
	for e := 0; e < count; e++ {
		ep := r.episodes[e]
		if ep == nil {
			ep = &episodeState{e: e}
		}
		out = append(out, r.episodeSummary(ep, now))
	}
	return out
}

// fullEpisode is episode ep of rollout r in full.
func (r *rolloutState) fullEpisode(ep *episodeState, now time.Time) *Episode {
	out := &Episode{EpisodeSummary: r.episodeSummary(ep, now), TurnList: []Turn{}, Timeline: []Act{}, CriticalPath: []string{}}
	turns := make([]int, 0, len(ep.turns))
	for t := range ep.turns {
		turns = append(turns, t)
	}
	sort.Ints(turns)
	critical := map[string]bool{}
	for _, t := range turns {
		ts := ep.turns[t]
		if out.StartMs == 0 && !ts.askedAt.IsZero() {
			out.StartMs = ts.askedAt.UnixMilli()
		}
		turn := Turn{Turn: t, Prompt: ts.prompt, Output: ts.output, FinishReason: ts.finish, WeightVersion: ts.weightVersion, LatencyMs: ts.latencyMs}
		if t > 1 {
			turn.Prompt = ts.observation
		}
		if next := ep.turns[t+1]; next != nil {
			turn.Observation = next.observation
		}
		switch {
		case ts.answered:
			turn.Outcome, turn.Answers = OutcomeAnswer, ts.answers
		case ts.failed:
			turn.Outcome, turn.Error = OutcomeError, ts.errorMsg
		case ts.plan != nil:
			turn.Outcome = OutcomePlan
		}
		turn.Graph = ep.graph(ts, now)
		for _, id := range criticalPath(ts.plan, ep, t, now) {
			critical[nodeKey(t, id)] = true
		}
		for i := range turn.Graph.Nodes {
			turn.Graph.Nodes[i].Critical = critical[turn.Graph.Nodes[i].Key]
		}
		out.TurnList = append(out.TurnList, turn)
	}
	out.Timeline = ep.timeline(critical)
	for _, a := range out.Timeline {
		if a.Critical {
			out.CriticalPath = append(out.CriticalPath, a.Key)
		}
	}
	return out
}

// episodeCount is how many episodes r has: as started, else as its result
// says.
func (r *rolloutState) episodeCount() int {
	switch {
	case r.start != nil:
		return r.start.Episodes
	case r.result != nil:
		return r.result.Stats.Episodes
	}
	return 0
}

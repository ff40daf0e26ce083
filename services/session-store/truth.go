package sessionstore

// What a result says of itself: its status and reason made true of what it
// holds (truth), from the causes of its episodes' failures.

import (
	"fmt"
	"sort"
	"strings"

	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
)

// failures are an ended episode's failed acts by kind (a duplicate that
// failed with the act it repeats is that act's failure, counted once), and
// "reward" when its reward could not be computed.
func failures(ep *episode) map[string]int {
	out := map[string]int{}
	for _, d := range ep.acts {
		if d.Status == schema.ActFailed && d.ErrorKind != schema.ActErrDuplicate {
			out[d.ErrorKind]++
		}
	}
	if ep.rewardErr != "" {
		out["reward"]++
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// modelActs sums up an episode's acts for the actor model: the failures of
// those it was to run ("kind: error"), and how many others were answered
// from the cache or by tools that are not the actor model (HTTP, Go, a
// mode's own, as the rollout's mode names them: a vote of ensemble).
func modelActs(ep *episode, cfg schema.Config) (failed causes, cached, tools int) {
	md, _ := mode.For(cfg)
	for _, d := range ep.acts {
		tool, known := cfg.Tool(d.Tool)
		if md != nil {
			tool, known = md.Tool(cfg, d.Tool)
		}
		switch {
		case known && tool.Kind != schema.ToolActor:
			tools++
		case d.Status == schema.ActCached:
			cached++
		case d.Status == schema.ActFailed && d.ErrorKind != schema.ActErrDuplicate:
			// A duplicate that failed with the act it repeats is that
			// act's failure, counted once (as failures counts it).
			failed.add(d.ErrorKind + ": " + d.Error)
		}
	}
	return failed, cached, tools
}

// causes counts reasons.
type causes struct {
	total int
	by    map[string]int
}

func (c *causes) add(reason string) {
	if c.by == nil {
		c.by = map[string]int{}
	}
	c.total++
	c.by[reason]++
}

func (c *causes) merge(o causes) {
	for r, k := range o.by {
		for range k {
			c.add(r)
		}
	}
}

// lostTasks are the tasks a role got no sample of although their episode
// did not fail, and why (the actor: the failures of their acts).
type lostTasks struct {
	tasks int
	acts  causes
}

// most is the most frequent reason (the first in order among equals).
func (c *causes) most() (string, int) {
	cause, most := "", 0
	for r, k := range c.by {
		if k > most || k == most && r < cause {
			cause, most = r, k
		}
	}
	return cause, most
}

// truth makes a result's status and reason say what happened, for its
// role: the episodes that failed (a rollout whose episodes all failed is
// failed, not ok), the tasks the role got no sample of although their
// episode did not fail (lost: an actor whose every act failed), and a
// result without samples says why; one that claims ok or partial with no
// sample to train on while tasks failed for its role is failed. A sample
// to train on is one of a task trained for the role: the samples of a
// failed or aborted episode (their status says so, their reward of 0 is
// no score) are in the result, but do not make it ok.
func truth(r *schema.Result, eps map[int]*episode, lost lostTasks) (string, string) {
	status, reason := r.Status, r.Reason
	failed, aborted, quarantined, ended := causes{}, causes{}, causes{}, 0
	for _, ep := range eps {
		if ep.end == nil {
			continue
		}
		ended++
		switch ep.end.Status {
		case schema.EpisodeFailed:
			failed.add(ep.end.Reason)
		case schema.EpisodeAborted:
			aborted.add(ep.end.Reason) // stale weights, say: its own episode's, not a cancel of the rollout
		case schema.EpisodeQuarantined:
			quarantined.add(ep.end.Reason)
		}
	}
	var what []string
	if failed.total > 0 {
		cause, most := failed.most()
		if failed.total == len(eps) {
			what = append(what, fmt.Sprintf("all %d episodes failed (%d: %s)", len(eps), most, cause))
		} else {
			what = append(what, fmt.Sprintf("%d of %d episodes failed (%d: %s)", failed.total, len(eps), most, cause))
		}
	}
	if aborted.total > 0 {
		cause, most := aborted.most()
		what = append(what, fmt.Sprintf("%d of %d episodes aborted (%d: %s)", aborted.total, len(eps), most, cause))
	}
	if quarantined.total > 0 {
		cause, most := quarantined.most()
		what = append(what, fmt.Sprintf("%d of %d episodes quarantined, never trained on (%d: %s)", quarantined.total, len(eps), most, cause))
	}
	if lost.tasks > 0 {
		cause, most := lost.acts.most()
		if r.Role == schema.RoleActor {
			what = append(what, fmt.Sprintf("the actor got no sample of %d of %d tasks whose episode did not fail: %d of their acts failed (%d %s)",
				lost.tasks, len(eps), lost.acts.total, most, cause))
		} else {
			what = append(what, fmt.Sprintf("the %s got no sample of %d of %d tasks whose episode did not fail (%d: %s)", r.Role, lost.tasks, len(eps), most, cause))
		}
	}
	held := r.SampleCount + r.GroupSamples // those of delivered groups a result leaves out count: the trainer has them
	trainable := r.Stats.TaskStates[schema.TaskTrained]
	if r.Evaluation {
		// No samples, by design: nothing to say of them.
	} else if held == 0 && r.Stats.TaskStates[schema.TaskEmpty] > 0 && lost.tasks == 0 && failed.total == 0 {
		what = append(what, fmt.Sprintf("no %s sample: no act of the %d tasks ran the actor model", r.Role, r.Stats.TaskStates[schema.TaskEmpty]))
	} else if held > 0 && trainable == 0 {
		what = append(what, fmt.Sprintf("no %s sample to train on: its %d are all of failed or aborted episodes", r.Role, held))
	}
	if !r.Evaluation && held == 0 && len(what) == 0 && len(eps) > 0 && (status == schema.ResultOK || status == schema.ResultPartial) {
		// Filtered groups, say: nothing to train on, and the result says why.
		what = append(what, fmt.Sprintf("no %s sample: tasks %s", r.Role, statesText(r.Stats.TaskStates)))
	}
	if len(what) == 0 {
		return status, reason
	}
	if reason != "" {
		what = append([]string{reason}, what...)
	}
	switch {
	case status == schema.ResultOK && failed.total == ended && failed.total == len(eps):
		status = schema.ResultFailed
	case !r.Evaluation && (status == schema.ResultOK || status == schema.ResultPartial) && trainable == 0 &&
		(r.Stats.TaskStates[schema.TaskFailed] > 0 || aborted.total > 0 || quarantined.total > 0):
		// Nothing to train on, and not for want of asking: a result that
		// delivers nothing of what it was to deliver is not ok.
		status = schema.ResultFailed
	}
	return status, strings.Join(what, "; ")
}

// statesText lists task states with their counts, in a fixed order.
func statesText(states map[string]int) string {
	keys := make([]string, 0, len(states))
	for k := range states {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", states[k], k))
	}
	return strings.Join(parts, ", ")
}

// heldStats are the stats of r, a failed result that holds none of its
// samples (they could not be delivered or assembled), counted from what it
// holds: its tasks (episodes, task_states), the samples of the groups it
// leaves out (their tokens: groupTokens), and the rollout's times, as was
// has them. An evaluation's episodes, scored, are its own (r.Episodes):
// their figures stay. Of a training result's episodes it holds neither
// samples nor scores: no ended, completed, acts, failures, accuracy or
// means, which would claim what is not in it (acts, one actor sample
// each, among them).
func heldStats(r *schema.Result, was schema.Stats, groupTokens int) schema.Stats {
	st := schema.Stats{StartedMs: was.StartedMs, FinishedMs: was.FinishedMs, WallMs: was.WallMs}
	if r.Evaluation && len(r.Episodes) > 0 {
		st = was
	}
	st.Episodes, st.TaskStates, st.Tokens = len(r.Tasks), nil, nil
	for _, out := range r.Tasks {
		if st.TaskStates == nil {
			st.TaskStates = map[string]int{}
		}
		st.TaskStates[out.State]++
	}
	if groupTokens > 0 {
		st.Tokens = map[string]int{r.Role: groupTokens}
	}
	return st
}

package actdispatcher

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/dag"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// newRun is the run state of a freshly parsed plan: every node pending.
func newRun(d *schema.PlanDAG, schedule string) *schema.Run {
	r := &schema.Run{Rollout: d.Rollout, Episode: d.Episode, Turn: d.Turn, Schedule: schedule}
	for _, n := range d.Plan.Nodes {
		r.Nodes = append(r.Nodes, &schema.NodeState{Node: n, Key: subject.NodeKey(d.Turn, n.ID), Status: schema.NodePending})
	}
	return r
}

func byID(r *schema.Run) map[string]*schema.NodeState {
	m := make(map[string]*schema.NodeState, len(r.Nodes))
	for _, n := range r.Nodes {
		m[n.Node.ID] = n
	}
	return m
}

func byKey(r *schema.Run, key string) *schema.NodeState {
	for _, n := range r.Nodes {
		if n.Key == key {
			return n
		}
	}
	return nil
}

// advance moves the run forward after a change: nodes whose dependencies
// failed or were skipped are skipped, and ready nodes are released as the
// run's schedule allows, with their placeholders replaced by their
// dependencies' outputs. A released node that repeats a call of the episode
// (same tool, same arguments) is not run: it takes the result of the earlier
// call (prior holds those of earlier turns), or waits for it while it runs.
// advance returns the nodes to run and the nodes it answered from the cache.
func advance(r *schema.Run, prior map[string]priorAct) (run, cached []*schema.NodeState) {
	if r.Finished || r.Abandoned != nil {
		return nil, nil // an abandoned run releases nothing more (abandon.go)
	}
	// A cached node may unblock others at once: repeat until nothing changes.
	for {
		skipCascade(r)
		ready := readyNodes(r)
		if len(ready) == 0 {
			return run, cached
		}
		outputs := map[string]string{}
		for _, n := range r.Nodes {
			if n.Status == schema.NodeDone || n.Status == schema.NodeCached {
				outputs[n.Node.ID] = n.Output
			}
		}
		ids := byID(r)
		progress := false
		for _, n := range ready {
			n.Status = schema.NodeReleased
			if isVote(n, ids) {
				n.Node = mode.VoteAmong(n.Node, func(id string) bool { return answered(ids[id]) })
			}
			n.Node = plan.Substitute(n.Node, outputs)
			n.Input = n.Node.Input()
			call := callKey(n.Node)
			if p, ok := prior[call]; ok {
				n.Status, n.Output, n.CachedFrom = schema.NodeCached, p.Output, p.Key
				cached, progress = append(cached, n), true
				continue
			}
			if first := firstCall(r, n, call); first != nil {
				n.CachedFrom = first.Key
				if first.Status == schema.NodeReleased {
					continue // waits for first to finish
				}
				n.Status, n.Output = schema.NodeCached, first.Output
				cached, progress = append(cached, n), true
				continue
			}
			run = append(run, n)
		}
		if !progress {
			return run, cached
		}
	}
}

// skipCascade skips every pending node whose dependencies failed or were
// skipped, transitively. An ensemble vote is skipped only when none of its
// candidates answered: it runs among those that did.
func skipCascade(r *schema.Run) {
	ids := byID(r)
	for changed := true; changed; {
		changed = false
		for _, n := range r.Nodes {
			if n.Status != schema.NodePending {
				continue
			}
			if isVote(n, ids) {
				if why, none := noCandidate(n, ids); none {
					n.Status, n.Error, changed = schema.NodeSkipped, why, true
				}
				continue
			}
			for _, dep := range n.Node.Deps {
				if d := ids[dep]; d != nil && (d.Status == schema.NodeFailed || d.Status == schema.NodeSkipped) {
					n.Status, n.Error, changed = schema.NodeSkipped, fmt.Sprintf("dependency %s %s", dep, d.Status), true
					break
				}
			}
		}
	}
}

// readyNodes lists the pending nodes the run's schedule lets go now.
func readyNodes(r *schema.Run) []*schema.NodeState {
	ids := byID(r)
	var ready []*schema.NodeState
	for _, n := range r.Nodes {
		if n.Status != schema.NodePending {
			continue
		}
		if vote := isVote(n, ids); vote && candidatesEnded(n, ids) || !vote && depsDone(n, ids) {
			ready = append(ready, n)
		}
	}
	switch r.Schedule {
	case schema.ScheduleSequential:
		for _, n := range r.Nodes {
			if n.Status == schema.NodeReleased {
				return nil // one at a time
			}
		}
		if len(ready) > 1 {
			ready = ready[:1]
		}
	case schema.ScheduleLevels:
		ready = openLevel(r, ready)
	}
	return ready
}

// priorAct is the successful result of a call made in an earlier turn.
type priorAct struct {
	Key    string
	Output string
}

// callKey identifies a call for the duplicate guard: the tool and its
// arguments as executed (JSON encoding sorts map keys).
func callKey(n plan.Node) string {
	args, _ := json.Marshal(n.Args)
	return n.Tool + "\x00" + string(args)
}

// firstCall finds the node of r, other than n, that makes the same call and
// is running or has succeeded: the one n is a duplicate of. Nodes that wait
// on another (CachedFrom set) are never a first call.
func firstCall(r *schema.Run, n *schema.NodeState, call string) *schema.NodeState {
	for _, m := range r.Nodes {
		if m == n || m.CachedFrom != "" {
			continue
		}
		switch m.Status {
		case schema.NodeReleased, schema.NodeDone:
			if callKey(m.Node) == call {
				return m
			}
		}
	}
	return nil
}

// resolveWaiters gives the nodes waiting on the act of node first its
// outcome: cached when it succeeded, failed when it failed.
func resolveWaiters(r *schema.Run, first *schema.NodeState) []*schema.NodeState {
	var out []*schema.NodeState
	for _, n := range r.Nodes {
		if n.Status != schema.NodeReleased || n.CachedFrom != first.Key {
			continue
		}
		if first.Status == schema.NodeDone {
			n.Status, n.Output = schema.NodeCached, first.Output
		} else {
			n.Status, n.Error = schema.NodeFailed, "duplicate of "+first.Key+", which failed: "+first.Error
		}
		out = append(out, n)
	}
	return out
}

func depsDone(n *schema.NodeState, ids map[string]*schema.NodeState) bool {
	for _, dep := range n.Node.Deps {
		d := ids[dep]
		if d == nil || (d.Status != schema.NodeDone && d.Status != schema.NodeCached) {
			return false
		}
	}
	return true
}

// isVote says whether n is an ensemble vote: of tool vote, every
// dependency a candidate of its step, and while pending Expand's
// (mode.IsVote: its arguments still the placeholders VoteAmong reads;
// released, they hold the answers). A vote waits for every candidate to
// end and runs among those that answered; it is skipped only when none did.
func isVote(n *schema.NodeState, ids map[string]*schema.NodeState) bool {
	if n.Node.Tool != mode.VoteTool || len(n.Node.Deps) == 0 || n.Status == schema.NodePending && !mode.IsVote(n.Node) {
		return false
	}
	for _, dep := range n.Node.Deps {
		d := ids[dep]
		if d == nil {
			return false
		}
		if step, ok := mode.StepOf(d.Node); !ok || step != n.Node.ID {
			return false
		}
	}
	return true
}

// answered says whether node d succeeded: it has an output, empty or not.
func answered(d *schema.NodeState) bool {
	return d != nil && (d.Status == schema.NodeDone || d.Status == schema.NodeCached)
}

// candidatesEnded says whether every candidate of the vote n has ended and
// one at least answered: the vote may run.
func candidatesEnded(n *schema.NodeState, ids map[string]*schema.NodeState) bool {
	some := false
	for _, dep := range n.Node.Deps {
		d := ids[dep]
		if d == nil || !d.Terminal() {
			return false
		}
		some = some || answered(d)
	}
	return some
}

// noCandidate says whether every candidate of the vote n failed or was
// skipped, and so: the vote has nothing to count.
func noCandidate(n *schema.NodeState, ids map[string]*schema.NodeState) (string, bool) {
	var how []string
	for _, dep := range n.Node.Deps {
		d := ids[dep]
		if d == nil || (d.Status != schema.NodeFailed && d.Status != schema.NodeSkipped) {
			return "", false
		}
		how = append(how, dep+" "+d.Status)
	}
	return "no candidate answered (" + strings.Join(how, ", ") + ")", true
}

// stepUnanswered says whether the ensemble step of run r (the candidates
// of planned node step) is left without an answer: every candidate has
// ended, and none answered. With a vote, a candidate that succeeded is an
// answer (the vote then decides, failing when every answer is empty);
// without one (ensemble_pick planner) an empty answer is none, as the
// planner is not offered it.
func stepUnanswered(r *schema.Run, step string) bool {
	ids := byID(r)
	voted := ids[step] != nil && isVote(ids[step], ids)
	for _, n := range r.Nodes {
		if s, ok := mode.StepOf(n.Node); !ok || s != step {
			continue
		}
		if !n.Terminal() || answered(n) && (voted || !mode.NoAnswer(n.Output)) {
			return false
		}
	}
	return true
}

// stopsTurn says whether the outcome just recorded for node n stops the
// turn under a failure policy that stops at the first failure, and after
// what. A node that failed does; a candidate of an ensemble step does only
// once its step is left without an answer (stepUnanswered), or when it was
// refused as stale or drifted (the episode ends at the turn's end): until
// then its siblings may still answer, and the step with them. What waits on n
// (its duplicates, which take its outcome) counts with it.
func stopsTurn(r *schema.Run, n *schema.NodeState) (string, bool) {
	for _, m := range r.Nodes {
		if m != n && (n.Key == "" || m.CachedFrom != n.Key || !m.Terminal()) {
			continue
		}
		step, candidate := mode.StepOf(m.Node)
		switch {
		case m == n && m.Status == schema.NodeFailed && (!candidate || m.ErrorKind == schema.ActErrStale || m.ErrorKind == schema.ActErrTokenDrift):
			return m.Node.ID + " failed", true // a stale or drifted act ends the episode (finishTurn), a candidate's too
		case !candidate:
			// Not a candidate: n's own failure decides (above); a
			// duplicate that took it adds nothing.
		case stepUnanswered(r, step):
			if m.Status == schema.NodeFailed {
				return m.Node.ID + " failed", true
			}
			return "the candidates of " + step + " gave no answer", true
		}
	}
	return "", false
}

// stepFailures lists the failures failure_policy acts on in a finished
// run, as "node: why": every node that failed, but a candidate of an
// ensemble step only when its step was left without an answer (then its
// empty answers too); a step whose candidates answered is answered,
// however many of them failed.
func stepFailures(r *schema.Run) []string {
	var failed []string
	for _, n := range r.Nodes {
		step, candidate := mode.StepOf(n.Node)
		switch {
		case n.Status == schema.NodeFailed && (!candidate || stepUnanswered(r, step)):
			failed = append(failed, n.Node.ID+": "+n.Error)
		case candidate && answered(n) && mode.NoAnswer(n.Output) && stepUnanswered(r, step):
			failed = append(failed, n.Node.ID+": answered nothing")
		}
	}
	return failed
}

// openLevel keeps the ready nodes of the lowest topological level that is
// not finished: GAP's level-by-level execution, a barrier between levels.
func openLevel(r *schema.Run, ready []*schema.NodeState) []*schema.NodeState {
	// A streamed plan's partial may hold a node whose dependency is not in
	// it yet (written later, its call still to come): that node, and those
	// that depend on it, have no level yet. Not ready before the node they
	// wait for is there, they are left out of the levels until it is; the
	// levels of the others stand. (Before, the unknown dependency failed
	// the levels, and the whole run was released eagerly.)
	placed := make(map[string]bool, len(r.Nodes))
	for _, n := range r.Nodes {
		placed[n.Node.ID] = true
	}
	for changed := true; changed; {
		changed = false
		for _, n := range r.Nodes {
			if !placed[n.Node.ID] {
				continue
			}
			for _, dep := range n.Node.Deps {
				if !placed[dep] {
					placed[n.Node.ID], changed = false, true
					break
				}
			}
		}
	}
	var ids []string
	deps := make(map[string][]string, len(r.Nodes))
	for _, n := range r.Nodes {
		if placed[n.Node.ID] {
			ids = append(ids, n.Node.ID)
			deps[n.Node.ID] = n.Node.Deps
		}
	}
	levels, err := dag.Levels(ids, deps)
	if err != nil {
		return ready // the parser rejects cycles; eager is the safe fallback
	}
	nodes := byID(r)
	for _, level := range levels {
		open := false
		for _, id := range level {
			if !nodes[id].Terminal() {
				open = true
			}
		}
		if !open {
			continue
		}
		in := map[string]bool{}
		for _, id := range level {
			in[id] = true
		}
		var keep []*schema.NodeState
		for _, n := range ready {
			if in[n.Node.ID] {
				keep = append(keep, n)
			}
		}
		return keep
	}
	return ready
}

// released lists the acts in flight (released, not waiting on another
// act) and the nodes answered from the cache: what a write that released
// them implied publishing.
func released(r *schema.Run) (run, cached []*schema.NodeState) {
	for _, n := range r.Nodes {
		switch {
		case n.Status == schema.NodeReleased && n.CachedFrom == "":
			run = append(run, n)
		case n.CachedFrom != "" && n.Terminal():
			cached = append(cached, n)
		}
	}
	return run, cached
}

// allTerminal reports whether every node of the run has finished.
func allTerminal(r *schema.Run) bool {
	for _, n := range r.Nodes {
		if !n.Terminal() {
			return false
		}
	}
	return true
}

// skipPending ends every node not yet released, for policies that stop a
// turn at its first failure.
func skipPending(r *schema.Run, why string) {
	for _, n := range r.Nodes {
		if n.Status == schema.NodePending {
			n.Status, n.Error = schema.NodeSkipped, why
		}
	}
}

// Observation renders what a turn's acts observed, for the plan_act
// planner's next turn (mode.PlanAct.Observation; a rollout's mode renders
// its own).
func Observation(r *schema.Run) string { return mode.PlanAct{}.Observation(r, schema.Config{}) }

// ErrorObservation tells the planner why its output could not be used.
func ErrorObservation(msg string) string { return mode.ErrorObservation(msg) }

package actdispatcher

import (
	"slices"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// applyPlan brings the run state r of a turn up to date with the plan d:
// it creates the run from d when there is none, and otherwise merges into
// it the nodes it does not have yet, in d's order. With streamed plans a
// turn gets several DAGs, the partial ones (each the complete nodes of the
// plan so far) and the final one, in any order and on any replica; only
// the final one completes the run, and once it has, later partials change
// nothing.
//
// The final plan is authoritative for the nodes not yet released: a pending
// node takes the final version of its node, and a pending node the final
// plan does not have is dropped. A node already released stays as it ran;
// when the final plan says something else for its id, conflicts names it.
// Nodes added after a failure that stopped the turn (policy replan or fail)
// are skipped at once, as skipPending did to the nodes pending then.
func applyPlan(r *schema.Run, exists bool, d *schema.PlanDAG, schedule, policy string) (changed bool, conflicts []string) {
	if !exists {
		*r = *newRun(d, schedule)
		r.Complete = !d.Partial
		return true, nil
	}
	if r.Complete || r.Finished {
		return false, nil
	}
	stoppedBy := ""
	if policy != schema.PolicySkip {
		for _, n := range r.Nodes {
			if n.Status == schema.NodeFailed && n.CachedFrom == "" {
				stoppedBy = n.Node.ID
				break
			}
		}
	}
	have := byID(r)
	outputs := map[string]string{}
	for _, n := range r.Nodes {
		if n.Status == schema.NodeDone || n.Status == schema.NodeCached {
			outputs[n.Node.ID] = n.Output
		}
	}
	for _, n := range d.Plan.Nodes {
		cur := have[n.ID]
		switch {
		case cur == nil:
			ns := &schema.NodeState{Node: n, Key: subject.NodeKey(d.Turn, n.ID), Status: schema.NodePending}
			if stoppedBy != "" {
				ns.Status, ns.Error = schema.NodeSkipped, "not run: the turn stopped after "+stoppedBy+" failed"
			}
			r.Nodes = append(r.Nodes, ns)
			changed = true
		case d.Partial:
			// Complete nodes do not change while the plan grows; a stale
			// partial must not undo what a later one brought.
		case cur.Status == schema.NodePending:
			if !sameNode(cur.Node, n) {
				cur.Node, changed = n, true
			}
		case !sameCall(cur.Node, n, outputs):
			conflicts = append(conflicts, n.ID)
		}
	}
	if d.Partial {
		return changed, nil
	}
	final := make(map[string]bool, len(d.Plan.Nodes))
	for _, n := range d.Plan.Nodes {
		final[n.ID] = true
	}
	r.Nodes = slices.DeleteFunc(r.Nodes, func(n *schema.NodeState) bool {
		drop := !final[n.Node.ID] && n.Status == schema.NodePending
		changed = changed || drop
		return drop
	})
	for _, n := range r.Nodes {
		if !final[n.Node.ID] {
			conflicts = append(conflicts, n.Node.ID) // released from a partial plan the final one dropped
		}
	}
	r.Complete = true
	return true, conflicts
}

// sameNode reports whether a and b are the same node as planned.
func sameNode(a, b plan.Node) bool {
	return a.Tool == b.Tool && slices.Equal(a.Deps, b.Deps) && callKey(a) == callKey(b) && a.Description == b.Description
}

// sameCall reports whether released, a node as it was released (its
// placeholders replaced by outputs), is the call planned would make.
func sameCall(released, planned plan.Node, outputs map[string]string) bool {
	return slices.Equal(released.Deps, planned.Deps) && callKey(released) == callKey(plan.Substitute(planned, outputs))
}

package actdispatcher

import (
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/dag"
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
// run's schedule allows. It returns the nodes it released, with their
// placeholders replaced by their dependencies' outputs.
func advance(r *schema.Run) []*schema.NodeState {
	if r.Finished {
		return nil
	}
	ids := byID(r)
	// Skips cascade: repeat until nothing changes.
	for changed := true; changed; {
		changed = false
		for _, n := range r.Nodes {
			if n.Status != schema.NodePending {
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
	var ready []*schema.NodeState
	for _, n := range r.Nodes {
		if n.Status == schema.NodePending && depsDone(n, ids) {
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
	outputs := map[string]string{}
	for _, n := range r.Nodes {
		if n.Status == schema.NodeDone || n.Status == schema.NodeCached {
			outputs[n.Node.ID] = n.Output
		}
	}
	for _, n := range ready {
		n.Status = schema.NodeReleased
		n.Node = plan.Substitute(n.Node, outputs)
		n.Input = n.Node.Input()
	}
	return ready
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

// openLevel keeps the ready nodes of the lowest topological level that is
// not finished: GAP's level-by-level execution, a barrier between levels.
func openLevel(r *schema.Run, ready []*schema.NodeState) []*schema.NodeState {
	ids := make([]string, len(r.Nodes))
	deps := make(map[string][]string, len(r.Nodes))
	for i, n := range r.Nodes {
		ids[i] = n.Node.ID
		deps[n.Node.ID] = n.Node.Deps
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

// released lists the nodes released but not finished: the acts in flight.
func released(r *schema.Run) []*schema.NodeState {
	var out []*schema.NodeState
	for _, n := range r.Nodes {
		if n.Status == schema.NodeReleased {
			out = append(out, n)
		}
	}
	return out
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

// Observation renders what a turn's acts observed, for the planner's next
// turn: one line per node, `<id> <tool>("<input>") -> <output>`.
func Observation(r *schema.Run) string {
	var b strings.Builder
	b.WriteString("\n<observation>\n")
	for _, n := range r.Nodes {
		input := n.Input
		if input == "" {
			input = n.Node.Input()
		}
		fmt.Fprintf(&b, "%s %s(%q) -> ", n.Node.ID, n.Node.Tool, input)
		switch n.Status {
		case schema.NodeDone, schema.NodeCached:
			b.WriteString(oneLine(n.Output))
		case schema.NodeFailed:
			b.WriteString("ERROR: " + oneLine(n.Error))
		default:
			b.WriteString("SKIPPED: " + oneLine(n.Error))
		}
		b.WriteByte('\n')
	}
	b.WriteString("</observation>\n")
	return b.String()
}

// ErrorObservation tells the planner why its output could not be used.
func ErrorObservation(msg string) string {
	return "\n<observation>\nYour plan could not be used: " + oneLine(msg) + "\n</observation>\n"
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", " ")
	return strings.ReplaceAll(s, "\n", " ")
}

package view

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/planact/planact/pkg/dag"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// nodeKey is the episode-unique key of node id of turn t, as act subjects
// and the runs bucket name it.
func nodeKey(t int, id string) string { return subject.NodeKey(t, id) }

// graph is a turn's plan with each node's status: its outcome on ACT, else
// what the turn's run says, else pending.
func (ep *episodeState) graph(ts *turnState, now time.Time) Graph {
	g := Graph{Nodes: []Node{}, Edges: []Edge{}}
	if ts.plan == nil {
		return g
	}
	run := map[string]*schema.NodeState{}
	if ts.run != nil {
		for _, n := range ts.run.Nodes {
			run[n.Key] = n
		}
	}
	for _, pn := range ts.plan.Nodes {
		key := nodeKey(ts.turn, pn.ID)
		n := Node{ID: pn.ID, Key: key, Tool: pn.Tool, Deps: pn.Deps, Status: ActPending, Input: args(pn)}
		if a := ep.acts[key]; a != nil {
			n.Status, n.Output, n.Error = a.Status, a.Output, a.Error
			if a.Input != "" {
				n.Input = a.Input
			}
		} else if rn := run[key]; rn != nil {
			n.Status = rn.Status
			if rn.Status == schema.NodeReleased {
				n.Status = ActRunning
			}
			n.Output, n.Error = rn.Output, rn.Error
			if rn.Input != "" {
				n.Input = rn.Input
			}
		}
		g.Nodes = append(g.Nodes, n)
		for _, d := range pn.Deps {
			g.Edges = append(g.Edges, Edge{From: d, To: pn.ID})
		}
	}
	return g
}

// args shows a node's arguments as the planner wrote them.
func args(n plan.Node) string {
	if len(n.Args) == 0 {
		return ""
	}
	b, err := json.Marshal(n.Args)
	if err != nil {
		return ""
	}
	return string(b)
}

// criticalPath is the dependency chain of a turn's plan whose acts took
// longest (released to ended; a running act counts until now).
func criticalPath(p *plan.Plan, ep *episodeState, turn int, now time.Time) []string {
	if p == nil || len(p.Nodes) == 0 {
		return nil
	}
	ids := make([]string, len(p.Nodes))
	deps := make(map[string][]string, len(p.Nodes))
	for i, n := range p.Nodes {
		ids[i], deps[n.ID] = n.ID, n.Deps
	}
	running := map[string]int64{}
	if ts := ep.turns[turn]; ts != nil && ts.run != nil {
		for _, n := range ts.run.Nodes {
			if n.Status == schema.NodeReleased {
				running[n.Key] = n.ReleasedMs
			}
		}
	}
	cost := func(id string) float64 {
		key := nodeKey(turn, id)
		// Every node costs a little, so that a chain of instant acts
		// (cached, skipped) is still longer than a part of it.
		c := 1e-3
		if a := ep.acts[key]; a != nil && a.EndedMs > 0 && a.ReleasedMs > 0 {
			c += float64(a.EndedMs - a.ReleasedMs)
		} else if rel, ok := running[key]; ok && rel > 0 {
			c += float64(now.UnixMilli() - rel)
		}
		return c
	}
	path, _ := dag.CriticalPath(ids, deps, cost)
	return path
}

// timeline lists an episode's acts, outcomes and running ones, by release.
func (ep *episodeState) timeline(critical map[string]bool) []Act {
	out := []Act{}
	for key, a := range ep.acts {
		out = append(out, Act{
			Key: key, Turn: a.Turn, Node: a.NodeID, Tool: a.Tool, Status: a.Status,
			ReleasedMs: a.ReleasedMs, StartedMs: a.StartedMs, EndedMs: a.EndedMs,
			Attempts: a.Attempts, Retries: max(a.Attempts-1, 0), Replica: a.Replica, ErrorKind: a.ErrorKind,
			Critical: critical[key],
		})
	}
	for t, ts := range ep.turns {
		if ts.run == nil {
			continue
		}
		for _, n := range ts.run.Nodes {
			if n.Status != schema.NodeReleased || ep.acts[n.Key] != nil {
				continue
			}
			out = append(out, Act{Key: n.Key, Turn: t, Node: n.Node.ID, Tool: n.Node.Tool, Status: ActRunning, ReleasedMs: n.ReleasedMs, Critical: critical[n.Key]})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Turn != b.Turn {
			return a.Turn < b.Turn
		}
		if a.ReleasedMs != b.ReleasedMs {
			return a.ReleasedMs < b.ReleasedMs
		}
		return a.Key < b.Key
	})
	return out
}

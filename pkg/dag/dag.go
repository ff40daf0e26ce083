// Package dag holds the graph algorithms that plans and the act scheduler
// share: topological levels, cycle detection, depth and critical path over a
// set of ids with dependency lists.
//
// A graph is given as ids (in a stable order, which every result follows)
// and deps, where deps[id] lists the ids that id depends on. Ids that appear
// only in deps, not in ids, are unknown dependencies.
package dag

import (
	"fmt"
	"strings"
)

// CycleError reports a dependency cycle.
type CycleError struct {
	// Cycle is closed: its first and last ids are the same, and every id
	// depends on the one before it (data flows left to right).
	Cycle []string
}

func (e *CycleError) Error() string {
	return "cycle: " + strings.Join(e.Cycle, " -> ")
}

// UnknownError reports a dependency on an id that is not in the graph.
type UnknownError struct {
	ID  string // the node that has the dependency
	Dep string // the missing id
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("%s depends on unknown %s", e.ID, e.Dep)
}

// check returns the first unknown dependency, in id order.
func check(ids []string, deps map[string][]string) error {
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	for _, id := range ids {
		for _, d := range deps[id] {
			if !known[d] {
				return &UnknownError{ID: id, Dep: d}
			}
		}
	}
	return nil
}

// Levels groups ids into topological levels (Kahn's algorithm): level 0
// holds the ids without dependencies, level k the ids whose dependencies are
// all in levels below k. Within a level ids keep the order of ids. It fails
// with *UnknownError or *CycleError.
func Levels(ids []string, deps map[string][]string) ([][]string, error) {
	if err := check(ids, deps); err != nil {
		return nil, err
	}
	level, err := levelOf(ids, deps)
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, id := range ids {
		l := level[id]
		for len(out) <= l {
			out = append(out, nil)
		}
		out[l] = append(out[l], id)
	}
	return out, nil
}

// levelOf computes each id's level with Kahn's algorithm; duplicate
// dependencies count once. Unknown dependencies are ignored.
func levelOf(ids []string, deps map[string][]string) (map[string]int, error) {
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	indeg := make([]int, len(ids))
	users := make([][]int, len(ids)) // users[i]: nodes that depend on ids[i]
	for i, id := range ids {
		seen := map[int]bool{}
		for _, d := range deps[id] {
			j, ok := index[d]
			if !ok || seen[j] {
				continue
			}
			seen[j] = true
			indeg[i]++
			users[j] = append(users[j], i)
		}
	}
	level := make(map[string]int, len(ids))
	queue := make([]int, 0, len(ids))
	for i := range ids {
		if indeg[i] == 0 {
			queue = append(queue, i)
			level[ids[i]] = 0
		}
	}
	for k := 0; k < len(queue); k++ {
		i := queue[k]
		for _, u := range users[i] {
			if l := level[ids[i]] + 1; l > level[ids[u]] {
				level[ids[u]] = l
			}
			indeg[u]--
			if indeg[u] == 0 {
				queue = append(queue, u)
			}
		}
	}
	if len(queue) < len(ids) {
		return nil, &CycleError{Cycle: FindCycle(ids, deps)}
	}
	return level, nil
}

// FindCycle returns a dependency cycle, closed (first id == last id) and in
// data-flow order (each id depends on the one before it), or nil if there is
// none. Unknown dependencies are ignored. The search is deterministic: it
// starts from ids in order, so the same graph always yields the same cycle.
func FindCycle(ids []string, deps map[string][]string) []string {
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(ids))
	type frame struct{ node, next int }
	for start := range ids {
		if color[start] != white {
			continue
		}
		// Iterative DFS along dependency edges; stack holds the current path.
		stack := []frame{{start, 0}}
		color[start] = grey
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			ds := deps[ids[top.node]]
			if top.next >= len(ds) {
				color[top.node] = black
				stack = stack[:len(stack)-1]
				continue
			}
			j, ok := index[ds[top.next]]
			top.next++
			if !ok {
				continue
			}
			switch color[j] {
			case white:
				color[j] = grey
				stack = append(stack, frame{j, 0})
			case grey:
				// The path from j to the top depends, step by step, on the
				// next one; reverse it to get data-flow order.
				k := len(stack) - 1
				for stack[k].node != j {
					k--
				}
				cycle := make([]string, 0, len(stack)-k+1)
				for m := len(stack) - 1; m >= k; m-- {
					cycle = append(cycle, ids[stack[m].node])
				}
				cycle = append(cycle, cycle[0])
				return rotate(cycle, index)
			}
		}
	}
	return nil
}

// rotate makes a closed cycle start at its id that comes first in ids, so
// that the cycle reads the same whichever node the search entered it by.
func rotate(cycle []string, index map[string]int) []string {
	open := cycle[:len(cycle)-1]
	best := 0
	for i, id := range open {
		if index[id] < index[open[best]] {
			best = i
		}
	}
	out := make([]string, 0, len(cycle))
	out = append(out, open[best:]...)
	out = append(out, open[:best]...)
	return append(out, out[0])
}

// Depth is the number of nodes on the longest dependency chain (0 for an
// empty graph). It fails like Levels.
func Depth(ids []string, deps map[string][]string) (int, error) {
	lv, err := Levels(ids, deps)
	if err != nil {
		return 0, err
	}
	return len(lv), nil
}

// CriticalPath returns the dependency chain with the largest total cost and
// that total, in execution order. cost nil counts 1 per node. Among chains
// of equal cost the one ending at the earliest id (and reached through the
// earliest dependencies) wins. It returns nil, 0 if the graph has a cycle or
// an unknown dependency.
func CriticalPath(ids []string, deps map[string][]string, cost func(id string) float64) ([]string, float64) {
	lv, err := Levels(ids, deps)
	if err != nil || len(ids) == 0 {
		return nil, 0
	}
	if cost == nil {
		cost = func(string) float64 { return 1 }
	}
	best := make(map[string]float64, len(ids))
	prev := make(map[string]string, len(ids))
	for _, level := range lv {
		for _, id := range level {
			var base float64
			from, have := "", false
			for _, d := range deps[id] {
				if !have || best[d] > base {
					base, from, have = best[d], d, true
				}
			}
			best[id] = base + cost(id)
			if have {
				prev[id] = from
			}
		}
	}
	end := ""
	for _, id := range ids {
		if end == "" || best[id] > best[end] {
			end = id
		}
	}
	var path []string
	for id, ok := end, true; ok; id, ok = prev[id] {
		path = append(path, id)
	}
	for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
		path[i], path[j] = path[j], path[i]
	}
	return path, best[end]
}

package main

import (
	"container/heap"
	"slices"
	"time"
)

// RolloutWork is one rollout's episodes, by group, as the bound sees them.
type RolloutWork struct {
	Rollout int64
	Groups  [][]Work // Groups[g]: the work of each copy of task g
	// Target is how many complete groups end the rollout (target_groups);
	// len(Groups) when it waits for all.
	Target int
}

// EngineBound is the capacity term of the bound for one engine.
type EngineBound struct {
	Limit int `json:"limit"`
	// WorkS is the least engine time the rollouts need: for each rollout,
	// the Target groups with the least work on this engine.
	WorkS float64 `json:"work_s"`
	// HeadTailS is what must happen before any and after every generation
	// of this engine (for the actor: the shortest first planner turn and
	// the shortest last one); PausedS the weight swaps, during which the
	// role generates nothing.
	HeadTailS float64 `json:"head_tail_s"`
	PausedS   float64 `json:"paused_s"`
	// BoundS = WorkS / Limit + max(HeadTailS, PausedS).
	BoundS float64 `json:"bound_s"`
}

// Bound is the engine-bound lower bound of a run's makespan: no scheduler,
// however clever, with the same engines (limits) and the same drawn
// latencies, can end the run sooner.
type Bound struct {
	S       float64 `json:"s"`
	Binding string  `json:"binding"` // critical path, planner engine or actor engine
	// CriticalPathS: for each rollout, the Target-th shortest group
	// critical path (a group's is its longest episode's); the largest.
	CriticalPathS float64     `json:"critical_path_s"`
	Planner       EngineBound `json:"planner"`
	Actor         EngineBound `json:"actor"`
}

// LowerBound computes the bound of rollouts released together at time 0 on
// engines that serve limits (planner, actor) generations at once, with the
// roles' generation paused for paused (planner, actor) in all.
//
// Why it is sound: an episode's planner turns and acts form a chain of
// DAGs (turn t's acts wait for turn t's plan, turn t+1's plan for all of
// turn t's acts), so no episode ends before its critical path; a rollout
// that ends with K complete groups ends no sooner than its K-th shortest
// group critical path. An engine that serves N at once does at most N
// seconds of generation per second, so it needs its work ÷ N; the work of
// any K groups is at least that of the K groups with the least work on
// that engine. The actor's work also lies between the end of some
// episode's first planner turn and the start of some episode's last one
// (head + tail), and no generation of a role runs while its trainer swaps
// weights (Pause answers once none runs; Resume follows the swap), so an
// engine's term adds the larger of the two. The bound is the largest of
// these terms, each a lower bound on its own.
func LowerBound(rollouts []RolloutWork, limits [2]int, paused [2]time.Duration) Bound {
	var b Bound
	for _, r := range rollouts {
		var cps []time.Duration
		for _, g := range r.Groups {
			var cp time.Duration
			for _, w := range g {
				cp = max(cp, w.CriticalPath)
			}
			cps = append(cps, cp)
		}
		slices.Sort(cps)
		if r.Target > 0 && r.Target <= len(cps) {
			b.CriticalPathS = max(b.CriticalPathS, cps[r.Target-1].Seconds())
		}
	}
	engine := func(role int) EngineBound {
		eb := EngineBound{Limit: limits[role], PausedS: paused[role].Seconds()}
		head, tail := time.Duration(-1), time.Duration(-1)
		for _, r := range rollouts {
			var works []time.Duration
			for _, g := range r.Groups {
				var s time.Duration
				for _, w := range g {
					if role == 0 {
						s += w.Planner
					} else {
						s += w.Actor
					}
					if role == 1 && w.Acts > 0 {
						if head < 0 || w.Head < head {
							head = w.Head
						}
						if tail < 0 || w.Tail < tail {
							tail = w.Tail
						}
					}
				}
				works = append(works, s)
			}
			slices.Sort(works)
			for _, s := range works[:min(r.Target, len(works))] {
				eb.WorkS += s.Seconds()
			}
		}
		if role == 1 && eb.WorkS > 0 && head >= 0 {
			eb.HeadTailS = (head + tail).Seconds()
		}
		if eb.WorkS > 0 {
			eb.BoundS = eb.WorkS/float64(max(eb.Limit, 1)) + max(eb.HeadTailS, eb.PausedS)
		}
		return eb
	}
	b.Planner, b.Actor = engine(0), engine(1)
	b.S, b.Binding = b.CriticalPathS, "critical path"
	if b.Planner.BoundS > b.S {
		b.S, b.Binding = b.Planner.BoundS, "planner engine"
	}
	if b.Actor.BoundS > b.S {
		b.S, b.Binding = b.Actor.BoundS, "actor engine"
	}
	return b
}

// Replay is the run played again without planact: every episode released
// at time 0, each generation sent the instant it may run (acts as soon as
// their dependencies are done, the next turn as soon as the plan's acts
// are), engines serving their limit at once in an Order, rollouts ending
// at their target groups (the rest stopped at once), and after each
// rollout but the last a weight swap of swap per role. It is what an eager
// scheduler with zero coordination cost would take: not a bound (a
// smarter order could beat it), but a schedule that exists.
type Replay struct {
	S float64 `json:"s"`
	// RolloutS is when each rollout ended.
	RolloutS []float64 `json:"rollout_s"`
	// PeakInFlight is the most generations each engine (planner, actor)
	// served at once: what the workload gives it to do when every
	// generation is sent the instant it may run.
	PeakInFlight [2]int `json:"peak_in_flight"`
}

// replayEvent is a generation that ends, or a swap that ends.
type replayEvent struct {
	at   time.Duration
	seq  int // ties in order of scheduling
	gen  *replayGen
	run  int // which start of gen ends (a gen aborted by a swap starts again)
	swap int // role+1 whose swap ends; 0: a generation
}

type replayHeap []replayEvent

func (h replayHeap) Len() int { return len(h) }
func (h replayHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].seq < h[j].seq)
}
func (h replayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *replayHeap) Push(x any)   { *h = append(*h, x.(replayEvent)) }
func (h *replayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type replayGen struct {
	role    int
	ep      *replayEpisode
	turn    int // 1-based
	act     int // -1: planner
	service time.Duration
	run     int // starts so far
	// left is the episode's longest path from this generation's start to
	// its end; seq the order it was first sent in.
	left time.Duration
	seq  int
}

// Order is which waiting generation an engine of a replay serves next.
type Order int

const (
	// InArrival: in the order sent, as planact's engines are served.
	InArrival Order = iota
	// LongestPathFirst: the one whose episode has the longest path left
	// (which knows the drawn times: no real scheduler can).
	LongestPathFirst
	// OldestRolloutFirst: the earlier rollout's first, then in the order
	// sent (what an asynchronous trainer, which trains on rollout N while
	// N+1 runs, would want).
	OldestRolloutFirst
)

// genQueue holds the generations waiting for an engine slot, in an Order.
type genQueue struct {
	gens  []*replayGen
	order Order
}

func (q *genQueue) Len() int { return len(q.gens) }
func (q *genQueue) Less(i, j int) bool {
	a, b := q.gens[i], q.gens[j]
	switch {
	case q.order == LongestPathFirst && a.left != b.left:
		return a.left > b.left
	case q.order == OldestRolloutFirst && a.ep.rollout != b.ep.rollout:
		return a.ep.rollout < b.ep.rollout
	}
	return a.seq < b.seq
}
func (q *genQueue) Swap(i, j int) { q.gens[i], q.gens[j] = q.gens[j], q.gens[i] }
func (q *genQueue) Push(x any)    { q.gens = append(q.gens, x.(*replayGen)) }
func (q *genQueue) Pop() any {
	x := q.gens[len(q.gens)-1]
	q.gens = q.gens[:len(q.gens)-1]
	return x
}

// pathsLeft is, for every generation of an episode, its longest path to
// the episode's end: [turn][0] the planner's, [turn][1+k] act k's.
func pathsLeft(ep *Episode) [][]time.Duration {
	out := make([][]time.Duration, len(ep.Turns))
	var after time.Duration // from the end of turn t's acts to the episode's end
	for t := len(ep.Turns) - 1; t >= 0; t-- {
		turn := ep.Turns[t]
		out[t] = make([]time.Duration, 1+len(turn.Acts))
		// An act's path: itself, the longest chain of its dependents, then
		// the rest of the episode.
		for k := len(turn.Acts) - 1; k >= 0; k-- {
			tail := after
			for j := k + 1; j < len(turn.Acts); j++ {
				if slices.Contains(turn.Acts[j].Deps, k) {
					tail = max(tail, out[t][1+j])
				}
			}
			out[t][1+k] = turn.Acts[k].Gen.Service() + tail
		}
		out[t][0] = turn.Planner.Service() + longestChain(turn.Acts) + after
		after = out[t][0]
	}
	return out
}

type replayEpisode struct {
	script  *Episode
	rollout int
	group   int
	done    []bool // acts of the current turn done
	undone  int    // acts of the current turn not done
	stopped bool
	left    [][]time.Duration // pathsLeft
}

// ReplayRun plays rollouts (episodes in index order per rollout, groups
// by Model.Group) on engines of limits, swapping weights for swap after
// each rollout but the last (abort: generations running then are stopped
// and sent again after the swap; else the swap waits for them), engines
// serving the waiting generations in order.
func ReplayRun(m *Model, scripts [][]*Episode, targets []int, limits [2]int, swap time.Duration, abort bool, order Order) Replay {
	var h replayHeap
	seq, sent := 0, 0
	now := time.Duration(0)
	queue := [2]*genQueue{{order: order}, {order: order}}
	running := [2]map[*replayGen]time.Duration{{}, {}} // gen → when it started
	var peak [2]int
	paused := [2]bool{}
	push := func(e replayEvent) {
		seq++
		e.seq = seq
		heap.Push(&h, e)
	}
	var start func(role int)
	start = func(role int) {
		for !paused[role] && len(running[role]) < limits[role] && queue[role].Len() > 0 {
			g := heap.Pop(queue[role]).(*replayGen)
			if g.ep.stopped {
				continue
			}
			running[role][g] = now
			peak[role] = max(peak[role], len(running[role]))
			g.run++
			push(replayEvent{at: now + g.service, gen: g, run: g.run})
		}
	}
	send := func(g *replayGen) {
		sent++
		g.seq, g.left = sent, g.ep.left[g.turn-1][1+g.act]
		heap.Push(queue[g.role], g)
		start(g.role)
	}
	planTurn := func(ep *replayEpisode, t int) {
		send(&replayGen{role: 0, ep: ep, turn: t, act: -1, service: ep.script.Turns[t-1].Planner.Service()})
	}
	groupsLeft := make([][]int, len(scripts)) // per rollout, per group: episodes not ended
	groupsDone := make([]int, len(scripts))
	ended := make([]time.Duration, len(scripts))
	endedAt := make([]bool, len(scripts))
	var episodes [][]*replayEpisode
	for r, eps := range scripts {
		var rs []*replayEpisode
		for _, s := range eps {
			ep := &replayEpisode{script: s, rollout: r, group: m.Group(s.Index), left: pathsLeft(s)}
			for len(groupsLeft[r]) <= ep.group {
				groupsLeft[r] = append(groupsLeft[r], 0)
			}
			groupsLeft[r][ep.group]++
			rs = append(rs, ep)
		}
		episodes = append(episodes, rs)
	}
	for _, rs := range episodes {
		for _, ep := range rs {
			planTurn(ep, 1)
		}
	}
	// The trainers consume the rollouts in order: after rollout next's
	// result each pauses its role, swaps and resumes, then waits for the
	// next rollout (which may have ended already).
	next, swapsLeft := 0, 0
	var resumed time.Duration
	var pause func()
	pause = func() {
		if next >= len(scripts)-1 || !endedAt[next] {
			return
		}
		// Nothing new starts; in abort mode what runs now stops and goes
		// back to the head of the queue, else the swap waits for it.
		for role := range 2 {
			paused[role] = true
			if abort {
				// Sent again with the order they were first sent in: at
				// the head of a FIFO queue.
				for g := range running[role] {
					delete(running[role], g)
					heap.Push(queue[role], g)
				}
			}
			swapsLeft++
			if len(running[role]) == 0 {
				push(replayEvent{at: now + swap, swap: role + 1})
			}
		}
	}
	endRollout := func(r int) {
		endedAt[r], ended[r] = true, now
		for _, ep := range episodes[r] {
			ep.stopped = true
		}
		for role := range 2 {
			for g := range running[role] {
				if g.ep.rollout == r {
					delete(running[role], g)
				}
			}
			if paused[role] && !abort && len(running[role]) == 0 {
				push(replayEvent{at: now + swap, swap: role + 1}) // drained: the swap starts
			}
		}
		if r == next && swapsLeft == 0 {
			pause()
		}
	}
	for h.Len() > 0 {
		ev := heap.Pop(&h).(replayEvent)
		now = ev.at
		if ev.swap > 0 {
			if !paused[ev.swap-1] {
				continue // a drain already scheduled this swap's end
			}
			paused[ev.swap-1] = false
			swapsLeft--
			if swapsLeft == 0 {
				resumed = now
				next++
				pause()
			}
			start(ev.swap - 1)
			continue
		}
		g := ev.gen
		if _, ok := running[g.role][g]; !ok || ev.run != g.run {
			continue // stopped: its rollout ended, or a swap sent it back
		}
		delete(running[g.role], g)
		if paused[g.role] && !abort && len(running[g.role]) == 0 {
			push(replayEvent{at: now + swap, swap: g.role + 1}) // drained: the swap starts
		}
		ep := g.ep
		start(g.role)
		if ep.stopped {
			continue
		}
		turn := ep.script.Turns[g.turn-1]
		if g.act < 0 {
			if len(turn.Acts) == 0 {
				// The episode answered.
				ep.stopped = true
				groupsLeft[ep.rollout][ep.group]--
				if groupsLeft[ep.rollout][ep.group] == 0 {
					groupsDone[ep.rollout]++
					if groupsDone[ep.rollout] == targets[ep.rollout] && !endedAt[ep.rollout] {
						endRollout(ep.rollout)
					}
				}
				continue
			}
			ep.done, ep.undone = make([]bool, len(turn.Acts)), len(turn.Acts)
			for k, a := range turn.Acts {
				if len(a.Deps) == 0 {
					send(&replayGen{role: 1, ep: ep, turn: g.turn, act: k, service: a.Gen.Service()})
				}
			}
			continue
		}
		ep.done[g.act] = true
		ep.undone--
		if ep.undone == 0 {
			planTurn(ep, g.turn+1)
			continue
		}
		for k, a := range turn.Acts {
			if len(a.Deps) > 0 && slices.Contains(a.Deps, g.act) {
				ready := true
				for _, d := range a.Deps {
					ready = ready && ep.done[d]
				}
				if ready {
					send(&replayGen{role: 1, ep: ep, turn: g.turn, act: k, service: a.Gen.Service()})
				}
			}
		}
	}
	// The last result is in the trainers' hands once they resumed after
	// the last swap.
	rep := Replay{S: resumed.Seconds(), PeakInFlight: peak}
	for _, t := range ended {
		rep.RolloutS = append(rep.RolloutS, t.Seconds())
		rep.S = max(rep.S, t.Seconds())
	}
	return rep
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/planact/planact/pkg/sim"
)

// EngineCalls counts the generation calls the simulated engines took, per
// act, from the engines' own records: planact names the turn or act of
// every engine request (engine.GenerationHeader), and `planact sim` counts
// the calls of each (POST /sim/take_generations). The sim engines are
// deterministic, so an act generated twice yields the same sample twice
// over and only the count shows it. The counts are taken as the run goes,
// so that the engines keep little and drop nothing.
type EngineCalls struct {
	urls []string
	hc   *http.Client

	take  sync.Mutex // one take at a time, so that none is merged late
	mu    sync.Mutex
	acts  map[int64]map[string]sim.GenerationCalls // rollout -> ActKey -> calls
	turns int                                      // planner turns' calls (not checked: their retries are not on the bus)
	lost  []string                                 // why counts may be missing: dropped calls, failed takes, unnamed generations
}

// NewEngineCalls counts the calls of the engines at urls.
func NewEngineCalls(urls ...string) *EngineCalls {
	return &EngineCalls{urls: urls, hc: &http.Client{Timeout: 10 * time.Second}, acts: map[int64]map[string]sim.GenerationCalls{}}
}

// Run takes the counts every interval until ctx ends. A take under way
// when ctx ends is finished, not cut off: the engine may have handed its
// counts over already, and they would be lost.
func (c *EngineCalls) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Take(context.WithoutCancel(ctx))
		}
	}
}

// Take takes every engine's counts now and adds them. A take that fails,
// whatever the cause (ctx ending too), may have lost counts (the engine may
// have handed them over): it is noted, and the ledger's call counts are
// incomplete.
func (c *EngineCalls) Take(ctx context.Context) {
	c.take.Lock()
	defer c.take.Unlock()
	for _, u := range c.urls {
		l, err := c.takeOne(ctx, u)
		if err != nil {
			c.note("take %s: %v", u, err)
			continue
		}
		c.Add(l)
	}
}

func (c *EngineCalls) takeOne(ctx context.Context, url string) (sim.GenerationLog, error) {
	var l sim.GenerationLog
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/sim/take_generations", nil)
	if err != nil {
		return l, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return l, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return l, fmt.Errorf("status %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return l, fmt.Errorf("decode: %w", err)
	}
	return l, nil
}

// Add adds one engine's counts.
func (c *EngineCalls) Add(l sim.GenerationLog) {
	if l.Dropped > 0 {
		c.note("%d calls not counted: more than %d generations between two takes", l.Dropped, sim.MaxGenerations)
	}
	for id, calls := range l.Generations {
		n, act, turn, err := ParseGeneration(id)
		if err != nil {
			c.note("%v", err)
			continue
		}
		c.mu.Lock()
		if turn {
			c.turns += calls.Calls
		} else {
			if c.acts[n] == nil {
				c.acts[n] = map[string]sim.GenerationCalls{}
			}
			sum := c.acts[n][act]
			sum.Calls += calls.Calls
			sum.Aborted += calls.Aborted
			c.acts[n][act] = sum
		}
		c.mu.Unlock()
	}
}

func (c *EngineCalls) note(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lost) < 100 {
		c.lost = append(c.lost, fmt.Sprintf(format, a...))
	}
}

// ParseGeneration reads a generation's name (engine.GenerationHeader):
// "<rollout>-<episode>-t<turn>" is a planner turn, "<rollout>-<episode>-<node
// key>" (a key is "t<turn>-<node>") an act, returned as ActKey.
func ParseGeneration(id string) (rollout int64, act string, turn bool, err error) {
	parts := strings.SplitN(id, "-", 3)
	if len(parts) != 3 {
		return 0, "", false, fmt.Errorf("generation %q: want <rollout>-<episode>-<turn or node key>", id)
	}
	n, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return 0, "", false, fmt.Errorf("generation %q: rollout %q: want an integer", id, parts[0])
	}
	e, err := strconv.Atoi(parts[1])
	if err != nil {
		return 0, "", false, fmt.Errorf("generation %q: episode %q: want an integer", id, parts[1])
	}
	key := parts[2]
	if !strings.HasPrefix(key, "t") {
		return 0, "", false, fmt.Errorf("generation %q: %q is neither a turn (t<turn>) nor a node key (t<turn>-<node>)", id, key)
	}
	return n, ActKey(e, key), !strings.Contains(key, "-"), nil
}

// Acts returns, per rollout, the calls counted of each act (ActKey).
func (c *EngineCalls) Acts() map[int64]map[string]sim.GenerationCalls {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int64]map[string]sim.GenerationCalls, len(c.acts))
	for n, acts := range c.acts {
		out[n] = make(map[string]sim.GenerationCalls, len(acts))
		for k, v := range acts {
			out[n][k] = v
		}
	}
	return out
}

// Summary is what the report says of the counts.
func (c *EngineCalls) Summary() CallsSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CallsSummary{TurnCalls: c.turns, Incomplete: append([]string(nil), c.lost...)}
	for _, acts := range c.acts {
		for _, a := range acts {
			s.Acts++
			s.ActCalls += a.Calls
		}
	}
	return s
}

// CallsSummary sums the engines' generation calls over a run.
type CallsSummary struct {
	Acts      int `json:"acts"`       // acts the engines took a call of
	ActCalls  int `json:"act_calls"`  // their calls
	TurnCalls int `json:"turn_calls"` // planner turns' calls (not held against the turns)
	// Incomplete says why counts may be missing: the ledger cannot tell
	// that no act was generated twice.
	Incomplete []string `json:"incomplete,omitempty"`
}

// JoinCalls joins one rollout's act outcomes (by ActKey, Observer.Outcomes)
// with the calls the engines took for its acts (EngineCalls.Acts), for
// Check: every act the engines took a call of, and every executed act
// (whose generation was a call the engines took, counted or not), sorted.
func JoinCalls(outcomes map[string]ActOutcome, calls map[string]sim.GenerationCalls) []ActCalls {
	keys := map[string]bool{}
	for k := range calls {
		keys[k] = true
	}
	for k, o := range outcomes {
		if o.Executed() {
			keys[k] = true
		}
	}
	out := make([]ActCalls, 0, len(keys))
	for _, k := range sortedKeys(keys) {
		a := ActCalls{Act: k, Calls: calls[k].Calls, Aborted: calls[k].Aborted}
		if o, ok := outcomes[k]; ok {
			a.Outcome, a.Executed, a.Attempts, a.Retries = true, o.Executed(), o.Attempts, o.Retries
		}
		out = append(out, a)
	}
	return out
}

// UnplayedCalls lists the engine calls of acts of rollouts that no trainer
// played (recs).
func UnplayedCalls(recs []RolloutRecord, calls map[int64]map[string]sim.GenerationCalls) []string {
	played := map[int64]bool{}
	for _, r := range recs {
		played[r.Rollout] = true
	}
	var out []string
	for _, n := range sortedRollouts(calls) {
		if played[n] {
			continue
		}
		total := 0
		for _, c := range calls[n] {
			total += c.Calls
		}
		out = append(out, fmt.Sprintf("rollout %d, which no trainer played: %d engine calls for %d acts", n, total, len(calls[n])))
	}
	return out
}

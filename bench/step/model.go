package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// LogNormal is a long-tailed distribution: Median·exp(Sigma·Z), Z standard
// normal. Sigma 0 is the constant Median.
type LogNormal struct {
	Median float64 `json:"median"`
	Sigma  float64 `json:"sigma"`
}

func (d LogNormal) at(z float64) float64 { return d.Median * math.Exp(d.Sigma*z) }

// Mean of the distribution.
func (d LogNormal) Mean() float64 { return d.Median * math.Exp(d.Sigma*d.Sigma/2) }

// P99 of the distribution.
func (d LogNormal) P99() float64 { return d.at(2.3263) }

func (d LogNormal) String() string {
	return fmt.Sprintf("log-normal median %s σ %s", strconv.FormatFloat(d.Median, 'g', 4, 64), strconv.FormatFloat(d.Sigma, 'g', 3, 64))
}

// Discrete is a distribution over small integers: values with weights.
type Discrete []Weighted

// Weighted is one value of a Discrete distribution.
type Weighted struct {
	Value  int     `json:"value"`
	Weight float64 `json:"weight"`
}

// ParseDiscrete reads "2:45,3:30,4:25" (value:weight, weights need not sum
// to anything in particular).
func ParseDiscrete(s string) (Discrete, error) {
	var d Discrete
	for f := range strings.SplitSeq(s, ",") {
		v, w, ok := strings.Cut(strings.TrimSpace(f), ":")
		value, err1 := strconv.Atoi(v)
		weight, err2 := strconv.ParseFloat(w, 64)
		if !ok || err1 != nil || err2 != nil || value < 1 || weight < 0 || math.IsInf(weight, 0) || math.IsNaN(weight) {
			return nil, fmt.Errorf("%q: want value:weight pairs, values ≥ 1 and weights ≥ 0, comma-separated (e.g. 2:45,3:30)", f)
		}
		d = append(d, Weighted{value, weight})
	}
	if d.total() <= 0 {
		return nil, fmt.Errorf("%q: the weights sum to 0", s)
	}
	return d, nil
}

func (d Discrete) total() float64 {
	t := 0.0
	for _, w := range d {
		t += w.Weight
	}
	return t
}

// at is the value at u ∈ [0, 1) of the cumulative distribution.
func (d Discrete) at(u float64) int {
	x := u * d.total()
	for _, w := range d {
		if x < w.Weight {
			return w.Value
		}
		x -= w.Weight
	}
	return d[len(d)-1].Value
}

// Mean of the distribution.
func (d Discrete) Mean() float64 {
	s := 0.0
	for _, w := range d {
		s += float64(w.Value) * w.Weight
	}
	return s / d.total()
}

// Max is the largest value with a weight.
func (d Discrete) Max() int {
	m := 0
	for _, w := range d {
		if w.Weight > 0 {
			m = max(m, w.Value)
		}
	}
	return m
}

func (d Discrete) String() string {
	var parts []string
	for _, w := range d {
		parts = append(parts, fmt.Sprintf("%d:%s", w.Value, strconv.FormatFloat(w.Weight, 'g', -1, 64)))
	}
	return strings.Join(parts, ",")
}

// EngineModel is one engine's latency model. An engine serves Limit
// generations at once, as continuous batching does, and queues the rest;
// a generation holds its slot for its service time, TTFT + Tokens ×
// PerToken, times a straggler's slowdown. Each generation draws its own
// TTFT, per-token time and length. A real engine's per-token time grows
// with its batch; here Limit stands for the batch the engine is tuned to
// run at, and the per-token time is the one it has there.
type EngineModel struct {
	Limit    int       `json:"limit"`
	TTFT     LogNormal `json:"ttft_s"`
	PerToken LogNormal `json:"per_token_s"`
	Tokens   LogNormal `json:"output_tokens"`
	// MaxTokens caps the drawn length (the planact config's max_new_tokens
	// is set above it, so that no generation is cut).
	MaxTokens int `json:"max_output_tokens"`
	// Stragglers is the fraction of generations slowed down by a factor
	// drawn uniformly from Slowdown: a preempted or retracted request, a
	// prefix-cache miss on a long context.
	Stragglers float64    `json:"straggler_rate"`
	Slowdown   [2]float64 `json:"straggler_slowdown"`
	// QueueLimit bounds the requests waiting for a slot: one more is
	// answered 429 Too Many Requests with Retry-After, as a server with a
	// bounded queue (or a router in front of it) does. 0: no bound.
	QueueLimit int `json:"queue_limit,omitempty"`
}

// MeanService is the mean service time of a generation, stragglers included.
func (m EngineModel) MeanService() time.Duration {
	s := m.TTFT.Mean() + m.Tokens.Mean()*m.PerToken.Mean()
	s *= 1 + m.Stragglers*((m.Slowdown[0]+m.Slowdown[1])/2-1)
	return time.Duration(s * float64(time.Second))
}

// Model is the step's workload: what the planner plans, what the actor
// answers and how long every generation takes. Every draw is a function of
// the seed and the generation's identity (rollout, episode, turn, node), so
// the engine process and the analysis after the run agree on every episode,
// including those the run stopped before they were done.
type Model struct {
	Seed    int64       `json:"seed"`
	Planner EngineModel `json:"planner"`
	Actor   EngineModel `json:"actor"`
	// Turns is the number of planner turns of an episode: every turn but
	// the last writes a plan, the last answers.
	Turns Discrete `json:"turns"`
	// Width is the number of acts in a plan.
	Width Discrete `json:"width"`
	// DepRate is the probability that an act (not a plan's first) depends
	// on an earlier act of its plan.
	DepRate float64 `json:"dep_rate"`
	// PromptTokens is the length of a task's prompt.
	PromptTokens LogNormal `json:"prompt_tokens"`
	// Correct is the fraction of episodes whose answer is right.
	Correct float64 `json:"correct"`
	// Copies of each task (a group): episode e is a copy of task e / Copies.
	Copies int `json:"copies"`
}

// Check says what is wrong with a model.
func (m *Model) Check() error {
	var errs []error
	for _, e := range []struct {
		name string
		m    EngineModel
	}{{"planner", m.Planner}, {"actor", m.Actor}} {
		switch {
		case e.m.Limit < 1:
			errs = append(errs, fmt.Errorf("%s engine limit %d: want ≥ 1", e.name, e.m.Limit))
		case e.m.TTFT.Median < 0 || e.m.PerToken.Median < 0 || e.m.Tokens.Median < 1:
			errs = append(errs, fmt.Errorf("%s engine: TTFT and per-token medians must be ≥ 0 and the length's ≥ 1", e.name))
		case e.m.TTFT.Sigma < 0 || e.m.PerToken.Sigma < 0 || e.m.Tokens.Sigma < 0:
			errs = append(errs, fmt.Errorf("%s engine: sigmas must be ≥ 0", e.name))
		case e.m.MaxTokens < 1:
			errs = append(errs, fmt.Errorf("%s engine: max output tokens %d: want ≥ 1", e.name, e.m.MaxTokens))
		case e.m.Stragglers < 0 || e.m.Stragglers > 1:
			errs = append(errs, fmt.Errorf("%s engine: straggler rate %g: want 0…1", e.name, e.m.Stragglers))
		case e.m.Slowdown[0] < 1 || e.m.Slowdown[1] < e.m.Slowdown[0]:
			errs = append(errs, fmt.Errorf("%s engine: straggler slowdown %v: want 1 ≤ low ≤ high", e.name, e.m.Slowdown))
		case e.m.QueueLimit < 0:
			errs = append(errs, fmt.Errorf("%s engine: queue limit %d: want ≥ 0 (0: no bound)", e.name, e.m.QueueLimit))
		}
	}
	if len(m.Turns) == 0 || len(m.Width) == 0 {
		errs = append(errs, errors.New("turns and width distributions are required"))
	}
	if m.DepRate < 0 || m.DepRate > 1 || m.Correct < 0 || m.Correct > 1 {
		errs = append(errs, fmt.Errorf("dep rate %g and correct %g: want 0…1", m.DepRate, m.Correct))
	}
	if m.Copies < 1 {
		errs = append(errs, fmt.Errorf("copies %d: want ≥ 1", m.Copies))
	}
	return errors.Join(errs...)
}

// Gen is one generation as the model draws it.
type Gen struct {
	TTFT     time.Duration `json:"ttft"`
	PerToken time.Duration `json:"per_token"`
	Tokens   int           `json:"tokens"`   // output ids, EOS included
	Slowdown float64       `json:"slowdown"` // 1, or a straggler's factor
	Text     string        `json:"-"`        // the output, without EOS
}

// Service is how long the generation holds an engine slot.
func (g Gen) Service() time.Duration {
	return time.Duration(g.Slowdown * float64(g.TTFT+time.Duration(g.Tokens)*g.PerToken))
}

// Episode is the script of one episode: what every turn plans and how long
// every generation takes.
type Episode struct {
	Rollout int64
	Index   int
	Turns   []Turn // Turns[i] is turn i+1 (planact counts turns from 1)
}

// Turn is one planner turn and the acts of its plan (none on the last).
type Turn struct {
	Planner Gen
	Acts    []Act
}

// Act is one node of a plan.
type Act struct {
	Deps  []int  // indexes of the acts of the same plan it waits for
	Query string // the search input as planned, with {sK} placeholders
	Gen   Gen
}

// rng is the random source of one identity.
func (m *Model) rng(parts ...any) *rand.Rand {
	h := fnv.New64a()
	fmt.Fprint(h, m.Seed)
	for _, p := range parts {
		fmt.Fprintf(h, "/%v", p)
	}
	s := h.Sum64()
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// draw draws a generation of engine em whose text is fixed plus filler up
// to the drawn length (a plan's nodes are never cut: the length is at
// least what they need).
func (m *Model) draw(em EngineModel, fixedHead, fixedTail string, parts ...any) Gen {
	r := m.rng(parts...)
	g := Gen{
		TTFT:     seconds(em.TTFT.at(r.NormFloat64())),
		PerToken: seconds(em.PerToken.at(r.NormFloat64())),
		Slowdown: 1,
	}
	drawn := int(math.Round(em.Tokens.at(r.NormFloat64())))
	if r.Float64() < em.Stragglers {
		g.Slowdown = em.Slowdown[0] + r.Float64()*(em.Slowdown[1]-em.Slowdown[0])
	}
	fixed := len(fixedHead) + len(fixedTail)
	g.Tokens = max(min(drawn, em.MaxTokens), fixed+1)
	g.Text = fixedHead + filler(g.Tokens-1-fixed, int(r.Uint32()%uint32(len(lorem)))) + fixedTail
	return g
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

const lorem = "the plan weighs what is known against what is still needed and names the next lookups before it commits to an answer; "

// filler is n bytes of text, from offset into lorem.
func filler(n, offset int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n)
	for b.Len() < n {
		s := lorem[offset:]
		offset = 0
		b.WriteString(s[:min(len(s), n-b.Len())])
	}
	return b.String()
}

// Group is the task (group index) of episode e.
func (m *Model) Group(e int) int { return e / m.Copies }

// Label is the right answer of group g.
func Label(g int) string { return fmt.Sprintf("fact g%d", g) }

// TaskPrompt is the prompt of group g's task: a tag, then filler to the
// drawn length (the same for every copy).
func (m *Model) TaskPrompt(rollout int64, g int) string {
	head := fmt.Sprintf("Bench task r%d g%d: what is the fact g%d? Context: ", rollout, g, g)
	n := int(math.Round(m.PromptTokens.at(m.rng("prompt", rollout, g).NormFloat64())))
	return head + filler(n-len(head), g%len(lorem))
}

// Episode returns the script of episode e of rollout r.
func (m *Model) Episode(r int64, e int) Episode {
	er := m.rng("episode", r, e)
	turns := m.Turns.at(er.Float64())
	correct := er.Float64() < m.Correct
	ep := Episode{Rollout: r, Index: e, Turns: make([]Turn, turns)}
	for t := 1; t <= turns; t++ {
		turn := &ep.Turns[t-1]
		if t == turns {
			answer := Label(m.Group(e))
			if !correct {
				answer = fmt.Sprintf("no fact for e%d", e)
			}
			turn.Planner = m.draw(m.Planner, "<think>", "</think>\n<answer>"+answer+"</answer>", "planner", r, e, t)
			continue
		}
		tr := m.rng("plan", r, e, t)
		width := m.Width.at(tr.Float64())
		var graph strings.Builder
		graph.WriteString("</think>\n<graph>\n")
		for k := range width {
			a := Act{Query: fmt.Sprintf("t%d n%d of e%d", t, k+1, e)}
			if k > 0 && tr.Float64() < m.DepRate {
				a.Deps = []int{tr.IntN(k)}
				a.Query += fmt.Sprintf(" after {s%d}", a.Deps[0]+1)
				fmt.Fprintf(&graph, "<node id=\"s%d\" depends=\"s%d\">search(%q)</node>\n", k+1, a.Deps[0]+1, a.Query)
			} else {
				fmt.Fprintf(&graph, "<node id=\"s%d\">search(%q)</node>\n", k+1, a.Query)
			}
			a.Gen = m.draw(m.Actor, fmt.Sprintf("r%d e%d t%d n%d: ", r, e, t, k+1), "", "actor", r, e, t, k)
			turn.Acts = append(turn.Acts, a)
		}
		graph.WriteString("</graph>")
		turn.Planner = m.draw(m.Planner, "<think>", graph.String(), "planner", r, e, t)
	}
	return ep
}

// Work is what an episode asks of the engines, for the lower bound.
type Work struct {
	// CriticalPath: every turn's planner generation, then the longest
	// chain of its plan's acts, one turn after the other.
	CriticalPath time.Duration
	Planner      time.Duration // sum of the planner's service times
	Actor        time.Duration // sum of the actor's
	// Head is the first planner turn (before any act can start), Tail the
	// last (after every act); only meaningful with Acts > 0.
	Head, Tail time.Duration
	Turns      int
	Acts       int
}

// Work sums an episode's script.
func (ep Episode) Work() Work {
	var w Work
	for _, t := range ep.Turns {
		p := t.Planner.Service()
		w.Planner += p
		w.CriticalPath += p + longestChain(t.Acts)
		for _, a := range t.Acts {
			w.Actor += a.Gen.Service()
		}
		w.Acts += len(t.Acts)
	}
	w.Turns = len(ep.Turns)
	w.Head = ep.Turns[0].Planner.Service()
	w.Tail = ep.Turns[len(ep.Turns)-1].Planner.Service()
	return w
}

// longestChain is the longest path of service times through a plan's
// dependencies (a dependency always comes earlier in the plan).
func longestChain(acts []Act) time.Duration {
	finish := make([]time.Duration, len(acts))
	var longest time.Duration
	for i, a := range acts {
		var start time.Duration
		for _, d := range a.Deps {
			start = max(start, finish[d])
		}
		finish[i] = start + a.Gen.Service()
		longest = max(longest, finish[i])
	}
	return longest
}

package main

import (
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
)

func TestParseDiscrete(t *testing.T) {
	d, err := ParseDiscrete("2:45, 3:30,4:25")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Mean(), 2*0.45+3*0.30+4*0.25; math.Abs(got-want) > 1e-12 {
		t.Errorf("mean %g, want %g", got, want)
	}
	if d.Max() != 4 || d.at(0) != 2 || d.at(0.46) != 3 || d.at(0.999) != 4 {
		t.Errorf("max %d, at 0 %d, at .46 %d, at .999 %d", d.Max(), d.at(0), d.at(0.46), d.at(0.999))
	}
	for _, bad := range []string{"", "2", "0:1", "2:-1", "x:1", "2:0"} {
		if _, err := ParseDiscrete(bad); err == nil {
			t.Errorf("ParseDiscrete(%q): no error", bad)
		}
	}
}

func TestEpisodesAreDeterministicPerIdentity(t *testing.T) {
	m := defaultModel()
	a, b := m.Episode(3, 17), m.Episode(3, 17)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same episode drawn twice differs")
	}
	if reflect.DeepEqual(m.Episode(3, 17).Turns, m.Episode(4, 17).Turns) {
		t.Error("episode 17 of rollouts 3 and 4 are the same: draws ignore the rollout")
	}
}

// The drawn episodes follow the model's distributions: a long sample,
// deterministic given the seed.
func TestDrawsFollowTheModel(t *testing.T) {
	m := defaultModel()
	var turns, width, plans, gens, stragglers float64
	var tokens []float64
	for e := range 4000 {
		ep := m.Episode(1, e)
		turns += float64(len(ep.Turns))
		for _, tr := range ep.Turns {
			gens++
			if tr.Planner.Slowdown > 1 {
				stragglers++
			}
			tokens = append(tokens, float64(tr.Planner.Tokens))
			if len(tr.Acts) > 0 {
				plans++
				width += float64(len(tr.Acts))
			}
		}
	}
	sort.Float64s(tokens)
	n := 4000.0
	for _, c := range []struct {
		name      string
		got, want float64
		tol       float64
	}{
		{"turns per episode", turns / n, m.Turns.Mean(), 0.05},
		{"acts per plan", width / plans, m.Width.Mean(), 0.08},
		{"straggler rate", stragglers / gens, m.Planner.Stragglers, 0.005},
		// Plans need room for their nodes: the median is at least the model's.
		{"planner tokens, median", tokens[len(tokens)/2], m.Planner.Tokens.Median, 60},
	} {
		if math.Abs(c.got-c.want) > c.tol {
			t.Errorf("%s: %.3f, want %.3f ± %g", c.name, c.got, c.want, c.tol)
		}
	}
}

// What the planner engine writes is what planact's parser reads: every
// plan of the script parses into its acts and dependencies, every last
// turn into the answer, and every act's input, as the act-dispatcher
// prompts the actor, names the act.
func TestScriptsParseAsPlanned(t *testing.T) {
	m := defaultModel()
	for e := range 300 {
		ep := m.Episode(1, e)
		for ti, tr := range ep.Turns {
			res, err := plan.Parse(tr.Planner.Text, plan.Options{Tools: []string{"search"}, MaxNodes: 32})
			if err != nil {
				t.Fatalf("episode %d turn %d: %v\n%s", e, ti+1, err, tr.Planner.Text)
			}
			if len(tr.Acts) == 0 {
				if res.Format != plan.FormatAnswer || len(res.Answers) != 1 {
					t.Fatalf("episode %d turn %d: want an answer, got %+v", e, ti+1, res)
				}
				continue
			}
			if res.Plan == nil || len(res.Plan.Nodes) != len(tr.Acts) {
				t.Fatalf("episode %d turn %d: %d acts planned, parsed %+v", e, ti+1, len(tr.Acts), res)
			}
			for k, n := range res.Plan.Nodes {
				var deps []int
				for _, d := range n.Deps {
					deps = append(deps, slices.IndexFunc(res.Plan.Nodes, func(x plan.Node) bool { return x.ID == d }))
				}
				if !slices.Equal(deps, tr.Acts[k].Deps) {
					t.Fatalf("episode %d turn %d node %d: deps %v, script %v", e, ti+1, k, deps, tr.Acts[k].Deps)
				}
				// The input as released: placeholders filled with the
				// dependency's output (an actor's text).
				in := plan.Substitute(n, map[string]string{"s1": "r1 e1 t1 n1: what it found", "s2": "x", "s3": "x", "s4": "x", "s5": "x", "s6": "x", "s7": "x", "s8": "x", "s9": "x", "s10": "x", "s11": "x"}).Input()
				prompt := actdispatcher.ActorPrompt(schema.Tool{Name: "search", Description: "look up one short fact"}, in)
				mt := actTagRe.FindStringSubmatch(prompt)
				if mt == nil || mt[1] != strconv.Itoa(ti+1) || mt[2] != strconv.Itoa(k+1) || mt[3] != strconv.Itoa(e) {
					t.Fatalf("episode %d turn %d node %d: the actor's prompt does not name the act:\n%s", e, ti+1, k, prompt)
				}
			}
		}
	}
}

func TestWorkSumsTheScript(t *testing.T) {
	g := func(d float64) Gen { return Gen{TTFT: seconds(d), Slowdown: 1} }
	ep := Episode{Turns: []Turn{
		{Planner: g(1), Acts: []Act{{Gen: g(2)}, {Gen: g(3), Deps: []int{0}}, {Gen: g(4)}}},
		{Planner: g(5)},
	}}
	w := ep.Work()
	// Turn 1: 1 + longest chain max(2+3, 4) = 6; turn 2: 5.
	if w.CriticalPath != seconds(11) || w.Planner != seconds(6) || w.Actor != seconds(9) || w.Head != seconds(1) || w.Tail != seconds(5) || w.Acts != 3 {
		t.Errorf("work %+v", w)
	}
	// The longest path left from each generation's start: the planner's
	// first turn is the critical path; act 0 goes on through act 1.
	left := pathsLeft(&ep)
	want := [][]time.Duration{{seconds(11), seconds(2 + 3 + 5), seconds(3 + 5), seconds(4 + 5)}, {seconds(5)}}
	if !reflect.DeepEqual(left, want) {
		t.Errorf("paths left %v, want %v", left, want)
	}
}

// Command parse measures plan-parser throughput per format. It generates a
// corpus of realistic planner outputs (the same random plans written in
// every format, with think blocks, prose and fences around them), parses
// each corpus with pkg/plan, and prints MB/s and allocations next to a
// baseline measured in the same run: encoding/json decoding the plain
// JSON IR of the same plans.
//
//	go run ./bench/parse [-docs 200] [-nodes 8] [-benchtime 1s] [-seed 1]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/planact/planact/pkg/plan"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench/parse:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	testing.Init()
	fs := flag.NewFlagSet("bench/parse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	docs := fs.Int("docs", 200, "planner outputs per format")
	nodes := fs.Int("nodes", 8, "average nodes per plan")
	benchtime := fs.String("benchtime", "1s", "time per measurement (as go test -benchtime)")
	seed := fs.Uint64("seed", 1, "random seed of the corpus")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flag.Set("test.benchtime", *benchtime); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(*seed, 0))
	plans := make([]*plan.Plan, *docs)
	for i := range plans {
		plans[i] = randomPlan(rng, 1+rng.IntN(2**nodes-1))
	}
	type row struct {
		name   string
		corpus []string
		parse  func(string) error
	}
	baseline := row{"baseline (encoding/json IR)", render(plans, plainJSON), func(s string) error {
		var v irDoc
		return json.Unmarshal([]byte(s), &v)
	}}
	rows := []row{baseline}
	for _, f := range []struct {
		format plan.Format
		write  func(*plan.Plan) string
	}{
		{plan.FormatGraph, writeGraph},
		{plan.FormatTaskList, writeTaskList},
		{plan.FormatJSON, writeJSON},
		{plan.FormatNumbered, writeNumbered},
		{plan.FormatSteps, writeSteps},
		{plan.FormatAnswer, writeAnswer},
	} {
		corpus := render(plans, f.write)
		rows = append(rows, row{string(f.format), corpus, func(s string) error {
			_, err := plan.Parse(s, plan.Options{})
			return err
		}})
		// Forcing the format skips detection: the difference is its cost.
		if f.format != plan.FormatAnswer {
			format := f.format
			rows = append(rows, row{string(format) + " (forced)", corpus, func(s string) error {
				_, err := plan.Parse(s, plan.Options{Format: format})
				return err
			}})
		}
	}
	// Every document must parse, or the numbers mean nothing.
	for _, r := range rows {
		for i, s := range r.corpus {
			if err := r.parse(s); err != nil {
				return fmt.Errorf("%s: document %d: %w\n%s", r.name, i, err, s)
			}
		}
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "format\tdocs\tbytes/doc\tMB/s\tallocs/doc\tB/doc\tvs baseline\t\n")
	var baseMBs float64
	for _, r := range rows {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		total := 0
		for _, s := range r.corpus {
			total += len(s)
		}
		res := testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(total))
			for b.Loop() {
				for _, s := range r.corpus {
					_ = r.parse(s)
				}
			}
		})
		mbs := float64(total) * float64(res.N) / res.T.Seconds() / 1e6
		if r.name == baseline.name {
			baseMBs = mbs
		}
		n := int64(len(r.corpus))
		fmt.Fprintf(w, "%s\t%d\t%d\t%.1f\t%d\t%d\t%.2fx\t\n", r.name, n, total/len(r.corpus), mbs,
			res.AllocsPerOp()/n, res.AllocedBytesPerOp()/n, mbs/baseMBs)
	}
	return w.Flush()
}

func render(plans []*plan.Plan, write func(*plan.Plan) string) []string {
	out := make([]string, len(plans))
	for i, p := range plans {
		out[i] = write(p)
	}
	return out
}

var (
	topics = []string{"capital of France", "population of Lagos", "height of K2", "author of Dune",
		"GDP of Brazil in 2021", "year the Berlin Wall fell", "boiling point of ethanol",
		"director of Spirited Away", "longest river in Asia", "founder of the Ming dynasty"}
	verbs = []string{"Find", "Look up", "Determine", "Identify", "Check"}
)

// randomPlan builds a plan of n nodes: searches, a calculator step and an
// actor step, each depending on up to two earlier nodes and naming them
// in its arguments.
func randomPlan(rng *rand.Rand, n int) *plan.Plan {
	p := &plan.Plan{}
	for i := range n {
		node := plan.Node{ID: fmt.Sprintf("s%d", i+1), Tool: "search", Deps: []string{}}
		text := topics[rng.IntN(len(topics))]
		if i > 0 {
			for range rng.IntN(3) {
				d := fmt.Sprintf("s%d", 1+rng.IntN(i))
				if !contains(node.Deps, d) {
					node.Deps = append(node.Deps, d)
				}
			}
		}
		for _, d := range node.Deps {
			text += " related to {" + d + "}"
		}
		switch {
		case len(node.Deps) == 2 && rng.IntN(2) == 0:
			node.Tool = "math"
		case len(node.Deps) > 0 && rng.IntN(3) == 0:
			node.Tool = "actor"
		}
		node.Description = verbs[rng.IntN(len(verbs))] + " the " + strings.Split(text, " related")[0]
		node.Args = map[string]any{"input": text}
		p.Nodes = append(p.Nodes, node)
	}
	return p
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ref rewrites {sK} placeholders for a format whose ids are written idOf.
func ref(s string, idOf func(string) string, wrap func(string) string) string {
	for _, pl := range plan.Placeholders(s) {
		s = strings.ReplaceAll(s, "{"+pl+"}", wrap(idOf(pl)))
	}
	return s
}

const think = "<think>\nThe question needs several facts. Some are independent and can run in parallel; " +
	"the later ones use earlier results, so I will reference them by id.\n</think>\n"

func writeGraph(p *plan.Plan) string {
	var b strings.Builder
	b.WriteString(think + "Here is my plan.\n<graph>\n")
	for _, n := range p.Nodes {
		fmt.Fprintf(&b, "  <node id=%q", n.ID)
		if len(n.Deps) > 0 {
			fmt.Fprintf(&b, " depends=%q", strings.Join(n.Deps, ","))
		}
		fmt.Fprintf(&b, ">%s(%q)</node>\n", n.Tool, n.Input())
	}
	b.WriteString("</graph>\n")
	return b.String()
}

func tID(id string) string { return "T" + strings.TrimPrefix(id, "s") }

func writeTaskList(p *plan.Plan) string {
	var b strings.Builder
	b.WriteString(think + "<plan>\n")
	for _, n := range p.Nodes {
		deps := "none"
		if len(n.Deps) > 0 {
			ids := make([]string, len(n.Deps))
			for i, d := range n.Deps {
				ids[i] = tID(d)
			}
			deps = strings.Join(ids, ", ")
		}
		in := ref(n.Input(), tID, func(s string) string { return "{" + s + "}" })
		if n.Tool == "actor" {
			fmt.Fprintf(&b, "%s: %s\n- Dependencies: %s\n", tID(n.ID), in, deps)
			continue
		}
		fmt.Fprintf(&b, "%s: %s(%q) - Dependencies: %s\n", tID(n.ID), n.Tool, in, deps)
	}
	b.WriteString("</plan>\n")
	return b.String()
}

type irNode struct {
	ID          string         `json:"id"`
	Tool        string         `json:"tool"`
	Args        map[string]any `json:"args"`
	DependsOn   []string       `json:"depends_on"`
	Description string         `json:"description,omitempty"`
}

type irDoc struct {
	Nodes []irNode `json:"nodes"`
}

func plainJSON(p *plan.Plan) string {
	doc := irDoc{}
	for _, n := range p.Nodes {
		doc.Nodes = append(doc.Nodes, irNode{ID: n.ID, Tool: n.Tool, Args: n.Args, DependsOn: n.Deps, Description: n.Description})
	}
	b, _ := json.MarshalIndent(doc, "", "  ")
	return string(b)
}

func writeJSON(p *plan.Plan) string {
	return "I'll write the plan as JSON.\n```json\n" + plainJSON(p) + "\n```\nThe executor can run independent nodes in parallel.\n"
}

func writeNumbered(p *plan.Plan) string {
	var b strings.Builder
	b.WriteString("Thought: I will gather the facts first, then combine them.\n")
	num := func(id string) string { return strings.TrimPrefix(id, "s") }
	for i, n := range p.Nodes {
		if i%3 == 2 {
			fmt.Fprintf(&b, "Thought: %s.\n", n.Description)
		}
		in := ref(n.Input(), num, func(s string) string { return "$" + s })
		fmt.Fprintf(&b, "%s. %s(%q)\n", num(n.ID), n.Tool, in)
	}
	fmt.Fprintf(&b, "%d. join()<END_OF_PLAN>\n", len(p.Nodes)+1)
	return b.String()
}

func writeSteps(p *plan.Plan) string {
	type step struct {
		ID           string         `json:"id"`
		Action       string         `json:"action"`
		Params       map[string]any `json:"params"`
		Dependencies []string       `json:"dependencies"`
		Description  string         `json:"description"`
	}
	stepID := func(id string) string { return "step_" + strings.TrimPrefix(id, "s") }
	var steps []step
	for _, n := range p.Nodes {
		deps := make([]string, len(n.Deps))
		for i, d := range n.Deps {
			deps[i] = stepID(d)
		}
		in := ref(n.Input(), stepID, func(s string) string { return "{" + s + "}" })
		steps = append(steps, step{stepID(n.ID), n.Tool, map[string]any{"query": in}, deps, n.Description})
	}
	b, _ := json.Marshal(steps)
	return think + string(b) + "\n"
}

func writeAnswer(p *plan.Plan) string {
	var parts []string
	for _, n := range p.Nodes[:min(3, len(p.Nodes))] {
		parts = append(parts, n.Description)
	}
	return think + "Based on the observations, the answers are:\n<answer>" + strings.Join(parts, " | ") + "</answer>\n"
}

// Command parseadversarial measures how the plan parser's time grows with
// the size of malformed planner outputs. For every adversarial family (text
// that once made a parser pass rescan what it had already scanned) it
// parses generated inputs of 64 KiB, 256 KiB, 1 MiB and 4 MiB and prints
// the time per MB at each size and the ratio of the largest size's per-byte
// time to the smallest's: about 1 means linear, 4 per size step quadratic.
// The baseline, in the same run, is encoding/json decoding a valid JSON
// plan of the same size.
//
//	go run ./bench/parseadversarial [-sizes 64K,256K,1M,4M] [-min 300ms] [-limit 20s] [-family name]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/planact/planact/pkg/plan"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench/parseadversarial:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench/parseadversarial", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizesFlag := fs.String("sizes", "64K,256K,1M,4M", "input sizes, comma-separated (K and M are KiB and MiB)")
	minTime := fs.Duration("min", 300*time.Millisecond, "parse each input repeatedly for at least this long")
	limit := fs.Duration("limit", 20*time.Second, "skip a family's larger sizes once one parse takes longer than this")
	only := fs.String("family", "", "run only the families whose name contains this")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "family\t")
	for _, n := range sizes {
		fmt.Fprintf(w, "%s ms/MB\t", sizeName(n))
	}
	fmt.Fprintf(w, "ratio %s/%s\tvs baseline\t\n", sizeName(sizes[len(sizes)-1]), sizeName(sizes[0]))
	var base []float64 // baseline ns per byte at each size
	for _, f := range append([]family{baseline}, families...) {
		if *only != "" && f.name != baseline.name && !strings.Contains(f.name, *only) {
			continue
		}
		perByte := make([]float64, len(sizes))
		for i, n := range sizes {
			if i > 0 && perByte[i-1] < 0 {
				perByte[i] = -1
				continue
			}
			in := f.gen(n)
			d, err := measure(ctx, f.parse, in, *minTime, *limit)
			if err != nil {
				return fmt.Errorf("%s at %s: %w", f.name, sizeName(n), err)
			}
			perByte[i] = d.Seconds() * 1e9 / float64(len(in))
			if d > *limit {
				// The next size would take at least 4 times longer.
				for j := i + 1; j < len(sizes); j++ {
					perByte[j] = -1
				}
				break
			}
		}
		if f.name == baseline.name {
			base = perByte
		}
		fmt.Fprintf(w, "%s\t", f.name)
		for _, p := range perByte {
			if p < 0 {
				fmt.Fprintf(w, "> limit\t")
				continue
			}
			fmt.Fprintf(w, "%.1f\t", p*(1<<20)/1e6)
		}
		last, lastBase := perByte[len(perByte)-1], base[len(base)-1]
		if last < 0 {
			fmt.Fprintf(w, "-\t-\t\n")
			continue
		}
		fmt.Fprintf(w, "%.2f\t%.1fx\t\n", last/perByte[0], last/lastBase)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	fmt.Fprintf(stdout, "\nms/MB: parse time per MiB of input; ratio: per-byte time at the largest size over the smallest (1 = linear).\n")
	fmt.Fprintf(stdout, "%s %s/%s, GOMAXPROCS %d\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
	return nil
}

// measure parses in repeatedly for at least min (once if that alone takes
// longer) and returns the time per parse.
func measure(ctx context.Context, parse func(context.Context, string) error, in string, min, limit time.Duration) (time.Duration, error) {
	runtime.GC()
	var total time.Duration
	runs := 0
	for total < min {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		start := time.Now()
		err := parse(ctx, in)
		total += time.Since(start)
		runs++
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return 0, err
		}
		if total > limit {
			break
		}
	}
	return total / time.Duration(runs), nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		switch {
		case strings.HasSuffix(f, "K"):
			mult, f = 1<<10, strings.TrimSuffix(f, "K")
		case strings.HasSuffix(f, "M"):
			mult, f = 1<<20, strings.TrimSuffix(f, "M")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad size %q", f)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 {
		return nil, errors.New("no sizes")
	}
	return out, nil
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

// A family generates planner outputs of about n bytes.
type family struct {
	name  string
	gen   func(n int) string
	parse func(context.Context, string) error
}

func parsePlan(ctx context.Context, s string) error {
	_, err := plan.ParseContext(ctx, s, plan.Options{})
	return err
}

// repeat writes prefix, then unit until the text has n bytes, then suffix.
// A '#' in unit becomes the repetition's number, so that every repetition
// can name a distinct tag or node.
func repeat(prefix, unit, suffix string) func(n int) string {
	return func(n int) string {
		var b strings.Builder
		b.Grow(n + len(suffix) + 64)
		b.WriteString(prefix)
		numbered := strings.Contains(unit, "#")
		for k := 0; b.Len() < n-len(suffix); k++ {
			if numbered {
				b.WriteString(strings.ReplaceAll(unit, "#", strconv.Itoa(k)))
			} else {
				b.WriteString(unit)
			}
		}
		b.WriteString(suffix)
		return b.String()
	}
}

const taskPlan = "<plan>\nT1: Find the capital of France\n- Dependencies: none\n</plan>\n"

var families = []family{
	// Nodes whose </node> never comes: each looked for it to the end.
	{"graph, unclosed <node> elements", repeat("<graph>\n", "<node id=\"s#\">search(\"capital of France\")\n", ""), parsePlan},
	{"graph, unclosed <node tags", repeat("<graph>\n", "<node id=\"s#\" depends=\"s1\" ", ""), parsePlan},
	// A bare argument full of '}': each looked back for its '{'.
	{"numbered, '}' run in a bare call", repeat("1. search(capital{", "}", ")\n2. join()\n"), parsePlan},
	{"graph, '}' run in a bare call", repeat("<graph><node id=\"s1\">search(x{", "}}}}}}}}", ")</node></graph>"), parsePlan},
	// Distinct tags after </plan>: each looked for its own closing tag.
	{"tasklist, distinct unclosed tags after </plan>", repeat(taskPlan, "<tool#>", ""), parsePlan},
	{"tasklist, distinct closed tags after </plan>", repeat(taskPlan, "<tool#>q</tool#>", ""), parsePlan},
	// A task whose description goes on for many lines.
	{"tasklist, long task description", repeat("T1: Find the capital\n", "and keep describing the task in more words\n", "- Dependencies: none\n"), parsePlan},
	// Every '{' a candidate JSON plan that reads to the end.
	{"json, nested unclosed objects", repeat("", "{\"id\":", ""), parsePlan},
	{"json, unclosed list of nodes", repeat("[", "{\"id\":\"s#\",\"tool\":\"search\"},", ""), parsePlan},
	{"steps, unclosed brackets", repeat("", "[{\"action\":[", ""), parsePlan},
	// Numbered calls whose strings run across lines.
	{"numbered, calls across lines", repeat("", "#. search(\"x', '\n", ""), parsePlan},
	// Answers, mentions, code and echo blocks.
	{"answer mentions in prose", repeat("", "put the result in <answer> tags, `<answer>x</answer>` ", ""), parsePlan},
	{"unclosed answers", repeat("", "<answer>", ""), parsePlan},
	{"planner-written observations", repeat("", "<observation>\ns1 search(\"x\") -> Paris\n</observation>\n<search>q</search>\n", ""), parsePlan},
	{"unclosed think and observation tags", repeat("", "<think><observation>", ""), parsePlan},
	{"backtick runs", repeat("", "` `` ``` ", ""), parsePlan},
	{"placeholders", repeat("1. search(\"", "$# ${x} {s#} ", "\")\n2. join()\n"), parsePlan},
}

// baseline decodes a valid JSON plan of the size asked for with
// encoding/json: the cost of reading that many bytes of plan at all.
var baseline = family{
	name: "baseline: encoding/json, valid JSON plan",
	gen: func(n int) string {
		var b strings.Builder
		b.WriteString(`{"nodes":[`)
		for k := 0; b.Len() < n-2; k++ {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"id":"T%d","tool":"search","args":{"query":"population of {T%d}"},"depends_on":["T%d"]}`, k+1, k, k)
		}
		b.WriteString("]}")
		return b.String()
	},
	parse: func(_ context.Context, s string) error {
		var v struct {
			Nodes []struct {
				ID        string         `json:"id"`
				Tool      string         `json:"tool"`
				Args      map[string]any `json:"args"`
				DependsOn []string       `json:"depends_on"`
			} `json:"nodes"`
		}
		return json.Unmarshal([]byte(s), &v)
	},
}

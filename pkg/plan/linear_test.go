package plan

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The parser's work is counted in steps (bytes examined, see meter), so
// these tests bound time without a clock: the steps per input byte must
// not grow with the input, and must stay under maxStepsPerByte. The known
// adversarial inputs (below) cost at most 56 steps per byte (runs of
// dependency ranges, each expanded); they are held to knownStepsPerByte,
// so that a constant factor that creeps back (a scan of the rest of the
// text per candidate) fails as growth would. Inputs the fuzzer makes up
// are held to the looser bound.
const (
	maxStepsPerByte   = 160
	knownStepsPerByte = 64
)

// grow writes prefix, then unit until the text has about n bytes, then
// suffix. A '#' in unit becomes the repetition's number, so that every
// repetition can name a distinct tag, node or placeholder.
func grow(prefix, unit, suffix string, n int) string {
	var b strings.Builder
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

const taskPlan = "<plan>\nT1: Find the capital of France\n- Dependencies: none\n</plan>\n"

// adversarial are malformed outputs that once made a pass of the parser
// rescan what it had scanned (first six), and others of the same kinds.
var adversarial = []struct{ name, prefix, unit, suffix string }{
	{"unclosed <node> elements", "<graph>\n", "<node id=\"s#\">search(\"capital of France\")\n", ""},
	{"'}' run in a bare call", "1. search(capital{", "}", ")\n2. join()\n"},
	{"distinct unclosed tags after </plan>", taskPlan, "<tool#>", ""},
	{"long task description", "T1: Find the capital\n", "and keep describing the task in more words\n", "- Dependencies: none\n"},
	{"nested unclosed JSON objects", "", "{\"id\":", ""},
	{"numbered calls across lines", "", "#. search(\"x', '\n", ""},
	{"unclosed <node tags", "<graph>\n", "<node id=\"s#\" depends=\"s1\" ", ""},
	{"unclosed graph tags", "", "<graph>", ""},
	{"unclosed plan tags", "", "<plan>\nT#: x\n", ""},
	{"distinct closed tags after </plan>", taskPlan, "<tool#>q</tool#>", ""},
	{"unclosed JSON list of nodes", "[", "{\"id\":\"s#\",\"tool\":\"search\"},", ""},
	{"unclosed step brackets", "", "[{\"action\":[", ""},
	{"fences", "", "```json\n{\"nodes\":[", ""},
	{"answer mentions", "", "put the result in <answer> tags, `<answer>x</answer>` ", ""},
	{"unclosed answers", "", "<answer>", ""},
	{"answers and plans", "", "<answer>x</answer><graph><node id=\"s#\">x</node></graph>", ""},
	{"planner-written observations", "", "<observation>\ns1 search(\"x\") -> Paris\n</observation>\n<search>q</search>\n", ""},
	{"unclosed think and observation", "", "<think><observation>", ""},
	{"observations left open", "", "<observation><result>", ""},
	{"backtick runs", "", "` `` ``` ", ""},
	{"placeholders", "1. search(\"", "$# ${x} {s#} ", "\")\n2. join()\n"},
	{"numbered lines", "", "#. search(\"x\") # note\n", "#. join()\n"},
	{"task lines", "", "T#: search(\"x {T1}\") - Dependencies: T1\n", ""},
	{"dependency ranges", "T1: x - Dependencies: ", "T1-T60, T2 to T63, ", "\n"},
	{"quotes in attributes", "<node ", "a='b\" ", ">"},
	// Each bare list that broke off used to scan the rest of the text for a
	// node's key: 64 candidates, 128 steps per byte (found by the fuzzer,
	// testdata/fuzz/FuzzParseLinear/ffa55171e0d7f998).
	{"bare lists that break off", "", "[x ", ""},
	{"closed graphs without nodes", "", "<graph></graph>", "<graph><node id=\"s1\">search(\"a\")</node></graph>"},
	{"dependency words in a task", "T1: find ", "what depends on task ", "\n- Dependencies: none\n"},
	{"tasks on one line", "<plan>", "T#: Find x - Dependencies: none  ", "</plan>"},
	{"task ids on one line", "T1: x ", "T#: y ", "\n"},
	{"graphs that repeat the plan", "<graph><node id=\"s1\">search(\"a\")</node></graph>\n", "<graph><node id=\"s1\">search(\"a\")</node></graph>\n", ""},
	{"dependency ranges without the end's T", "T1: x - Dependencies: ", "T1-60, T2 to 63, ", "\n"},
	{"closed plans without tasks", "", "<plan>\n</plan>\n", "<plan>\nT1: search(\"a\") - Dependencies: none\n</plan>"},
	{"plans that repeat the plan", "", "<plan>\nT1: Find a - Dependencies: none\n</plan>\n<search>a</search>\n", ""},
	{"plans and mentions of plans", "<plan>\nT1: Find a - Dependencies: none\n</plan>\n", "<plan></plan> <search>a</search> ", ""},
	{"prose about nodes after a graph", "<graph><node id=\"s1\">search(\"a\")</node></graph>\n", "each <node> is a step, <node id=\"s#\"> too; ", ""},
	{"graphs and prose about nodes", "<graph><node id=\"s1\">search(\"a\")</node></graph>\n", "<node> <graph></graph> ", ""},
	{"dependency numbers", "T1: x - Dependencies: ", "1-60, 2 to 63, ", "\n"},
	{"dependency numbers in prose", "T1: x - Dependencies: T1, ", "the 3 results of 4 ", "\n"},
	{"dependency ranges with leading zeros", "T01: x - Dependencies: ", "T01-T60, T02 to 63, ", "\n"},
	{"numbered dependencies on one line", "<plan>", "T#: Find x - depends on 1 and 2 ", "</plan>"},
	{"mentions before nodes without a graph", "", "<graph></graph> ", "\n<node id=\"s1\">search(\"a\")</node>"},
	{"nodes without a graph after a mention", "<graph></graph>\n", "<node id=\"s#\">search(\"a\")</node>\n", ""},
	{"mentions before tasks without a plan", "", "<plan></plan> ", "\nT1: search(\"a\") - Dependencies: none\n"},
	{"tasks without a plan after a mention", "<plan></plan>\n", "T#: Find x - Dependencies: none\n", ""},
	{"tasks before a plan", "", "T#: Find x - Dependencies: none\n", taskPlan},
	{"task-like prose before a plan", "", "T#: the capital comes first\n", taskPlan},
	{"prose dependency lists", "T1: x - Dependencies: ", "the previous task and all of the above ", "\n"},
	{"prose dependency lines", "T1: x\n", "- Dependencies: the one before\n", ""},
	{"colon keys in a task's text", "T1: find ", "what the law requires: a visa, deps: ", "\n- Dependencies: none\n"},
	// Each "depends on" read the rest of its line for a list of numbers
	// (numberList): 1.4 s for one line of 8,000 of them.
	{"dependency words without a colon", "T1: search(x) ", "it depends on weather ", "\n"},
	{"dependency statements", "T1: x\nT2: y\nDependencies:\n", "- T2 depends on T1 and T1\n", ""},
	{"dependency statements on one line", "T1: x\nT2: y\nDependencies:\n- T2 depends on ", "T1 and ", "T1\n"},
	{"dependency arrows", "T1: x\nT2: y\nDependencies:\n", "T1 -> T2 -> ", "T2\n"},
	{"dependency headings", "T1: x\n", "Dependencies:\n- T1\n", ""},
	{"task lists after a plan", taskPlan, "<search>q</search>\nT1: Find the capital of France\n- Dependencies: none\n", ""},
	{"calls between tasks and a plan", "", "T1: Find the capital of France\n- Dependencies: none\n<search>q</search>\n", taskPlan},
	{"plans and tasks after them", "", taskPlan + "T1: Find the capital of France\n- Dependencies: none\n", ""},
	{"dependency lines after a plan", "<plan>\nT1: x\nT2: y\n</plan>\nDependencies:\n", "- T2 depends on T1\n", "<search>a|b</search>"},
	{"dependency lines after the calls", "<plan>\nT1: x\nT2: y - Dependencies: T1\n</plan>\n<search>a|b</search>\nDependencies:\n", "- T2 depends on T1\n", ""},
	{"plans and dependency lines after them", "", "<plan>\nT1: x\nT2: y\n</plan>\nDependencies:\n- T2 depends on T1\n<search>a|b</search>\n", ""},
	{"calls between task-like prose and a plan", "", "T#: the capital comes first\n<search>q</search>\n", taskPlan},
}

// steps parses text and returns the steps it took.
func steps(t testing.TB, text string, opts Options) int {
	t.Helper()
	_, _, n, err := parseCounted(context.Background(), text, opts)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// linearFormats are the formats each input is parsed as.
var linearFormats = []Format{FormatAuto, FormatGraph, FormatTaskList, FormatJSON, FormatNumbered, FormatSteps, FormatAnswer}

// checkLinear fails if parsing large costs more steps per byte than small,
// beyond slack, or more than most at either size. The slack is for thresholds
// such as the JSON budget and encoding/json's nesting limit, which a small
// input may stay under and a large one reach; work that grows with the
// input (16 times more per byte from 4 KiB to 64 KiB, if quadratic) is far
// beyond it.
func checkLinear(t *testing.T, name, small, large string, opts Options, most float64) {
	t.Helper()
	s, l := steps(t, small, opts), steps(t, large, opts)
	ps, pl := float64(s)/float64(len(small)), float64(l)/float64(len(large))
	if pl > 1.5*ps+16 || max(ps, pl) > most {
		t.Errorf("%s (format %s): %.1f steps per byte at %d bytes, %.1f at %d bytes", name, opts.Format, ps, len(small), pl, len(large))
	}
}

func TestLinearWork(t *testing.T) {
	for _, a := range adversarial {
		t.Run(a.name, func(t *testing.T) {
			small := grow(a.prefix, a.unit, a.suffix, 4<<10)
			large := grow(a.prefix, a.unit, a.suffix, 64<<10)
			for _, f := range linearFormats {
				checkLinear(t, a.name, small, large, Options{Format: f, Stop: []string{"</answer>"}}, knownStepsPerByte)
			}
		})
	}
}

// TestLinearWorkGolden: the golden corpus, repeated, parses in linear work
// too (realistic text, many times over).
func TestLinearWorkGolden(t *testing.T) {
	for _, in := range goldenInputs(t) {
		small := grow("", in+"\n", "", 8<<10)
		large := grow("", in+"\n", "", 128<<10)
		checkLinear(t, "golden corpus", small, large, Options{}, knownStepsPerByte)
	}
}

// FuzzParseLinear looks for slow inputs: the output built from prefix, unit
// repeated (with '#' numbered) and suffix must cost no more steps per byte
// at 64 KiB than at 4 KiB.
func FuzzParseLinear(f *testing.F) {
	for i, a := range adversarial {
		f.Add(a.prefix, a.unit, a.suffix, uint8(i))
	}
	f.Fuzz(func(t *testing.T, prefix, unit, suffix string, format uint8) {
		if unit == "" || len(unit) > 256 || len(prefix)+len(suffix) > 1024 {
			return
		}
		opts := Options{Format: linearFormats[int(format)%len(linearFormats)]}
		if format&0x80 != 0 {
			opts.Stop = []string{"</answer>"}
		}
		checkLinear(t, fmt.Sprintf("%q + %q… + %q", prefix, unit, suffix),
			grow(prefix, unit, suffix, 4<<10), grow(prefix, unit, suffix, 64<<10), opts, maxStepsPerByte)
	})
}

// countdown is a context that ends after its Err has been asked n times:
// a cancellation in the middle of a parse, without a clock.
type countdown struct {
	context.Context
	n int
}

func (c *countdown) Done() <-chan struct{} { return make(chan struct{}) }

func (c *countdown) Err() error {
	if c.n <= 0 {
		return context.Canceled
	}
	c.n--
	return nil
}

func TestParseContext(t *testing.T) {
	huge := []string{
		grow("<graph>\n", "<node id=\"s#\">search(\"capital of France\")\n", "", 1<<20),
		grow("1. search(capital{", "}", ")\n2. join()\n", 1<<20),
		grow(taskPlan, "<tool#>", "", 1<<20),
		grow("", "{\"id\":", "", 1<<20),
		grow("", "<answer> `x` <observation>", "", 1<<20),
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i, in := range huge {
		t.Run(fmt.Sprintf("already cancelled %d", i), func(t *testing.T) {
			r, err := ParseContext(cancelled, in, Options{})
			var pe *Error
			if !errors.Is(err, context.Canceled) || errors.As(err, &pe) || r.Plan != nil {
				t.Fatalf("got %+v, %v; want context.Canceled", r, err)
			}
		})
		t.Run(fmt.Sprintf("cancelled midway %d", i), func(t *testing.T) {
			full := steps(t, in, Options{})
			_, _, n, err := parseCounted(&countdown{Context: context.Background(), n: 3}, in, Options{})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			// Stopped at the fourth look at the context: a few passes over
			// the text in (a look comes after each scan of it at most).
			if n > 8*len(in) || n >= full/2 {
				t.Errorf("stopped after %d steps (a whole parse takes %d)", n, full)
			}
		})
	}
	// A context that never ends changes nothing.
	for _, in := range goldenInputs(t) {
		r1, err1 := Parse(in, Options{})
		r2, err2 := ParseContext(context.Background(), in, Options{})
		if !reflect.DeepEqual(r1, r2) || !reflect.DeepEqual(err1, err2) {
			t.Errorf("ParseContext differs from Parse on %q", in)
		}
	}
}

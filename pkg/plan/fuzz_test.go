package plan

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// seeds adds the golden corpus and a few small inputs to f.
func seeds(f *testing.F, extra ...string) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.txt"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	for _, s := range extra {
		f.Add(s)
	}
}

var knownKinds = map[ErrorKind]bool{
	ErrSyntax: true, ErrEmpty: true, ErrDuplicateID: true, ErrUnknownDependency: true, ErrCycle: true,
	ErrUnknownTool: true, ErrTooManyNodes: true, ErrTooDeep: true, ErrArgumentTooLarge: true,
	ErrBadPlaceholder: true, ErrTruncated: true, ErrUnknownFormat: true,
}

// check parses text and verifies what every result must satisfy.
func check(t *testing.T, text string, opts Options) {
	r, err := Parse(text, opts)
	r2, err2 := Parse(text, opts)
	if !reflect.DeepEqual(r, r2) || !reflect.DeepEqual(err, err2) {
		t.Fatalf("Parse is not deterministic")
	}
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			t.Fatalf("error %v is %T, not *Error", err, err)
		}
		if !knownKinds[pe.Kind] || pe.Message == "" {
			t.Fatalf("bad error %#v", pe)
		}
		if pe.Kind == ErrCycle && (len(pe.Cycle) < 2 || pe.Cycle[0] != pe.Cycle[len(pe.Cycle)-1]) {
			t.Fatalf("bad cycle %v", pe.Cycle)
		}
		if _, err := json.Marshal(pe); err != nil {
			t.Fatal(err)
		}
		return
	}
	if r.Format == FormatAnswer {
		if len(r.Answers) == 0 || r.Plan != nil {
			t.Fatalf("bad answer result %+v", r)
		}
		return
	}
	o := opts.withDefaults()
	p := r.Plan
	if p == nil || len(p.Nodes) == 0 || len(p.Nodes) > o.MaxNodes {
		t.Fatalf("bad plan %+v", r)
	}
	ids := map[string]bool{}
	for _, n := range p.Nodes {
		if ids[n.ID] || n.ID == "" || n.Tool == "" || n.Args == nil || n.Deps == nil {
			t.Fatalf("bad node %+v", n)
		}
		ids[n.ID] = true
	}
	// Numbers name nodes only in plans that name nodes by number.
	numbered := p.Format == FormatNumbered
	for _, n := range p.Nodes {
		numbered = numbered || isNumber(n.ID)
	}
	outputs := map[string]string{}
	for _, n := range p.Nodes {
		for _, d := range n.Deps {
			if !ids[d] {
				t.Fatalf("node %s: unknown dependency %s", n.ID, d)
			}
			outputs[d] = "out"
		}
		for _, name := range n.Placeholders() {
			if (numbered || !isNumber(name)) && !slices.Contains(n.Deps, name) {
				t.Fatalf("node %s: placeholder %s is not a dependency", n.ID, name)
			}
		}
		_ = Substitute(n, outputs)
		_ = n.Input()
	}
	lv := p.Levels()
	count := 0
	for _, l := range lv {
		count += len(l)
	}
	if count != len(p.Nodes) || len(lv) > o.MaxDepth {
		t.Fatalf("levels %v for %d nodes", lv, len(p.Nodes))
	}
	if path, _ := p.CriticalPath(nil); len(path) != len(lv) {
		t.Fatalf("critical path %v, %d levels", path, len(lv))
	}
	_ = p.DOT()
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func fuzzFormat(f *testing.F, format Format, extra ...string) {
	seeds(f, extra...)
	f.Fuzz(func(t *testing.T, text string) {
		check(t, text, Options{Format: format})
		check(t, text, Options{Format: format, Tools: []string{"search", "math"}, MaxNodes: 4, MaxDepth: 3, MaxArgBytes: 16})
	})
}

func FuzzParseGraph(f *testing.F) {
	fuzzFormat(f, FormatGraph,
		`<graph><node id="s1">search("a")</node><node id="s2" depends="s1">search("{s1}")</node></graph>`,
		`<node id='a' depends=b/><node id=b>x(1, [2], k={"a": [3]})`)
}

func FuzzParseTaskList(f *testing.F) {
	fuzzFormat(f, FormatTaskList,
		"<plan>\nT1: a\n- Dependencies: none\nT2: b\n- Dependencies: T1\n</plan>\n<search>x|y {T1}</search>",
		"T1: search(\"x\") - Dependencies: -\n**Task 2:** y (Dependencies: T1 and T2)")
}

func FuzzParseJSON(f *testing.F) {
	fuzzFormat(f, FormatJSON,
		`{"nodes":[{"id":"T1","tool":"search","args":{"query":"a"},"depends_on":[]},{"id":"T2","tool":"search","args":{"query":"{T1}"},"depends_on":["T1"]}]}`,
		"text ```json\n{\"plan\": {\"nodes\": [{\"id\": 1, \"tool\": \"x\"}, {\"id\": 2")
}

func FuzzParseNumbered(f *testing.F) {
	fuzzFormat(f, FormatNumbered,
		"Thought: t\n1. search(\"a\")\n2. math(\"b\", [\"$1\", \"${1}\"])\n3. join()",
		"1. search(capital of France)\n2) math($1, 2.5e3, x=None)")
}

func FuzzParseSteps(f *testing.F) {
	fuzzFormat(f, FormatSteps,
		`[{"id":"step_1","action":"search","params":{"query":"a"},"dependencies":[]},{"id":"step_2","action":"search","params":{"query":"{step_1}"},"dependencies":["step_1"]}]`,
		`{"steps": [{"id": "step_1", "action": {"name": "x", "args": ["a"]}, "dependencies": "none"}`)
}

func FuzzParseAnswer(f *testing.F) {
	seeds(f, "<answer>a | b</answer>", "<think><answer>x</answer></think><answer>", "</think><ANSWER>y",
		"I use <answer> tags, `<answer>x</answer>` \"<answer>y</answer>\" <answer>your answer</answer> <answer>z</answer>",
		"<observation><answer>x</answer></observation>```\n<answer>y</answer>\n```<graph><node id=\"a\">x(\"<answer>z</answer>\")</node></graph>")
	f.Fuzz(func(t *testing.T, text string) {
		check(t, text, Options{Format: FormatAnswer})
		// With the stop string stripped, an answer left open at the end
		// may count too.
		check(t, text, Options{Format: FormatAnswer, Stop: []string{"</answer>"}})
		check(t, text, Options{Stop: []string{"</answer>"}})
	})
}

func FuzzDetect(f *testing.F) {
	seeds(f, "<answer>x</answer>", "1. a()", "T1: a", `{"nodes":[]}`, "<think>", "</think><graph>")
	f.Fuzz(func(t *testing.T, text string) {
		got := Detect(text)
		switch got {
		case FormatAuto, FormatGraph, FormatTaskList, FormatJSON, FormatNumbered, FormatSteps, FormatAnswer:
		default:
			t.Fatalf("Detect = %q", got)
		}
		if Detect(text) != got {
			t.Fatal("Detect is not deterministic")
		}
		check(t, text, Options{})
		if got != FormatAuto {
			// Forcing the detected format must not panic either.
			_, _ = Parse(text, Options{Format: got})
		}
	})
}

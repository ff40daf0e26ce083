package plan

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// withIDs returns the two-step capital plan every format below writes, with ids a and b and the placeholder written
// as ref.
func withIDs(a, b, ref, argKey string) []Node {
	n0 := Node{ID: a, Tool: "search", Args: map[string]any{argKey: "capital of France"}, Deps: []string{}}
	n1 := Node{ID: b, Tool: "search", Args: map[string]any{argKey: "population of " + ref}, Deps: []string{a}}
	return []Node{n0, n1}
}

func TestParseFormats(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		format Format
		want   []Node
	}{
		{"graph", `<graph><node id="s1">search("capital of France")</node><node id="s2" depends="s1">search("population of {s1}")</node></graph>`,
			FormatGraph, withIDs("s1", "s2", "{s1}", "input")},
		{"graph single quotes and spaces", "<graph>\n  <node id='s1'> search('capital of France') </node>\n  <node id='s2' depends='s1'>\n    search(\"population of {s1}\")\n  </node>\n</graph>",
			FormatGraph, withIDs("s1", "s2", "{s1}", "input")},
		{"graph without wrapper", `<node id="s1">search("capital of France")</node> <node id="s2" depends="s1">search("population of {s1}")</node>`,
			FormatGraph, withIDs("s1", "s2", "{s1}", "input")},
		{"graph missing </node>", "<graph>\n<node id=\"s1\">search(\"capital of France\")\n<node id=\"s2\" depends=\"s1\">search(\"population of {s1}\")\n</graph>",
			FormatGraph, withIDs("s1", "s2", "{s1}", "input")},
		{"tasklist with tool tag", "<plan>\nT1: Find the capital of France\n- Dependencies: none\nT2: Find the population of the city found in T1\n- Dependencies: T1\n</plan>\n<search>capital of France|population of {T1}</search>",
			FormatTaskList, func() []Node {
				n := withIDs("T1", "T2", "{T1}", "input")
				n[0].Description = "Find the capital of France"
				n[1].Description = "Find the population of the city found in T1"
				return n
			}()},
		{"tasklist inline calls", "T1: search(\"capital of France\") - Dependencies: none\nT2: search(\"population of {T1}\") - Dependencies: T1\n",
			FormatTaskList, withIDs("T1", "T2", "{T1}", "input")},
		{"json", `{"nodes":[{"id":"T1","tool":"search","args":{"input":"capital of France"},"depends_on":[]},{"id":"T2","tool":"search","args":{"input":"population of {T1}"},"depends_on":["T1"]}]}`,
			FormatJSON, withIDs("T1", "T2", "{T1}", "input")},
		{"json fenced with text", "Sure, here is the plan.\n```json\n{\"nodes\": [\n {\"id\": \"T1\", \"tool\": \"search\", \"args\": {\"query\": \"capital of France\"}, \"depends_on\": []},\n {\"id\": \"T2\", \"tool\": \"search\", \"args\": {\"query\": \"population of {T1}\"}, \"depends_on\": [\"T1\"]}\n]}\n```\nLet me know {if} you need more.",
			FormatJSON, withIDs("T1", "T2", "{T1}", "query")},
		{"numbered", "Thought: capital first.\n1. search(\"capital of France\")\n2. search(\"population of $1\")\n3. join()",
			FormatNumbered, func() []Node {
				n := withIDs("1", "2", "$1", "input")
				n[0].Description = "capital first."
				return n
			}()},
		{"numbered braces ref", "1. search(\"capital of France\")\n2. search(\"population of ${1}\")\n<END_OF_PLAN>\n3. search(\"ignored\")",
			FormatNumbered, withIDs("1", "2", "${1}", "input")},
		{"steps", `[{"id":"step_1","action":"search","params":{"query":"capital of France"},"dependencies":[]},{"id":"step_2","action":"search","params":{"query":"population of {step_1}"},"dependencies":["step_1"]}]`,
			FormatSteps, withIDs("step_1", "step_2", "{step_1}", "query")},
		{"steps object", "```\n{\"steps\": [{\"id\":\"step_1\",\"action\":\"search\",\"params\":{\"query\":\"capital of France\"},\"dependencies\":[]},{\"id\":\"step_2\",\"action\":\"search\",\"params\":{\"query\":\"population of {step_1}\"},\"dependencies\":\"step_1\"}]}\n```",
			FormatSteps, withIDs("step_1", "step_2", "{step_1}", "query")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Detect(tt.in); got != tt.format {
				t.Errorf("Detect = %q, want %q", got, tt.format)
			}
			for _, f := range []Format{FormatAuto, tt.format} {
				r, err := Parse(tt.in, Options{Format: f})
				if err != nil {
					t.Fatalf("Parse(%s): %v", f, err)
				}
				if r.Format != tt.format || r.Plan == nil || r.Plan.Format != tt.format {
					t.Fatalf("Parse(%s) format = %q", f, r.Format)
				}
				if !reflect.DeepEqual(r.Plan.Nodes, tt.want) {
					t.Errorf("Parse(%s) nodes =\n%#v\nwant\n%#v", f, r.Plan.Nodes, tt.want)
				}
			}
		})
	}
}

func TestParseDetails(t *testing.T) {
	tests := []struct {
		name string
		in   string
		opts Options
		want []Node
	}{
		{"graph bare text node uses default tool",
			`<graph><node id="s1">Summarise the findings</node></graph>`, Options{DefaultTool: "llm"},
			[]Node{{ID: "s1", Tool: "llm", Args: map[string]any{"input": "Summarise the findings"}, Deps: []string{}}}},
		{"graph several deps",
			`<graph><node id="a">x("1")</node><node id="b">x("2")</node><node id="c" depends="a, b">x("{a}{b}")</node><node id="d" depends="a b">x("3")</node></graph>`, Options{},
			[]Node{
				{ID: "a", Tool: "x", Args: map[string]any{"input": "1"}, Deps: []string{}},
				{ID: "b", Tool: "x", Args: map[string]any{"input": "2"}, Deps: []string{}},
				{ID: "c", Tool: "x", Args: map[string]any{"input": "{a}{b}"}, Deps: []string{"a", "b"}},
				{ID: "d", Tool: "x", Args: map[string]any{"input": "3"}, Deps: []string{"a", "b"}},
			}},
		{"call argument kinds",
			`<graph><node id="s1">math("compare", ["$1", "x"], 3, k=true, opts={"n": 2})</node></graph>`, Options{},
			[]Node{{ID: "s1", Tool: "math", Args: map[string]any{"input": "compare", "context": []any{"$1", "x"}, "arg3": float64(3), "k": true, "opts": map[string]any{"n": float64(2)}}, Deps: []string{}}}},
		{"unquoted call argument",
			`<graph><node id="s1">search(capital of France, Europe)</node></graph>`, Options{},
			[]Node{{ID: "s1", Tool: "search", Args: map[string]any{"input": "capital of France, Europe"}, Deps: []string{}}}},
		{"tasklist partial calls and dependency styles",
			"<plan>\nT1: Find A\nDependencies: -\nT2: Find B - Dependencies: none\nT3: Compare A and B\n- Dependencies: T1 and T2\n</plan>\n<wiki_search>A|B</wiki_search>",
			Options{Tools: []string{"wiki_search", "actor"}},
			[]Node{
				{ID: "T1", Tool: "wiki_search", Args: map[string]any{"input": "A"}, Deps: []string{}, Description: "Find A"},
				{ID: "T2", Tool: "wiki_search", Args: map[string]any{"input": "B"}, Deps: []string{}, Description: "Find B"},
				{ID: "T3", Tool: "actor", Args: map[string]any{"input": "Compare A and B"}, Deps: []string{"T1", "T2"}, Description: "Compare A and B"},
			}},
		{"tasklist two tags, inline tool",
			"<plan>\nT1: Look up X\n- Dependencies: none\nT2: calc(\"2+2\") - Dependencies: none\nT3: Look up Y\n- Dependencies: T1, T2\n</plan>\n<search>X</search>\n<lookup>Y {T1}</lookup>",
			Options{},
			[]Node{
				{ID: "T1", Tool: "search", Args: map[string]any{"input": "X"}, Deps: []string{}, Description: "Look up X"},
				{ID: "T2", Tool: "calc", Args: map[string]any{"input": "2+2"}, Deps: []string{}},
				{ID: "T3", Tool: "lookup", Args: map[string]any{"input": "Y {T1}"}, Deps: []string{"T1", "T2"}, Description: "Look up Y"},
			}},
		{"json field aliases and numeric ids",
			`{"plan": {"nodes": [{"id": 1, "name": "search", "arguments": "x"}, {"id": 2, "function": "math", "parameters": {"expression": "{1}*2"}, "deps": [1]}]}}`, Options{},
			[]Node{
				{ID: "1", Tool: "search", Args: map[string]any{"input": "x"}, Deps: []string{}},
				{ID: "2", Tool: "math", Args: map[string]any{"expression": "{1}*2"}, Deps: []string{"1"}},
			}},
		{"steps without action use description",
			`[{"id": "step_1", "description": "Think about it", "dependencies": []}]`, Options{},
			[]Node{{ID: "step_1", Tool: "actor", Args: map[string]any{"input": "Think about it"}, Deps: []string{}, Description: "Think about it"}}},
		{"tool names matched ignoring case",
			`<graph><node id="s1">Search("x")</node></graph>`, Options{Tools: []string{"search"}},
			[]Node{{ID: "s1", Tool: "search", Args: map[string]any{"input": "x"}, Deps: []string{}}}},
		{"plan inside think ignored",
			"<think>\n<graph><node id=\"bad\">x(\"1\")</node></graph>\n</think>\n<graph><node id=\"good\">x(\"2\")</node></graph>", Options{},
			[]Node{{ID: "good", Tool: "x", Args: map[string]any{"input": "2"}, Deps: []string{}}}},
		{"lone </think> from the chat template",
			"<graph><node id=\"bad\">x(\"1\")</node></graph> hmm </think>\n1. x(\"2\")", Options{},
			[]Node{{ID: "1", Tool: "x", Args: map[string]any{"input": "2"}, Deps: []string{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.in, tt.opts)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(r.Plan.Nodes, tt.want) {
				t.Errorf("nodes =\n%#v\nwant\n%#v", r.Plan.Nodes, tt.want)
			}
		})
	}
}

func TestParseAnswer(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"simple", "<answer>Paris</answer>", []string{"Paris"}},
		{"several", "The answers: <answer> Paris | 2.1 million |  </answer>", []string{"Paris", "2.1 million"}},
		{"wins over plan", "<graph><node id=\"s1\">search(\"x\")</node></graph>\n<answer>done</answer>", []string{"done"}},
		{"stop string stripped", "I know it now.\n<answer>Paris", []string{"Paris"}},
		{"empty one skipped", "<answer></answer> then <ANSWER>Lyon</ANSWER>", []string{"Lyon"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.in, Options{Stop: []string{"</answer>"}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Format != FormatAnswer || r.Plan != nil || !reflect.DeepEqual(r.Answers, tt.want) {
				t.Errorf("got %+v, want answers %q", r, tt.want)
			}
		})
	}
	// An answer only inside a think block does not count.
	if _, err := Parse("<think><answer>x</answer></think>", Options{}); err == nil {
		t.Error("answer inside <think> accepted")
	}
}

func TestParseTruncated(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantIDs []string // nil: expect a truncated error
		errHas  string
	}{
		{"graph node cut", `<graph><node id="s1">search("a")</node><node id="s2" depends="s1">search("{s1}")</node><node id="s3" depends="s2">search("po`, []string{"s1", "s2"}, ""},
		{"graph cut, complete nodes invalid", `<graph><node id="s1" depends="s3">search("a")</node><node id="s2">b</node><node id="s3">search("po`, nil, "s3, which is not a node"},
		{"graph cut before first node", `<graph><node id="s1">sear`, nil, "before any complete node"},
		{"json cut", `{"nodes":[{"id":"T1","tool":"search","args":{"query":"a"}},{"id":"T2","tool":"sea`, []string{"T1"}, ""},
		{"steps cut", "```json\n[{\"id\":\"step_1\",\"action\":\"search\",\"params\":{\"query\":\"a\"},\"dependencies\":[]},\n{\"id\":\"step_2\"", []string{"step_1"}, ""},
		{"tasklist cut", "<plan>\nT1: Find A\n- Dependencies: none\nT2: Find B\n- Dependencies: T1\nT3: Comp", []string{"T1", "T2"}, ""},
		{"tasklist cut after task line", "<plan>\nT1: Find A\n- Dependencies: none\nT2: Find B\n", []string{"T1"}, ""},
		{"numbered cut", "1. search(\"a\")\n2. search(\"b $1\")\n3. math(\"comp", []string{"1", "2"}, ""},
		{"think cut", "<think>I should search for the capital and", nil, "inside <think>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.in, Options{})
			if tt.wantIDs == nil {
				var pe *Error
				if !errors.As(err, &pe) || pe.Kind != ErrTruncated || !strings.Contains(pe.Message, tt.errHas) {
					t.Fatalf("err = %#v, want truncated containing %q", err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, n := range r.Plan.Nodes {
				ids = append(ids, n.ID)
			}
			if !reflect.DeepEqual(ids, tt.wantIDs) || r.Truncated == "" {
				t.Errorf("ids = %v (truncated %q), want %v", ids, r.Truncated, tt.wantIDs)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	big := strings.Repeat("x", 100)
	tests := []struct {
		name      string
		in        string
		opts      Options
		kind      ErrorKind
		msg       string // exact message, or "" to skip
		node      string
		cycle     []string
		msgSubstr string
	}{
		{name: "empty text", in: "  \n", kind: ErrEmpty},
		{name: "empty answer", in: "<think>done</think><answer> </answer>", kind: ErrEmpty, msg: "the <answer> is empty; write the answer between <answer> and </answer>"},
		{name: "empty graph", in: "<graph></graph>", kind: ErrEmpty, msg: "the plan has no nodes; write at least one step"},
		{name: "unknown format", in: "I am not sure what to do.", kind: ErrUnknownFormat},
		{name: "forced format missing", in: "1. search(\"x\")", opts: Options{Format: FormatGraph}, kind: ErrSyntax},
		{name: "forced answer missing", in: "1. search(\"x\")", opts: Options{Format: FormatAnswer}, kind: ErrSyntax},
		{name: "bad format name", in: "1. search(\"x\")", opts: Options{Format: "yaml"}, kind: ErrUnknownFormat},
		{name: "duplicate id", in: `<graph><node id="s1">a</node><node id="s1">b</node></graph>`, kind: ErrDuplicateID, node: "s1",
			msg: "node id s1 is used by two nodes (steps 1 and 2); give every node its own id"},
		{name: "missing id", in: `<graph><node>a</node></graph>`, kind: ErrSyntax, msgSubstr: "has no id"},
		{name: "bad id", in: `{"nodes":[{"id":"a.b","tool":"x"}]}`, kind: ErrSyntax, node: "a.b"},
		{name: "unknown dependency", in: `<graph><node id="s1">a</node><node id="s2" depends="s7">b</node></graph>`, kind: ErrUnknownDependency, node: "s2",
			msg: "node s2 depends on s7, which is not a node of the plan"},
		{name: "cycle", in: `<graph><node id="s1" depends="s3">a</node><node id="s2">b</node><node id="s3" depends="s1">c</node></graph>`, kind: ErrCycle, node: "s1",
			cycle: []string{"s1", "s3", "s1"}, msg: "plan has a cycle: s1 -> s3 -> s1; no node may depend on itself, directly or through others"},
		{name: "self dependency", in: "T1: do it - Dependencies: T1", kind: ErrCycle, cycle: []string{"T1", "T1"}},
		{name: "numbered forward reference cycle", in: "1. a(\"$2\")\n2. b(\"$1\")", kind: ErrCycle, cycle: []string{"1", "2", "1"}},
		{name: "unknown tool", in: `<graph><node id="s1">serch("x")</node></graph>`, opts: Options{Tools: []string{"search", "math"}}, kind: ErrUnknownTool, node: "s1",
			msg: `node s1 uses the unknown tool "serch"; the tools are: search, math`},
		{name: "unknown tool tag", in: "<plan>T1: a - Dependencies: none</plan><serch>x</serch>", opts: Options{Tools: []string{"search"}}, kind: ErrUnknownTool},
		{name: "too many nodes", in: "1. a(\"1\")\n2. a(\"2\")\n3. a(\"3\")", opts: Options{MaxNodes: 2}, kind: ErrTooManyNodes,
			msg: "the plan has 3 nodes; the limit is 2, so plan fewer steps at a time"},
		{name: "too deep", in: "1. a(\"1\")\n2. a(\"$1\")\n3. a(\"$2\")", opts: Options{MaxDepth: 2}, kind: ErrTooDeep, msgSubstr: "3 nodes (1 -> 2 -> 3); the limit is 2"},
		{name: "argument too large", in: `<graph><node id="s1">search("` + big + `")</node></graph>`, opts: Options{MaxArgBytes: 50}, kind: ErrArgumentTooLarge, node: "s1",
			msg: `node s1: argument "input" is 100 bytes; the limit is 50`},
		{name: "list argument too large", in: `{"nodes":[{"id":"a","tool":"x","args":{"items":["` + big + `"]}}]}`, opts: Options{MaxArgBytes: 50}, kind: ErrArgumentTooLarge},
		{name: "placeholder not a dependency", in: `<graph><node id="s1">a</node><node id="s2">search("population of {s1}")</node></graph>`, kind: ErrBadPlaceholder, node: "s2",
			msg: "node s2 uses {s1}, but s1 is not one of its dependencies; add s1 to its dependencies or remove {s1}"},
		{name: "placeholder to itself", in: `<graph><node id="s1">search("{s1}")</node></graph>`, kind: ErrBadPlaceholder, node: "s1"},
		{name: "json syntax", in: "{\"nodes\": [\n{\"id\": \"T1\", \"tool\": \"x\"},,\n]}", kind: ErrSyntax, msgSubstr: "not valid JSON at line 2"},
		{name: "json node not object", in: `{"nodes": ["search x"]}`, kind: ErrSyntax, msgSubstr: "not an object"},
		{name: "numbered bad call", in: "1. search(\"x\")\n2. search(\"y\" \"z\")\n3. join()", kind: ErrSyntax, msgSubstr: "line 2"},
		{name: "too many tool calls", in: "<plan>T1: a - Dependencies: none</plan><search>x|y</search>", kind: ErrSyntax, msgSubstr: "2 tool calls"},
		{name: "graph node empty", in: `<graph><node id="s1"></node></graph>`, kind: ErrSyntax, node: "", msgSubstr: "node s1 is empty"},
		{name: "think cut", in: "<think>so", kind: ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.in, tt.opts)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v (%T), want *Error", err, err)
			}
			if pe.Kind != tt.kind {
				t.Fatalf("kind = %q, want %q (%s)", pe.Kind, tt.kind, pe.Message)
			}
			if tt.msg != "" && pe.Message != tt.msg {
				t.Errorf("message = %q\nwant      %q", pe.Message, tt.msg)
			}
			if !strings.Contains(pe.Message, tt.msgSubstr) {
				t.Errorf("message = %q, want it to contain %q", pe.Message, tt.msgSubstr)
			}
			if tt.node != "" && pe.Node != tt.node {
				t.Errorf("node = %q, want %q", pe.Node, tt.node)
			}
			if tt.cycle != nil && !reflect.DeepEqual(pe.Cycle, tt.cycle) {
				t.Errorf("cycle = %v, want %v", pe.Cycle, tt.cycle)
			}
			if pe.Error() != pe.Message {
				t.Errorf("Error() = %q", pe.Error())
			}
		})
	}
}

func TestDetect(t *testing.T) {
	tests := []struct {
		in   string
		want Format
	}{
		{"", FormatAuto},
		{"just words", FormatAuto},
		{"<answer>x</answer>", FormatAnswer},
		{`<graph><node id="s1">a</node></graph>`, FormatGraph},
		{"<plan>\nT1: a\n</plan>", FormatTaskList},
		{"T1: a - Dependencies: none", FormatTaskList},
		{`{"nodes": []}`, FormatJSON},
		{`[{"id": "step_1", "action": "x"}]`, FormatSteps},
		{"1. search(\"x\")", FormatNumbered},
		{"1. Search the web for x", FormatAuto},
		{"<think><graph></graph></think>1. a()", FormatNumbered},
		{"Plan in JSON, no <graph> tags:\n```json\n{\"nodes\":[]}\n```", FormatGraph}, // earliest marker wins
	}
	for _, tt := range tests {
		if got := Detect(tt.in); got != tt.want {
			t.Errorf("Detect(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// Parse falls back to the next format when the first finds no plan.
	r, err := Parse("Plan in JSON, no <graph> tags:\n```json\n{\"nodes\":[{\"id\":\"a\",\"tool\":\"x\"}]}\n```", Options{})
	if err != nil || r.Format != FormatJSON {
		t.Errorf("Parse = %+v, %v; want a JSON plan", r, err)
	}
}

// TestDefaultToolChecked: a node that names no tool gets the default tool,
// which must be one of the tools like any other: the planner is told so at
// parse time, not the act-dispatcher at act time.
func TestDefaultToolChecked(t *testing.T) {
	search := Options{Tools: []string{"search"}}
	for _, c := range []struct {
		name string
		in   string
		opts Options
	}{
		{"graph bare text node", `<graph><node id="s1">Summarise the findings</node></graph>`, search},
		{"task without a call", "<plan>\nT1: Find A\n- Dependencies: none\nT2: Compare\n- Dependencies: T1\n</plan>\n<search>A</search>", search},
		{"json node without a tool", `{"nodes":[{"id":"T1","args":{"query":"x"}}]}`, search},
		{"default tool named but unknown", `<graph><node id="s1">Summarise</node></graph>`, Options{Tools: []string{"search"}, DefaultTool: "llm"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.in, c.opts)
			var pe *Error
			want := cmpOr(c.opts.DefaultTool, DefaultTool)
			if !errors.As(err, &pe) || pe.Kind != ErrUnknownTool || !strings.Contains(pe.Message, `"`+want+`"`) || !strings.Contains(pe.Message, "search") {
				t.Fatalf("err = %v, want an unknown-tool error naming %q and the tools", err, want)
			}
		})
	}
	// A default tool that is one of the tools is fine, and any tool is
	// fine when no tools are given.
	for _, opts := range []Options{{Tools: []string{"search", "llm"}, DefaultTool: "llm"}, {}} {
		if _, err := Parse(`<graph><node id="s1">Summarise</node></graph>`, opts); err != nil {
			t.Errorf("%+v: %v", opts, err)
		}
	}
	// While a task list is still being written (a streamed plan), tasks
	// wait for their calls with the default tool (schema.Config.PartialNodes
	// leaves them out).
	r, err := Parse("<plan>\nT1: Find A\n- Dependencies: none\nT2: Find B\n- Dependencies: T1\n</plan>\n<search>A</search>\n", Options{Tools: []string{"search"}, Partial: true})
	if err != nil || len(r.Plan.Nodes) != 2 || r.Plan.Nodes[1].Tool != DefaultTool {
		t.Errorf("partial task list: %+v %v", r.Plan, err)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestTaskListCutInsideCalls: a task whose call was cut off is not a
// complete node: it is dropped as truncated, not run with the default tool.
func TestTaskListCutInsideCalls(t *testing.T) {
	const tasks = "<plan>\nT1: Find the capital of France\n- Dependencies: none\nT2: Find its population\n- Dependencies: T1\n</plan>\n"
	for _, c := range []struct {
		name string
		in   string
	}{
		{"inside the queries", tasks + "<search>capital of France|population of {T"},
		{"inside the first query", tasks + "<search>capital of France</search>\n<search>population"},
		{"inside the opening tag", tasks + "<search>capital of France</search>\n<sea"},
	} {
		for _, opts := range []Options{{}, {Tools: []string{"search"}}} {
			r, err := Parse(c.in, opts)
			if err != nil {
				t.Fatalf("%s %+v: %v", c.name, opts, err)
			}
			if len(r.Plan.Nodes) != 1 || r.Plan.Nodes[0].ID != "T1" || r.Plan.Nodes[0].Tool != "search" || r.Truncated == "" {
				t.Errorf("%s %+v: nodes %+v (truncated %q), want T1 alone, truncated", c.name, opts, r.Plan.Nodes, r.Truncated)
			}
		}
	}
}

// TestNumberedLines: <END_OF_PLAN> ends the plan after the call on its
// line, and a line may hold several numbered calls.
func TestNumberedLines(t *testing.T) {
	two := withIDs("1", "2", "$1", "input")
	for _, c := range []struct {
		name string
		in   string
		want []Node
	}{
		{"end marker after the last call", "1. search(\"capital of France\")\n2. search(\"population of $1\")<END_OF_PLAN>\n3. search(\"ignored\")", two},
		{"end marker after a space", "1. search(\"capital of France\")\n2. search(\"population of $1\") <END_OF_PLAN>", two},
		{"two calls on a line", "1. search(\"capital of France\"); 2. search(\"population of $1\")", two},
		{"two calls and a join on a line", "1. search(\"capital of France\") 2. search(\"population of $1\") 3. join()", two},
		{"unquoted calls on a line", "1. search(capital of France); 2. search(population of $1)", two},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Parse(c.in, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.Plan.Nodes, c.want) || r.Truncated != "" {
				t.Errorf("nodes =\n%#v (truncated %q)\nwant\n%#v", r.Plan.Nodes, r.Truncated, c.want)
			}
		})
	}
	// A malformed call before the marker is an error, not a cut.
	if _, err := Parse("1. search(\"a\")\n2. search(\"b\" \"c\")<END_OF_PLAN>", Options{}); err == nil || !strings.Contains(err.Error(), "step 2") {
		t.Errorf("malformed call before the marker: %v", err)
	}
}

// TestTaskDependencyRanges: T1-T3 (or with an en or em dash, or "to")
// is T1, T2 and T3; a range backwards or wider than a plan may be is an
// error naming it.
func TestTaskDependencyRanges(t *testing.T) {
	tasks := "T1: a - Dependencies: none\nT2: b - Dependencies: none\nT3: c - Dependencies: none\nT4: d - Dependencies: none\n"
	for _, c := range []struct {
		deps string
		want []string
	}{
		{"T1-T3", []string{"T1", "T2", "T3"}},
		{"T1–T3", []string{"T1", "T2", "T3"}},
		{"T1 — T3", []string{"T1", "T2", "T3"}},
		{"T1 to T3", []string{"T1", "T2", "T3"}},
		{"Task 1 to Task 3", []string{"T1", "T2", "T3"}},
		{"T2-T3, T1", []string{"T2", "T3", "T1"}},
		{"T1, T2-T3 and T4", []string{"T1", "T2", "T3", "T4"}},
		{"T1 - T1", []string{"T1"}},
		{"T1 and T3", []string{"T1", "T3"}},
		// The end's T left out.
		{"T1-3", []string{"T1", "T2", "T3"}},
		{"T2–4", []string{"T2", "T3", "T4"}},
		{"Task 1 - 3", []string{"T1", "T2", "T3"}},
		{"T1 to 3, T4", []string{"T1", "T2", "T3", "T4"}},
		{"[T1-2]", []string{"T1", "T2"}},
	} {
		r, err := Parse(tasks+"T5: e - Dependencies: "+c.deps+"\n", Options{})
		if err != nil {
			t.Errorf("%s: %v", c.deps, err)
			continue
		}
		if got := r.Plan.Nodes[4].Deps; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: deps %v, want %v", c.deps, got, c.want)
		}
	}
	for _, deps := range []string{"T3-T1", "T1-T999999", "T3-1", "T1-999999"} {
		_, err := Parse(tasks+"T5: e - Dependencies: "+deps+"\n", Options{})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || !strings.Contains(pe.Message, deps) || pe.Node != "T5" {
			t.Errorf("%s: %v, want an error naming the range", deps, err)
		}
	}
}

// TestDependencyRangesInLists: a graph's or a JSON plan's dependency is a
// node id, and ids may hold '-': a range there ("s1-3", "s1 - s3") is not
// read as its first node (dropping the rest) but refused, by an error
// that names it and lists the nodes to write instead.
func TestDependencyRangesInLists(t *testing.T) {
	graph := func(deps string) string {
		return `<graph><node id="s1">search("a")</node><node id="s2">search("b")</node><node id="s3">search("c")</node>` +
			`<node id="s4" depends="` + deps + `">search("d")</node></graph>`
	}
	json := func(deps string) string {
		return `{"nodes":[{"id":"s1","tool":"search"},{"id":"s2","tool":"search"},{"id":"s3","tool":"search"},` +
			`{"id":"s4","tool":"search","depends_on":` + deps + `}]}`
	}
	for _, c := range []struct{ in, rng string }{
		{graph("s1-3"), "s1-3"},
		{graph("s1-s3"), "s1-s3"},
		{graph("s1–s3"), "s1–s3"},
		{graph("s1 - s3"), "s1-s3"},
		{graph("s1 to s3"), "s1-s3"},
		{graph("[s1 — 3]"), "s1-3"},
		{json(`"s1-3"`), "s1-3"},
		{json(`"s1 - s3"`), "s1-s3"},
		{json(`["s1-3"]`), "s1-3"},
	} {
		_, err := Parse(c.in, Options{})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrUnknownDependency || pe.Node != "s4" ||
			!strings.Contains(pe.Message, "depends on "+c.rng+",") || !strings.HasSuffix(pe.Message, ": s1, s2, s3") {
			t.Errorf("Parse(%q): %v, want an unknown_dependency error naming %s and listing s1, s2, s3", c.in, err, c.rng)
		}
	}
	// A node whose id looks like a range is a node like any other; and an
	// id with '-' that is no range gets the plain error.
	r, err := Parse(`<graph><node id="s1-3">search("a")</node><node id="s4" depends="s1-3">search("{s1-3}")</node></graph>`, Options{})
	if err != nil || !reflect.DeepEqual(r.Plan.Nodes[1].Deps, []string{"s1-3"}) {
		t.Errorf("a node named s1-3: %+v %v", r.Plan, err)
	}
	_, err = Parse(graph("s1-5"), Options{})
	if err == nil || err.Error() != "node s4 depends on s1-5, which is not a node of the plan" {
		t.Errorf("a range over missing nodes: %v", err)
	}
	// Lists without a range are read as before.
	for _, deps := range []string{"s1, s3", "s1 s3", "s1 and s3", "[s1, s3]"} {
		r, err := Parse(graph(deps), Options{})
		if err != nil || !reflect.DeepEqual(r.Plan.Nodes[3].Deps, []string{"s1", "s3"}) {
			t.Errorf("depends=%q: %+v %v, want s1, s3", deps, r.Plan, err)
		}
	}
}

// TestTwoGraphs: an output with two <graph> elements that hold nodes has
// two plans; which one the planner means is a guess, so it is an error
// naming both, unless they hold the same nodes. Empty ones are mentions.
func TestTwoGraphs(t *testing.T) {
	const (
		a  = "<graph>\n<node id=\"s1\">search(\"a\")</node>\n</graph>"
		a2 = "<graph><node id=\"s1\">\n  search( \"a\" )\n</node></graph>"
		b  = "<graph>\n<node id=\"s1\">search(\"b\")</node>\n</graph>"
	)
	for _, c := range []struct {
		in          string
		first, next int // the lines of the two plans' <graph>s; 0: no error
	}{
		{a + "\nActually, better:\n" + b, 1, 5},
		{a + "\n" + a + "\n" + b, 1, 7},
		{a + "\n\n<graph>\n<node id=\"s1\">search(\"b\")</node>\n<node id=\"s2\">search(\"c", 1, 5}, // the second cut off
		{a + "\n<graph><node id=\"s1\" tool=\"search\">a</node></graph>", 0, 0},                     // the same node
		{a + "\n" + b + "\n", 1, 4},
		{"<graph></graph>\n" + a + "\n" + b, 2, 5},
		{a + "\nThe same again:\n" + a2, 0, 0},
		{a + "\n<graph></graph> tags are what I used.", 0, 0},
		{a + "\n<graph", 0, 0},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if c.first == 0 {
			if err != nil || len(r.Plan.Nodes) != 1 || r.Plan.Nodes[0].Input() != "a" {
				t.Errorf("Parse(%q) = %+v, %v; want the plan search(\"a\")", c.in, r.Plan, err)
			}
			continue
		}
		var pe *Error
		want := fmt.Sprintf("the <graph> at line %d and the <graph> at line %d", c.first, c.next)
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.next || !strings.Contains(pe.Message, want) {
			t.Errorf("Parse(%q): %+v, %v; want a syntax error at line %d naming %s", c.in, r.Plan, err, c.next, want)
		}
	}
}

// TestTwoPlans: an output with two <plan> elements that hold tasks has two
// plans, as with <graph>: an error naming both, unless they hold the same
// tasks, and the calls after them are the same or only one of them has
// calls (the planner repeated its plan before or after the calls).
func TestTwoPlans(t *testing.T) {
	const (
		a  = "<plan>\nT1: Find a - Dependencies: none\n</plan>"
		a2 = "<plan>T1:  Find a\n- Dependencies: none</plan>"
		b  = "<plan>\nT1: Find b - Dependencies: none\n</plan>"
		x  = "\n<search>a</search>"
		y  = "\n<search>b</search>"
	)
	for _, c := range []struct {
		in          string
		first, next int // the lines of the two plans' <plan>s; 0: no error
		input       string
	}{
		{a + "\nActually, better:\n" + b, 1, 5, ""},
		{a + x + "\nActually, better:\n" + b + y, 1, 6, ""},
		{a + x + "\n" + a + y, 1, 5, ""}, // the same tasks, other calls
		{a + "\n" + a + "\n" + b, 1, 7, ""},
		{"<plan></plan>\n" + a + "\n" + b, 2, 5, ""},
		{a + "\n\n<plan>\nT1: Find b - Dependencies: none\nT2: Find c", 1, 5, ""}, // the second cut off
		{a + x + "\n" + a + "\n<sea", 1, 5, ""},                                   // calls that differ by a cut
		{a + "\n" + a + x, 0, 0, "a"},
		{a + x + "\n" + a + x, 0, 0, "a"},
		{a + "\nThe same again:\n" + a2 + x, 0, 0, "a"},
		{a + x + "\nThat is:\n" + a, 0, 0, "a"},
		{a + x + "\n<plan></plan> tags are what I used.", 0, 0, "a"},
		{a + x + "\nThe <plan> above has one task.", 0, 0, "a"},
		{a + x + "\n<plan", 0, 0, "a"},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if c.first == 0 {
			if err != nil || len(r.Plan.Nodes) != 1 || r.Plan.Nodes[0].Input() != c.input || r.Plan.Nodes[0].Tool != "search" {
				t.Errorf("Parse(%q) = %+v, %v; want the plan search(%q)", c.in, r.Plan, err, c.input)
			}
			continue
		}
		var pe *Error
		want := fmt.Sprintf("the <plan> at line %d and the <plan> at line %d", c.first, c.next)
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.next || !strings.Contains(pe.Message, want) {
			t.Errorf("Parse(%q): %+v, %v; want a syntax error at line %d naming %s", c.in, r.Plan, err, c.next, want)
		}
	}
	// Calls that follow a repeated plan go to it, as they would to one.
	r, err := Parse(a+"\n"+a+"\n<search>a|b</search>", Options{})
	if err == nil {
		t.Errorf("two calls for a repeated one-task plan: %+v, want the extra call refused", r.Plan)
	}
	r, err = Parse(a+"\n"+a+"\n<search>a|b", Options{})
	if err != nil || r.Truncated == "" || r.Plan.Nodes[0].Input() != "a" {
		t.Errorf("calls cut off after a repeated plan: %+v, %v; want T1 kept and the cut reported", r, err)
	}
}

// TestNodesOutsideGraph: a node element outside the <graph> that holds the
// plan (before it, after it, between two copies of it) is part of a plan
// the <graph> leaves out: an error naming it, not a node dropped. Prose
// about nodes is not a node.
func TestNodesOutsideGraph(t *testing.T) {
	const a = "<graph>\n<node id=\"s1\">search(\"a\")</node>\n</graph>"
	for _, c := range []struct {
		in   string
		line int    // of the node outside; 0: no error
		node string // its id
	}{
		{a + "\n<node id=\"s2\" depends=\"s1\">search(\"{s1}\")</node>", 4, "s2"},
		{a + "\n<node>search(\"b\")</node>", 4, ""},
		{a + "\n<node id=\"s2\" tool=\"search\" input=\"b\"/>", 4, "s2"},
		{"<node id=\"s0\">search(\"z\")</node>\n" + a, 1, "s0"},
		{a + "\nAnd:\n<node id=\"s2\">search(\"b\")</node>\n" + a, 5, "s2"},
		{"<graph></graph>\n<node id=\"s0\">search(\"z\")</node>\n" + a, 2, "s0"},
		{"<node id=\"s0\">search(\"z\")</node>\n<graph>\n<node id=\"s1\">search(\"a\")</node>\n<node id=\"s2\">sea", 1, "s0"},
		{a + "\nEach <node> is one step.", 0, ""},
		{a + "\nHere <node id=\"s1\"> runs first.", 0, ""},
		{a + "\nI wrote `<node id=\"s1\">search(\"a\")</node>` above.", 0, ""},
		{"Write each step as \"<node id=\"sN\">tool(args)</node>\":\n" + a, 0, ""},
		{a + "\n<node id=\"s2\" depends=\"s1\">search(\"{s1}", 0, ""}, // cut off: never written
		{a + "\n<node", 0, ""},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if c.line == 0 {
			if err != nil || len(r.Plan.Nodes) != 1 || r.Plan.Nodes[0].Input() != "a" {
				t.Errorf("Parse(%q) = %+v, %v; want the plan search(\"a\")", c.in, r.Plan, err)
			}
			continue
		}
		var pe *Error
		want := fmt.Sprintf(" at line %d is outside the <graph>", c.line)
		if c.node != "" {
			want = fmt.Sprintf("<node id=%q>", c.node) + want
		}
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.line || pe.Node != c.node || !strings.Contains(pe.Message, want) {
			t.Errorf("Parse(%q): %+v, %v; want a syntax error at line %d saying %q", c.in, r.Plan, err, c.line, want)
		}
	}
}

// TestTaskDependencyNumbers: a dependency list that names tasks by their
// numbers ("1, 2", "depends on 1 and 2") names T1 and T2, as "T1-3" names
// T3; numbers among other words are text, but a list of them that names
// no task is an error, not a task without dependencies.
func TestTaskDependencyNumbers(t *testing.T) {
	tasks := "T1: a - Dependencies: none\nT2: b - Dependencies: none\nT3: c - Dependencies: none\nT4: d - Dependencies: none\n"
	for _, c := range []struct {
		task string
		want []string
	}{
		{"T5: e - Dependencies: 1, 2", []string{"T1", "T2"}},
		{"T5: e - Dependencies: 1 and 2.", []string{"T1", "T2"}},
		{"T5: e - Dependencies: [1, 3]", []string{"T1", "T3"}},
		{"T5: e - Dependencies: #2", []string{"T2"}},
		{"T5: e - Dependencies: 1-3", []string{"T1", "T2", "T3"}},
		{"T5: e - Dependencies: 2 to 4", []string{"T2", "T3", "T4"}},
		{"T5: e - Dependencies: Task 1 and 2", []string{"T1", "T2"}},
		{"T5: e - Dependencies: T1, 3", []string{"T1", "T3"}},
		{"T5: e - Dependencies: steps 1 and 4", []string{"T1", "T4"}},
		{"T5: e depends on 1 and 2", []string{"T1", "T2"}},
		{"T5: e (depends on 4)", []string{"T4"}},
		{"T5: e - dependencies 1, 2", []string{"T1", "T2"}},
		// Numbers in prose are not tasks.
		{"T5: e - Dependencies: T1 (its top 3 results)", []string{"T1"}},
		{"T5: e - Dependencies: none (it needs 2 searches)", []string{}},
		{"T5: how the price depends on 2 factors - Dependencies: T4", []string{"T4"}},
		{"T5: search(\"what it depends on 2\") - Dependencies: none", []string{}},
	} {
		r, err := Parse(tasks+c.task+"\n", Options{})
		if err != nil {
			t.Errorf("%s: %v", c.task, err)
			continue
		}
		if got := r.Plan.Nodes[4].Deps; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: deps %v, want %v", c.task, got, c.want)
		}
	}
	for _, c := range []struct{ deps, want string }{
		{"the results of 1 and 2", "(T1, T2)"},
		{"the 3 searches above", "(T3)"},
		// A decimal is no task number: the list names no task.
		{"1.5", `as in "Dependencies: T1, T2"`},
	} {
		_, err := Parse(tasks+"T5: e - Dependencies: "+c.deps+"\n", Options{})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Node != "T5" || pe.Line != 5 ||
			!strings.Contains(pe.Message, fmt.Sprintf("%q", c.deps)) || !strings.Contains(pe.Message, c.want) {
			t.Errorf("Dependencies: %s: %v, want a syntax error naming the list and %s", c.deps, err, c.want)
		}
	}
}

// TestTaskDependencyLeadingZeros: a task named by its number alone (the
// middle of a range, a bare number, the end of "T01-3") is the plan's task
// of that number, however its id is written; one named by its id is that id.
func TestTaskDependencyLeadingZeros(t *testing.T) {
	tasks := "T01: a - Dependencies: none\nT02: b - Dependencies: none\nT03: c - Dependencies: none\n"
	for _, c := range []struct {
		deps string
		want []string
	}{
		{"T01-T03", []string{"T01", "T02", "T03"}},
		{"T01 to T03", []string{"T01", "T02", "T03"}},
		{"T01-3", []string{"T01", "T02", "T03"}},
		{"1-3", []string{"T01", "T02", "T03"}},
		{"1, 3", []string{"T01", "T03"}},
		{"T02, 2", []string{"T02"}},
	} {
		r, err := Parse(tasks+"T04: d - Dependencies: "+c.deps+"\n", Options{})
		if err != nil {
			t.Errorf("%s: %v", c.deps, err)
			continue
		}
		if got := r.Plan.Nodes[3].Deps; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: deps %v, want %v", c.deps, got, c.want)
		}
	}
	// An id is the id written: T1 is no task of this plan.
	_, err := Parse(tasks+"T04: d - Dependencies: T1-T3\n", Options{})
	if err == nil || err.Error() != "node T04 depends on T1, which is not a node of the plan" {
		t.Errorf("T1-T3 in a plan of T01…: %v", err)
	}
	// Without the plan's task of that number, the id is written as the range's.
	_, err = Parse("T01: a - Dependencies: none\nT03: c - Dependencies: none\nT04: d - Dependencies: T01-T03\n", Options{})
	if err == nil || err.Error() != "node T04 depends on T02, which is not a node of the plan" {
		t.Errorf("T01-T03 without T02: %v", err)
	}
}

// TestJSONKeysDifferingInCase: of keys that differ only in case, the one
// spelled as planact spells it wins, every time.
func TestJSONKeysDifferingInCase(t *testing.T) {
	in := `{"nodes":[{"ID":"x","id":"s1","Tool":"calc","tool":"search","args":{"query":"a"}},{"Id":"s2","id":"s3","tool":"search","args":{"query":"{s1}"},"Depends_On":["s9"],"depends_on":["s1"]}]}`
	for range 50 {
		r, err := Parse(in, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range r.Plan.Nodes {
			got = append(got, n.ID+":"+n.Tool+":"+strings.Join(n.Deps, ","))
		}
		if want := []string{"s1:search:", "s3:search:s1"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("nodes %v, want %v", got, want)
		}
	}
	// Without the exact spelling, the first in byte order wins.
	for range 50 {
		r, err := Parse(`{"nodes":[{"Id":"b","ID":"a","tool":"search"}]}`, Options{})
		if err != nil || r.Plan.Nodes[0].ID != "a" {
			t.Fatalf("got %+v %v, want id a (ID before Id)", r.Plan, err)
		}
	}
}

// TestJSONKeysInAnyCase: keys are matched ignoring case everywhere: in a
// bare list of steps, in a tool given as an object, and in a list that
// breaks off.
func TestJSONKeysInAnyCase(t *testing.T) {
	for _, c := range []struct {
		in     string
		format Format
		want   string
	}{
		{`[{"ID": "s1", "Tool": "search", "Args": {"query": "x"}}]`, FormatJSON, "s1 search(x)"},
		{`[{"Id": "step_1", "Action": "search", "Params": {"query": "x"}, "Dependencies": []}]`, FormatSteps, "step_1 search(x)"},
		{`{"steps":[{"id":"s1","action":{"Name":"search","Args":{"query":"x"}}}]}`, FormatSteps, "s1 search(x)"},
		{`[{"ID": "s1", "Tool": "search", "Args": {"query": "x"}}, {"ID": "s2", "Tool": "sea`, FormatJSON, "s1 search(x)"},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("Parse(%s): %v", c.in, err)
			continue
		}
		var got []string
		for _, n := range r.Plan.Nodes {
			got = append(got, fmt.Sprintf("%s %s(%s)", n.ID, n.Tool, n.Input()))
		}
		if g := strings.Join(got, "; "); g != c.want || r.Format != c.format {
			t.Errorf("Parse(%s) = %s %s, want %s %s", c.in, r.Format, g, c.format, c.want)
		}
	}
	// A list cut off in its first step is a plan cut off, not prose.
	var pe *Error
	if _, err := Parse(`[{"ID": "s1", "Tool": "sea`, Options{}); !errors.As(err, &pe) || pe.Kind != ErrTruncated {
		t.Errorf("a list cut off in its first step: %v, want a %s error", err, ErrTruncated)
	}
}

// TestPlanAfterMention: a closed <graph> or <plan> that holds no plan (the
// planner names the tags it will use) is a mention; the plan after it is
// read, not refused as empty.
func TestPlanAfterMention(t *testing.T) {
	for _, in := range []string{
		"I will write the plan in `<graph>…</graph>` tags.\n<graph>\n<node id=\"s1\">search(\"a\")</node>\n</graph>",
		"Here is the plan in <graph></graph>:\n<graph><node id=\"s1\">search(\"a\")</node></graph>",
		"I will write the plan in `<plan>…</plan>` tags.\n<plan>\nT1: search(\"a\") - Dependencies: none\n</plan>",
		"<plan></plan>\n<plan>\nT1: Find a\n- Dependencies: none\n</plan>\n<search>a</search>",
	} {
		r, err := Parse(in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if r.Plan == nil || len(r.Plan.Nodes) != 1 || r.Plan.Nodes[0].Tool != "search" || r.Plan.Nodes[0].Input() != "a" {
			t.Errorf("Parse(%q) = %+v, want one search(\"a\")", in, r)
		}
	}
}

// TestTaskDependencyWords: "depends on" and "dependencies" in a task's text
// (its call's argument, its description, a note under it) do not start a
// dependency list unless one follows them.
func TestTaskDependencyWords(t *testing.T) {
	type node struct{ tool, input, deps string }
	for _, c := range []struct {
		in   string
		want []node
	}{
		{"<plan>\nT1: search(\"what the price of oil depends on\")\n- Dependencies: none\n</plan>",
			[]node{{"search", "what the price of oil depends on", ""}}},
		{"<plan>\nT1: Find the city whose economy depends on tourism\n- Dependencies: none\n</plan>",
			[]node{{"actor", "Find the city whose economy depends on tourism", ""}}},
		{"<plan>\nT1: List the dependencies of numpy\n- Dependencies: none\n</plan>",
			[]node{{"actor", "List the dependencies of numpy", ""}}},
		{"T1: Find A - Dependencies: none\nT2: Find B - Dependencies: T1\n  Note that the answer depends on the season.",
			[]node{{"actor", "Find A", ""}, {"actor", "Find B", "T1"}}},
		// Still dependency lists.
		{"T1: Find A (depends on nothing)\nT2: Find B (depends on T1)\nT3: Find C **Dependencies** T1 and T2",
			[]node{{"actor", "Find A", ""}, {"actor", "Find B", "T1"}, {"actor", "Find C", "T1,T2"}}},
	} {
		r, err := Parse(c.in, Options{})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		var got []node
		for _, n := range r.Plan.Nodes {
			got = append(got, node{n.Tool, n.Input(), strings.Join(n.Deps, ",")})
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// TestTasksOnOneLine: tasks may share a line, as in the task list of
// docs/plans.md: a task starts after the dependencies of the one before.
func TestTasksOnOneLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"<plan>T1: Find the capital of France - Dependencies: none  T2: Find its population - Dependencies: T1</plan>\n<search>capital of France|population of {T1}</search>",
			"T1 search(capital of France) <- ; T2 search(population of {T1}) <- T1"},
		{"<plan>T1: Find A - Dependencies: none  T3: Find C - Dependencies: T1, T2  T2: Find B - Dependencies: T1</plan>",
			"T1 actor(Find A) <- ; T3 actor(Find C) <- T1,T2; T2 actor(Find B) <- T1"},
		{"T1: search(\"a\")\n- Dependencies: none  T2: search(\"{T1}\") - Dependencies: T1",
			"T1 search(a) <- ; T2 search({T1}) <- T1"},
		// An id with a colon in a task's text, or in prose after its
		// dependencies, starts no task.
		{"T1: Find A - Dependencies: none\nT2: Find B - Dependencies: T1 (its result T1: the capital)",
			"T1 actor(Find A) <- ; T2 actor(Find B) <- T1"},
		{"T1: Find A - Dependencies: none\nT2: Compare T1: the capital, with B - Dependencies: T1",
			"T1 actor(Find A) <- ; T2 actor(Compare T1: the capital, with B) <- T1"},
	} {
		r, err := Parse(c.in, Options{})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		var got []string
		for _, n := range r.Plan.Nodes {
			got = append(got, fmt.Sprintf("%s %s(%s) <- %s", n.ID, n.Tool, n.Input(), strings.Join(n.Deps, ",")))
		}
		if g := strings.Join(got, "; "); g != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.in, g, c.want)
		}
	}
}

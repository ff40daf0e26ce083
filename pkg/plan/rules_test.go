package plan

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// twoSteps is a valid graph plan that the cases below put text around.
const twoSteps = "<graph>\n<node id=\"s1\">search(\"capital of Kenya\")</node>\n<node id=\"s2\" depends=\"s1\">search(\"population of {s1}\")</node>\n</graph>"

// TestAnswerRules: only a closed <answer> element that the planner wrote
// as its answer ends the episode; mentions, code, plan text and echoes do
// not, and the last answer wins.
func TestAnswerRules(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		opts    Options
		answers []string // nil: a plan (or the error in errHas)
		nodes   int      // nodes of the plan, when answers is nil
		errHas  string
	}{
		// Mentions.
		{name: "unclosed mention before a plan", in: "I will give the result in <answer> tags.\n" + twoSteps, nodes: 2},
		{name: "unclosed mention after a plan", in: twoSteps + "\nNext turn I will write the <answer> for you.", nodes: 2},
		{name: "mention then real answer", in: "I use <answer> tags: <answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		{name: "quoted element", in: `The format is "<answer>Nairobi</answer>", but first:` + "\n" + twoSteps, nodes: 2},
		{name: "typographic quotes", in: "The format is “<answer>Nairobi</answer>”.\n" + twoSteps, nodes: 2},
		{name: "template echo", in: "Reply with <answer>your answer</answer> and nothing else.\n" + twoSteps, nodes: 2},
		{name: "no letters", in: "<answer>…</answer>\n" + twoSteps, nodes: 2},
		{name: "mention only", in: "I will reply in <answer> tags.", errHas: "never closed"},
		// Code.
		{name: "code span", in: "I reply with `<answer>Nairobi</answer>` later.\n" + twoSteps, nodes: 2},
		{name: "double backtick span", in: "Use ``<answer>x</answer>`` later.\n" + twoSteps, nodes: 2},
		{name: "fenced block", in: "```\n<answer>Nairobi</answer>\n```\n" + twoSteps, nodes: 2},
		{name: "unclosed fence", in: twoSteps + "\n```\n<answer>Nairobi</answer>", nodes: 2},
		{name: "code span in the answer", in: "<answer>run `ls`</answer>", answers: []string{"run `ls`"}},
		{name: "stray backtick", in: "don`t know.\n<answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		{name: "stray backtick on the answer's line", in: "don`t know, so <answer>Nairobi</answer>\n", answers: []string{"Nairobi"}},
		{name: "stray backtick at the end", in: "He is 6` tall: <answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		// Part of the plan.
		{name: "inside a graph node", in: "<graph>\n<node id=\"s1\">actor(\"wrap it in <answer>x</answer>\")</node>\n</graph>", nodes: 1},
		{name: "inside a bare node", in: "<node id=\"s1\">actor(\"wrap it in <answer>x</answer>\")</node>", nodes: 1},
		{name: "inside a plan block", in: "<plan>\nT1: write <answer>x</answer> - Dependencies: none\n</plan>", nodes: 1},
		{name: "inside a JSON argument", in: `[{"id":"step_1","action":"actor","params":{"prompt":"say <answer>x</answer>"}}]`, nodes: 1},
		{name: "inside a numbered call", in: "1. llm(\"say <answer>x</answer>\")\n2. join()", nodes: 1},
		{name: "inside a tool tag", in: "<plan>\nT1: Reply\n- Dependencies: none\n</plan>\n<actor>say <answer>x</answer></actor>", nodes: 1},
		{name: "inside an unwrapped task list", in: "T1: llm(\"say <answer>x</answer>\") - Dependencies: none", nodes: 1},
		{name: "after an unwrapped task list", in: "T1: search(\"x\") - Dependencies: none\nI know it already: <answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		{name: "between task lines", in: "T1: Find x\nthen <answer>y</answer>\n- Dependencies: none", nodes: 1},
		{name: "answer opened before a plan", in: "<answer>\n" + twoSteps + "\n</answer>", nodes: 2},
		{name: "answer after the plan", in: twoSteps + "\nActually I know it: <answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		{name: "answer after an unclosed graph", in: "<graph>\n<node id=\"s1\">search(\"x\")</node>\n<answer>Nairobi</answer>", answers: []string{"Nairobi"}},
		{name: "answer before a JSON plan", in: "<answer>Nairobi</answer>\n" + `{"nodes":[{"id":"a","tool":"x"}]}`, answers: []string{"Nairobi"}},
		// Echoes.
		{name: "inside an observation", in: twoSteps + "\n<observation>\ns1 search(\"x\") -> <answer>Nairobi</answer>\n</observation>", nodes: 2},
		{name: "inside think", in: "<think><answer>Nairobi</answer></think>" + twoSteps, nodes: 2},
		// Which one.
		{name: "last wins", in: "<answer>Lyon</answer> no, wait. <answer>Paris</answer>", answers: []string{"Paris"}},
		{name: "last with text wins", in: "<answer>Paris</answer> <answer> </answer>", answers: []string{"Paris"}},
		{name: "several", in: "<answer>Paris | 2.1 million</answer>", answers: []string{"Paris", "2.1 million"}},
		// Unclosed at the end: only when the engine stripped </answer>.
		{name: "unclosed at the end", in: "I know it.\n<answer>Nairobi", errHas: "never closed"},
		{name: "stripped stop string", in: "I know it.\n<answer>Nairobi", opts: Options{Stop: []string{"\n\n", "</ANSWER>"}}, answers: []string{"Nairobi"}},
		{name: "stripped stop string after a plan", in: twoSteps + "\n<answer>Nairobi", opts: Options{Stop: []string{"</answer>"}}, answers: []string{"Nairobi"}},
		{name: "stop string, but a mention", in: "I will reply in <answer> tags", opts: Options{Stop: []string{"</answer>"}}, errHas: "never closed"},
		{name: "stop string, but a plan follows", in: "I will reply with <answer> later\n" + twoSteps, opts: Options{Stop: []string{"</answer>"}}, nodes: 2},
		{name: "stop string, mention before a numbered plan", in: "Then I give the <answer>\n1. search(\"x\")\n2. join()", opts: Options{Stop: []string{"</answer>"}}, nodes: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.in, tt.opts)
			switch {
			case tt.errHas != "":
				var pe *Error
				if !errors.As(err, &pe) || !strings.Contains(pe.Message, tt.errHas) {
					t.Fatalf("got %+v, %v; want an error containing %q", r, err, tt.errHas)
				}
			case err != nil:
				t.Fatalf("Parse: %v", err)
			case tt.answers != nil:
				if r.Format != FormatAnswer || !reflect.DeepEqual(r.Answers, tt.answers) {
					t.Fatalf("got %+v, want answers %q", r, tt.answers)
				}
			default:
				if r.Plan == nil || len(r.Plan.Nodes) != tt.nodes {
					t.Fatalf("got %+v, want a plan of %d nodes", r, tt.nodes)
				}
			}
			if got, want := Detect(tt.in) == FormatAnswer, tt.answers != nil && tt.opts.Stop == nil; got != want {
				t.Errorf("Detect = %q", Detect(tt.in))
			}
		})
	}
}

// TestEchoBlocks: what a planner writes inside an <observation> (or a
// look-alike) of its own is ignored by every format.
func TestEchoBlocks(t *testing.T) {
	obs := func(body string) string { return "\n<observation>\n" + body + "\n</observation>\n" }
	tests := []struct {
		name   string
		in     string
		format Format
		ids    []string
	}{
		{"tool tags after a task list",
			"<plan>\nT1: Find the capital\n- Dependencies: none\n</plan>\n<search>capital of Kenya</search>" + obs("T1 search(\"capital of Kenya\") -> Nairobi\n<search>population of Nairobi</search>"),
			FormatTaskList, []string{"T1"}},
		{"graph nodes", "<node id=\"s1\">search(\"x\")</node>" + obs("<node id=\"s1\">search(\"x\")</node> -> Paris"), FormatGraph, []string{"s1"}},
		{"graph nodes in a graph left open", "<graph>\n<node id=\"s1\">search(\"x\")</node>" + obs("<node id=\"s2\">search(\"y\")</node>"), FormatGraph, []string{"s1"}},
		{"numbered calls", "1. search(\"x\")" + obs("1. search(\"x\") -> Paris") + "2. search(\"$1\")\n3. join()", FormatNumbered, []string{"1", "2"}},
		{"task lines", "T1: search(\"x\") - Dependencies: none" + obs("T1: search(\"x\") -> Paris - Dependencies: none"), FormatTaskList, []string{"T1"}},
		{"a JSON plan", obs(`{"nodes":[{"id":"T9","tool":"search"}]}`) + "1. search(\"x\")\n2. join()", FormatNumbered, []string{"1"}},
		{"steps", `[{"id":"step_1","action":"search","params":{"query":"x"}}]` + obs(`[{"id":"step_1","action":"search"}]`), FormatSteps, []string{"step_1"}},
		{"planact's error observation", obs("Your plan could not be used: node s2 uses {s9}; <node id=\"s9\">x</node>") + twoSteps, FormatGraph, []string{"s1", "s2"}},
		{"tool_response", twoSteps + "\n<tool_response><node id=\"s3\">x</node></tool_response>", FormatGraph, []string{"s1", "s2"}},
		{"capitalised", twoSteps + "\n<Observation><node id=\"s3\">x</node></Observation>", FormatGraph, []string{"s1", "s2"}},
		{"nested look-alikes", twoSteps + "\n<observation><result><node id=\"s3\">x</node></result><node id=\"s4\">y</node></observation>", FormatGraph, []string{"s1", "s2"}},
		// A mention of the tag is not a block: it must not swallow the plan.
		{"mention before the plan", "After the plan I will see an <observation> with every result.\n" + twoSteps, FormatGraph, []string{"s1", "s2"}},
		{"mention before a real block", "I will see an <observation> soon.\n" + twoSteps + obs("<node id=\"s3\">x</node>"), FormatGraph, []string{"s1", "s2"}},
		{"closing tag alone", twoSteps + "\n</observation>", FormatGraph, []string{"s1", "s2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, f := range []Format{FormatAuto, tt.format} {
				r, err := Parse(tt.in, Options{Format: f})
				if err != nil {
					t.Fatalf("Parse(%s): %v", f, err)
				}
				var ids []string
				for _, n := range r.Plan.Nodes {
					ids = append(ids, n.ID)
				}
				if r.Format != tt.format || !reflect.DeepEqual(ids, tt.ids) {
					t.Errorf("Parse(%s) = %s plan %v, want %s plan %v", f, r.Format, ids, tt.format, tt.ids)
				}
			}
		})
	}
}

// TestPlaceholderRules: every placeholder names a node of the plan that is
// one of its dependencies, in every format and every syntax; numbers are
// names only in plans that name nodes by number.
func TestPlaceholderRules(t *testing.T) {
	tests := []struct {
		name string
		in   string
		msg  string // "" : the plan is valid
		node string
	}{
		{name: "numbered $N past the end", in: "1. search(\"a\")\n2. search(\"b $1\")\n3. search(\"c $2 $7\")\n4. join()",
			msg: "node 3 uses $7, but the plan has no node 7; a placeholder can only name one of node 3's dependencies: 2", node: "3"},
		{name: "numbered ${N}", in: "1. search(\"a\")\n2. search(\"b ${9}\")", msg: "node 2 uses ${9}, but the plan has no node 9, and node 2 has no dependencies; remove ${9}, or add the node it needs and depend on it", node: "2"},
		{name: "numbered {N}", in: "1. search(\"a\")\n2. search(\"b {4}\")", msg: "node 2 uses {4}, but the plan has no node 4", node: "2"},
		{name: "numbered named", in: "1. search(\"a\")\n2. search(\"b {s1}\")", msg: "node 2 uses {s1}, but the plan has no node s1", node: "2"},
		{name: "numbered $0", in: "1. search(\"a $0\")", msg: "node 1 uses $0, but the plan has no node 0", node: "1"},
		{name: "graph {sN}", in: "<graph><node id=\"s1\">search(\"a\")</node><node id=\"s2\" depends=\"s1\">search(\"{s1} {s9}\")</node></graph>",
			msg: "node s2 uses {s9}, but the plan has no node s9; a placeholder can only name one of node s2's dependencies: s1", node: "s2"},
		{name: "graph ${name}", in: "<node id=\"a\">search(\"${x}\")</node>", msg: "node a uses ${x}, but the plan has no node x", node: "a"},
		{name: "graph numeric ids", in: "<node id=\"1\">search(\"a\")</node><node id=\"2\" depends=\"1\">search(\"{1} {3}\")</node>", msg: "node 2 uses {3}, but the plan has no node 3", node: "2"},
		{name: "tasklist tool tag {TN}", in: "<plan>\nT1: a\n- Dependencies: none\nT2: b\n- Dependencies: T1\n</plan>\n<search>a|b {T5}</search>", msg: "node T2 uses {T5}, but the plan has no node T5", node: "T2"},
		{name: "tasklist description {TN}", in: "T1: Find a - Dependencies: none\nT2: Compare {T1} with {T3} - Dependencies: T1", msg: "node T2 uses {T3}, but the plan has no node T3", node: "T2"},
		{name: "json ${x}", in: `{"nodes":[{"id":"T1","tool":"search","args":{"query":"a"}},{"id":"T2","tool":"search","args":{"query":"${x}"},"depends_on":["T1"]}]}`, msg: "node T2 uses ${x}, but the plan has no node x", node: "T2"},
		{name: "json nested argument", in: `{"nodes":[{"id":"T1","tool":"math","args":{"items":["a",{"b":"{T7}"}]}}]}`, msg: "node T1 uses {T7}, but the plan has no node T7", node: "T1"},
		{name: "json numeric ids", in: `{"nodes":[{"id":1,"tool":"x"},{"id":2,"tool":"x","args":"$1 $3","deps":[1]}]}`, msg: "node 2 uses $3, but the plan has no node 3", node: "2"},
		{name: "steps {step_N}", in: `[{"id":"step_1","action":"x","params":{"q":"{step_2}"}}]`, msg: "node step_1 uses {step_2}, but the plan has no node step_2", node: "step_1"},
		{name: "known node, not a dependency", in: "<node id=\"a\">x(\"1\")</node><node id=\"b\">x(\"{a}\")</node>", msg: "node b uses {a}, but a is not one of its dependencies; add a to its dependencies or remove {a}", node: "b"},
		{name: "itself", in: "<node id=\"a\">x(\"{a}\")</node>", msg: "node a refers to its own output with {a}", node: "a"},
		// Valid.
		{name: "numbered refs", in: "1. search(\"a\")\n2. math(\"b\", [\"$1\", \"${1}\", \"{1}\"])\n3. join()"},
		{name: "prices in a graph", in: "<node id=\"s1\">search(\"flights under $100, 2^{10}\")</node>"},
		{name: "numbers in steps", in: `[{"id":"step_1","action":"x","params":{"q":"$5 {2}"}}]`},
		{name: "not placeholders", in: "<node id=\"s1\">search(\"{ s1 } {} ${ $x {-s} {1 } \")</node>"},
		{name: "escaped braces", in: "<node id=\"a\">x(\"1\")</node><node id=\"b\" depends=\"a\">x(\"{{a}}\")</node>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(tt.in, Options{})
			if tt.msg == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Kind != ErrBadPlaceholder {
				t.Fatalf("got %+v, %v; want a %s error", r, err, ErrBadPlaceholder)
			}
			if !strings.HasPrefix(pe.Message, tt.msg) || pe.Node != tt.node {
				t.Errorf("error %q (node %q), want %q… (node %q)", pe.Message, pe.Node, tt.msg, tt.node)
			}
		})
	}
}

package plan

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// streamedMismatch parses every prefix of text that the planner-gateway
// would parse while text streams in (those that end in a newline, a '>'
// or a '}'), and returns the first node such a prefix releases that the
// whole output, when it is a plan, does not hold as it was released: with
// the same tool, arguments and dependencies (ok false: there is none). A
// plan that breaks later (a JSON plan that is not valid JSON after its
// first nodes) is no plan, and the nodes released from it run as the final
// output's error allows (docs/configuration.md, stream_plans); so is one
// that the whole output reads in another format: only a whole plan of the
// format released is compared. Nor is a prefix that ends inside a task
// list's tool tag: its complete queries are released as calls, and the
// whole output drops them if the tag is never closed and another tag
// follows (a known divergence, kept for the early release of every
// query). Nor is an output with a lone </think>: what comes before it was
// in a think block that the chat template opened, which no prefix without
// it can know.
func streamedMismatch(t *testing.T, text string, format Format, tools []string) (prefix string, n, whole Node, ok bool) {
	t.Helper()
	r, err := Parse(text, Options{Format: format, Tools: tools})
	if err != nil || r.Plan == nil {
		return "", Node{}, Node{}, false
	}
	lower := strings.ToLower(text)
	if c, o := strings.Index(lower, "</think>"), strings.Index(lower, "<think>"); c >= 0 && (o < 0 || c < o) {
		return "", Node{}, Node{}, false
	}
	final := map[string]Node{}
	for _, n := range r.Plan.Nodes {
		final[n.ID] = n
	}
	for end := range len(text) {
		if c := text[end]; c != '\n' && c != '>' && c != '}' {
			continue
		}
		p, err := Parse(text[:end+1], Options{Format: format, Tools: tools, DefaultTool: waiting, Partial: true})
		if err != nil || p.Plan == nil || p.Format != r.Format {
			continue
		}
		if p.Format == FormatTaskList && strings.Contains(p.Truncated, "cut off inside <") && !strings.Contains(p.Truncated, "inside <plan>") {
			continue
		}
		for _, n := range p.Plan.Nodes {
			if !slices.Contains(tools, n.Tool) {
				break // it waits, and so do the nodes after it
			}
			f, in := final[n.ID]
			if !in || n.Tool != f.Tool || !slices.Equal(n.Deps, f.Deps) || !reflect.DeepEqual(n.Args, f.Args) {
				return text[:end+1], n, f, true
			}
		}
	}
	return "", Node{}, Node{}, false
}

// TestStreamedEchoHoldsNodes: a plan the planner echoes inside an
// <observation> (or another echo block) is not the plan, so while that
// block is still open in the stream its nodes are not released: the
// output may close it later.
func TestStreamedEchoHoldsNodes(t *testing.T) {
	tools := []string{"search"}
	for _, in := range []string{
		"<observation>\n<graph>\n<node id=\"s1\">search(\"x\")</node>\n</graph>\n</observation>\n<graph>\n<node id=\"s1\">search(\"y\")</node>\n</graph>",
		"<observation>\nYour plan could not be used: {\"nodes\":[{\"id\":\"T9\",\"tool\":\"search\",\"args\":{\"query\":\"x\"}}]}\n</observation>\n{\"nodes\":[{\"id\":\"T1\",\"tool\":\"search\",\"args\":{\"query\":\"y\"}}]}",
		"<tool_response>\n1. search(\"x\")\n</tool_response>\n1. search(\"y\")\n",
		// A block closed inside another leaves the outer one open.
		"<result> <observation>\n</observation>\n<graph>\n<node id=\"s1\">search(\"x\")</node>\n</graph>\n</result>\n<graph>\n<node id=\"s1\">search(\"y\")</node>\n</graph>",
	} {
		if prefix, n, f, bad := streamedMismatch(t, in, FormatAuto, tools); bad {
			t.Errorf("after %q, %s is released as %s(%v) <- %v; the whole output has %s(%v) <- %v",
				prefix, n.ID, n.Tool, n.Args, n.Deps, f.Tool, f.Args, f.Deps)
		}
	}
	// A mention never closed only holds the nodes: the whole output has them.
	const mention = "I will read the <observation> next turn.\n<graph>\n<node id=\"s1\">search(\"x\")</node>\n</graph>"
	r, err := Parse(mention, Options{Tools: tools})
	if err != nil || len(r.Plan.Nodes) != 1 {
		t.Fatalf("Parse(%q) = %+v, %v; want the plan of s1", mention, r, err)
	}
}

// TestStreamedJSONHoldsNodes: a node list inside a JSON value that is not
// a plan (too deep, or in a list) is skipped with the value once the value
// is closed, so while the value is still open in the stream its nodes are
// not released: the plan after it is the plan.
func TestStreamedJSONHoldsNodes(t *testing.T) {
	const plan = "\n{\"nodes\":[{\"id\":\"T1\",\"tool\":\"search\",\"args\":{\"query\":\"y\"}}]}"
	const draft = `{"nodes":[{"id":"T1","tool":"search","args":{"query":"x"}}]}`
	for _, in := range []string{
		`{"a":{"b":{"c":` + draft + `}}}` + plan,
		`{"drafts": [` + draft + `]}` + plan,
		`[1, ` + draft + `]` + plan,
		"```json\n{\"drafts\": [" + draft + "]}\n```" + plan,
	} {
		r, err := Parse(in, Options{Tools: []string{"search"}})
		if err != nil || planString(r.Plan) != "T1 search(y) <- " {
			t.Fatalf("Parse(%q) = %+v, %v; want the plan after the value", in, r.Plan, err)
		}
		if prefix, n, f, bad := streamedMismatch(t, in, FormatAuto, []string{"search"}); bad {
			t.Errorf("after %q, %s is released as %s(%v) <- %v; the whole output has %s(%v) <- %v",
				prefix, n.ID, n.Tool, n.Args, n.Deps, f.Tool, f.Args, f.Deps)
		}
	}
	// A plan's own nodes are released as they close, text before it or not.
	for _, in := range []string{
		`{"nodes":[` + `{"id":"T1","tool":"search","args":{"query":"x"}},` + "\n",
		"The set {x | x > 0} is open, so {this\n```json\n{\"plan\": {\"nodes\": [{\"id\":\"T1\",\"tool\":\"search\",\"args\":{\"query\":\"x\"}}",
	} {
		r, err := Parse(in, Options{Tools: []string{"search"}, DefaultTool: waiting, Partial: true})
		if err != nil || planString(r.Plan) != "T1 search(x) <- " {
			t.Errorf("Parse(%q) = %+v, %v; want T1 released", in, r.Plan, err)
		}
	}
}

// TestStreamedGraphHoldsUnclosedNodes: without a <graph>, a node whose
// </node> is forgotten is a node, but before a <graph> it is prose; while
// no <graph> has come, a streamed plan does not release it.
func TestStreamedGraphHoldsUnclosedNodes(t *testing.T) {
	tools := []string{"search"}
	const draft = "<node id=\"s1\">search(\"x\")\n<node id=\"s2\">search(\"y\")\n"
	for _, c := range []struct{ in, want string }{
		{draft + "<graph>\n<node id=\"s1\">search(\"a\")</node>\n</graph>", "s1 search(a) <- "},
		{draft + "<node id=\"s3\">search(\"z\")</node>", "s1 search(x) <- ; s2 search(y) <- ; s3 search(z) <- "},
	} {
		r, err := Parse(c.in, Options{Tools: tools})
		if err != nil || planString(r.Plan) != c.want {
			t.Fatalf("Parse(%q) = %+v, %v; want %s", c.in, r.Plan, err, c.want)
		}
		if prefix, n, f, bad := streamedMismatch(t, c.in, FormatAuto, tools); bad {
			t.Errorf("after %q, %s is released as %s(%v) <- %v; the whole output has %s(%v) <- %v",
				prefix, n.ID, n.Tool, n.Args, n.Deps, f.Tool, f.Args, f.Deps)
		}
	}
	// Inside a <graph>, a forgotten </node> is forgiven as the plan streams.
	in := "<graph>\n<node id=\"s1\">search(\"x\")\n<node id=\"s2\">"
	r, err := Parse(in, Options{Tools: tools, DefaultTool: waiting, Partial: true})
	if err != nil || planString(r.Plan) != "s1 search(x) <- " {
		t.Errorf("Parse(%q) = %+v, %v; want s1 released", in, r.Plan, err)
	}
}

// FuzzStreamedPlan: however a plan of any format streams in, a node
// released from the plan so far is the node the whole output has, when
// that is a plan.
func FuzzStreamedPlan(f *testing.F) {
	seeds(f,
		"<observation>\n<graph>\n<node id=\"s1\">search(\"x\")</node>\n</graph>\n</observation>\n<graph>\n<node id=\"s1\">search(\"y\")</node>\n</graph>",
		"1. search(\"a\")\n2. search(\"b $1\")\n3. join()\n",
		"```json\n{\"nodes\":[{\"id\":\"T1\",\"tool\":\"search\",\"args\":{\"query\":\"a\"}},\n{\"id\":\"T2\",\"tool\":\"search\",\"args\":{\"query\":\"{T1}\"},\"depends_on\":[\"T1\"]}]}\n```")
	tools := []string{"search", "math"}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 2048 {
			return
		}
		if prefix, n, w, bad := streamedMismatch(t, text, FormatAuto, tools); bad {
			t.Fatalf("after %q, %s is released as %s(%v) <- %v; the whole output has %s(%v) <- %v",
				prefix, n.ID, n.Tool, n.Args, n.Deps, w.Tool, w.Args, w.Deps)
		}
	})
}

package plan

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// planString writes a plan's nodes as "ID tool(input) <- deps; …".
func planString(p *Plan) string {
	var out []string
	for _, n := range p.Nodes {
		out = append(out, fmt.Sprintf("%s %s(%s) <- %s", n.ID, n.Tool, n.Input(), strings.Join(n.Deps, ",")))
	}
	return strings.Join(out, "; ")
}

// TestPlanAfterEmptyMention: an empty <graph></graph> or <plan></plan>
// followed by a plan written without the wrapper is a mention; the plan is
// read as it would be without the mention, not refused as empty.
func TestPlanAfterEmptyMention(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"I'll write it in <graph></graph> tags:\n<node id=\"s1\">search(\"a\")</node>\n<node id=\"s2\" depends=\"s1\">search(\"{s1}\")</node>",
			"s1 search(a) <- ; s2 search({s1}) <- s1"},
		{"<graph></graph> and <graph>\n</graph>\n<node id=\"s1\">search(\"a\")</node>",
			"s1 search(a) <- "},
		{"<node id=\"s1\">search(\"a\")</node>\nNext time I'll wrap it in <graph></graph>.",
			"s1 search(a) <- "},
		{"I'll write it in <plan></plan> tags:\nT1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n<search>a|b</search>",
			"T1 search(a) <- ; T2 search(b) <- T1"},
		{"Format: `<plan>…</plan>`\nT1: search(\"a\") - Dependencies: none",
			"T1 search(a) <- "},
		{"T1: Find a - Dependencies: none\n<search>a</search>\nI forgot the <plan></plan> tags.",
			"T1 search(a) <- "},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if r.Plan == nil {
			t.Errorf("Parse(%q) = %+v, want a plan", c.in, r)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.in, g, c.want)
		}
	}
	// A mention and nothing else is still an empty plan.
	for _, in := range []string{"<graph></graph>", "<plan></plan>", "I'll use <plan></plan> tags."} {
		var pe *Error
		if _, err := Parse(in, Options{}); !errors.As(err, &pe) || pe.Kind != ErrEmpty {
			t.Errorf("Parse(%q): %v, want an %s error", in, err, ErrEmpty)
		}
	}
}

// TestTasksBeforePlan: task lines written before a <plan> are the plan
// written twice when they are its tasks, and a second plan when they are
// not; lines that only look like tasks are prose.
func TestTasksBeforePlan(t *testing.T) {
	const block = "<plan>\nT1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n</plan>\n<search>a|b</search>"
	for _, c := range []struct{ in, want string }{
		{"T1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n\nIn tags:\n" + block,
			"T1 search(a) <- ; T2 search(b) <- T1"},
		{"T1: Find a\n- Dependencies: none\nT2: Find b\n- Dependencies: T1\n" + block,
			"T1 search(a) <- ; T2 search(b) <- T1"},
		// Prose in the form of a task, giving neither dependencies nor a tool.
		{"T1: the capital comes first.\n" + block,
			"T1 search(a) <- ; T2 search(b) <- T1"},
		// The plan is cut off: its complete tasks begin the list before it.
		{"T1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n<plan>\nT1: Find a - Dependencies: none\nT2: Fi",
			"T1 actor(Find a) <- "},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search", "actor"}})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.in, g, c.want)
		}
	}
	for _, c := range []struct {
		in          string
		first, line int
	}{
		{"T1: Find c - Dependencies: none\n" + block, 1, 2},
		{"Draft:\nT1: Find a - Dependencies: none\nT2: Find b - Dependencies: none\n" + block, 2, 4},
		{"T1: search(\"a\")\nT2: search(\"b\")\n" + block, 1, 3},
		{"T1: Find a - Dependencies: none\n" + block, 1, 2},
		{"T1: Find c - Dependencies: none\nT2: Find b - Dependencies: T1\n<plan>\nT1: Find a - Dependencies: none\nT2: Fi", 1, 3},
		{"T1: Find a - Dependencies: the above\n" + block, 1, 2},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search", "actor"}})
		want := fmt.Sprintf("the output holds two different plans, the task list at line %d and the <plan> at line %d; write one <plan> with the whole plan", c.first, c.line)
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Message != want || pe.Line != c.line {
			t.Errorf("Parse(%q): %v, want a syntax error at line %d: %s", c.in, err, c.line, want)
		}
	}
}

// TestTaskDependencyProse: a dependency list that names no task and is not
// "none" is a syntax error naming the task and the list, never a task
// without dependencies.
func TestTaskDependencyProse(t *testing.T) {
	const before = "T1: Find a - Dependencies: none\n"
	for _, deps := range []string{"the previous task", "all of the above", "previous", "s1", "the first search", "1st task"} {
		for _, c := range []struct {
			in   string
			line int
		}{
			{before + "T2: Find b - Dependencies: " + deps, 2},
			{before + "T2: Find b\n- **Dependencies:** " + deps + "\n", 3},
			{"<plan>\n" + before + "T2: Find b - Dependencies: " + deps + "\n</plan>", 3},
		} {
			in := c.in
			_, err := Parse(in, Options{})
			var pe *Error
			if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Node != "T2" || pe.Line != c.line ||
				!strings.Contains(pe.Message, fmt.Sprintf("task T2: the dependencies %q name no task", deps)) ||
				!strings.Contains(pe.Message, `"Dependencies: T1, T2", or "Dependencies: none"`) {
				t.Errorf("Parse(%q): %v, want a syntax error naming T2 and %q", in, err, deps)
			}
		}
	}
	// A key that starts a field after a bracket or a stop is one too.
	for _, line := range []string{"T2: Find b (deps: the previous task)", "T2: Find b. Requires: the previous task"} {
		_, err := Parse(before+line+"\n", Options{})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Node != "T2" || !strings.Contains(pe.Message, `"the previous task" name no task`) {
			t.Errorf("%s: %v, want a syntax error naming T2 and the list", line, err)
		}
	}
	// A key inside a task's text is text, not a list of no tasks.
	for _, c := range []struct{ task, want string }{
		{"T2: Find what the law requires: a visa or not\n- Dependencies: T1", "T2 actor(Find what the law requires: a visa or not) <- T1"},
		{"T2: search(\"python deps: numpy\")\n- Dependencies: T1", "T2 search(python deps: numpy) <- T1"},
		{"T2: search(\"deps: numpy\") - Dependencies: T1", "T2 search(deps: numpy) <- T1"},
		{"T2: Find what the law requires: 2 visas - Dependencies: none", "T2 actor(Find what the law requires: 2 visas) <- "},
	} {
		r, err := Parse(before+c.task+"\n", Options{})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.task, err)
			continue
		}
		if g := planString(&Plan{Nodes: r.Plan.Nodes[1:]}); g != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.task, g, c.want)
		}
	}
	// None, its synonyms, nothing at all, and lists of tasks.
	for _, c := range []struct{ deps, want string }{
		{"none", ""}, {"None.", ""}, {"`none`", ""}, {"\"none\"", ""}, {"(none)", ""}, {"N/A", ""}, {"nothing", ""},
		{"no dependencies", ""}, {"null", ""}, {"empty", ""}, {"-", ""}, {"", ""}, {"—", ""},
		{"T1's result", "T1"}, {"Step 1", "T1"}, {"task #1", "T1"}, {"T1 (the capital)", "T1"},
	} {
		in := before + "T2: Find b - Dependencies: " + c.deps + "\n"
		r, err := Parse(in, Options{})
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if g := strings.Join(r.Plan.Nodes[1].Deps, ","); g != c.want {
			t.Errorf("Dependencies: %s: %q, want %q", c.deps, g, c.want)
		}
	}
}

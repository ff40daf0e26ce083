package plan

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// waiting is the default tool of a streamed parse, as the plan-parser
// gives it: no tool of the rollout, so a task that waits is never released.
const waiting = "(waiting)"

// released returns the nodes of a plan so far that a streamed turn would
// release: those before the first that still waits (as
// schema.Config.PartialNodes keeps them).
func released(t *testing.T, text string, tools []string) []Node {
	t.Helper()
	r, err := Parse(text, Options{Tools: tools, DefaultTool: waiting, Partial: true})
	if err != nil || r.Plan == nil {
		return nil
	}
	for i, n := range r.Plan.Nodes {
		if !slices.Contains(tools, n.Tool) {
			return r.Plan.Nodes[:i]
		}
	}
	return r.Plan.Nodes
}

// TestStreamedTaskListHoldsTasks: while a task list streams in, a task is
// released only once no later part of the output can add a dependency to
// it: a dependency section below it (in the <plan>, or right after
// </plan>) or "T2 depends on T1" under a later task. Every way of cutting
// the output into chunks releases each task as the final plan has it.
func TestStreamedTaskListHoldsTasks(t *testing.T) {
	tools := []string{"search"}
	for _, c := range []struct {
		name, in string
		want     string // the final plan
	}{
		{"a section in the plan",
			"<plan>\nT1: search(\"a\")\nT2: search(\"b\")\nT3: Compare them\nDependencies:\n- T2 depends on T1\n- T3 depends on T1, T2\n</plan>\n<search>compare {T1} and {T2}</search>\n",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(compare {T1} and {T2}) <- T1,T2"},
		{"a statement under a later task",
			"<plan>\nT1: search(\"a\") - Dependencies: none\nT2: search(\"b\") - Dependencies: none\nT3: search(\"c\")\n- T2 depends on T1\n- Dependencies: T1\n</plan>\n",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- T1"},
		{"a section after </plan>",
			"<plan>\nT1: search(\"a\")\nT2: search(\"b\")\nT3: Compare them\n</plan>\nDependencies:\n- T2 depends on T1\n- T3 after T1, T2\n<search>compare {T1} and {T2}</search>\n",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(compare {T1} and {T2}) <- T1,T2"},
		{"a list without a <plan>",
			"T1: search(\"a\")\nT2: search(\"b\")\nT3: search(\"c\") - Dependencies: T1\nT2 depends on T1\n",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- T1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Parse(c.in, Options{Tools: tools})
			if err != nil {
				t.Fatalf("final: %v", err)
			}
			if g := planString(r.Plan); g != c.want {
				t.Fatalf("final = %s, want %s", g, c.want)
			}
			final := map[string]Node{}
			for _, n := range r.Plan.Nodes {
				final[n.ID] = n
			}
			// Every prefix is where some chunking of the stream stops.
			for end := range len(c.in) + 1 {
				for _, n := range released(t, c.in[:end], tools) {
					if f := final[n.ID]; !slices.Equal(n.Deps, f.Deps) || n.Tool != f.Tool {
						t.Fatalf("after %q, %s is released as %s <- %v; the final plan has %s <- %v",
							c.in[:end], n.ID, n.Tool, n.Deps, f.Tool, f.Deps)
					}
				}
			}
		})
	}
}

// TestStreamedTaskListReleases: a <plan>'s tasks are released once its
// calls begin after </plan>, each as its call comes (those with their own
// tool at once): holding them does not hold the turn to its end.
func TestStreamedTaskListReleases(t *testing.T) {
	tools := []string{"search"}
	const tasks = "<plan>\nT1: search(\"a\")\nT2: Find b\n- Dependencies: T1\nT3: search(\"c\") - Dependencies: T1\n</plan>\n"
	for _, c := range []struct {
		in   string
		want string
	}{
		{tasks, ""},
		{tasks + "Dependencies:\n- T3 depends on T1\n", ""},
		{tasks + "<search>b</search>", "T1,T2,T3"},
		// T2's call is cut off: it is dropped, and T3 does not need it.
		{tasks + "<search>", "T1,T3"},
		{"<plan>\nT1: search(\"a\")\nT2: search(\"b\") - Dependencies: T1\n", ""},
	} {
		var ids []string
		for _, n := range released(t, c.in, tools) {
			ids = append(ids, n.ID)
		}
		if g := strings.Join(ids, ","); g != c.want {
			t.Errorf("%q releases %q, want %q", c.in, g, c.want)
		}
	}
}

// TestDependenciesAfterPlan: a dependency section right after </plan>
// (before the calls) is the plan's; one after the calls that would add a
// dependency is an error naming it, and one that says what the plan says
// is read as the same.
func TestDependenciesAfterPlan(t *testing.T) {
	const tasks = "<plan>\nT1: Find a\nT2: Find b\nT3: Compare them\n</plan>\n"
	for _, c := range []struct{ in, want string }{
		{tasks + "Dependencies:\n- T2 depends on T1\n- T3 after T1, T2\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- T1,T2"},
		{tasks + "\n## Dependencies\nT1 -> T2 -> T3\n\nNow the calls:\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- T2"},
		{tasks + "Dependencies: T2 depends on T1\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- "},
		{tasks + "T3 depends on T2.\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- ; T3 search(c) <- T2"},
		// Prose that mentions dependencies is prose.
		{tasks + "The dependencies are simple.\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- ; T3 search(c) <- "},
		// After the calls, what the plan already says is fine.
		{"<plan>\nT1: Find a\nT2: Find b - Dependencies: T1\n</plan>\n<search>a|b</search>\nDependencies:\n- T2 depends on T1\n",
			"T1 search(a) <- ; T2 search(b) <- T1"},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("Parse(%q) = %s, want %s", c.in, g, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		line int
		want string
	}{
		{tasks + "<search>a|b|c</search>\nDependencies:\n- T2 depends on T1\n", 8,
			`the dependency line "T2 depends on T1" (line 8) comes after the plan's tool calls, and the plan does not say it; write the dependencies in the <plan>`},
		{tasks + "Dependencies:\n- T4 depends on T1\n<search>a|b|c</search>", 7,
			`the dependency line "T4 depends on T1" (line 7) is about T4, which is not a task of the plan`},
		{tasks + "Dependencies:\n- T2 is needed by T3\n<search>a|b|c</search>", 7,
			`the line "T2 is needed by T3" (line 7) under the dependencies does not say which task depends on which`},
		{tasks + "Dependencies: the previous ones\n<search>a|b|c</search>", 6,
			`the dependency line "Dependencies: the previous ones" (line 6) after the </plan> does not say which task depends on which`},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search"}})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.line || !strings.Contains(pe.Message, c.want) {
			t.Errorf("Parse(%q): %v, want a syntax error at line %d: %s", c.in, err, c.line, c.want)
		}
	}
}

// TestCallsBeforeProsePlan: calls written before a <plan>, after task lines
// that are prose, are the plan's calls (or an error when the calls after
// it differ), never dropped; an extra call says where it was.
func TestCallsBeforeProsePlan(t *testing.T) {
	const block = "<plan>\nT1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n</plan>\n"
	for _, c := range []struct{ in, want string }{
		{"T1: the capital\nT2: its population\n<search>a|b</search>\n" + block,
			"T1 search(a) <- ; T2 search(b) <- T1"},
		{"T1: the capital\n<search>a|b</search>\n" + block + "<search>a|b</search>",
			"T1 search(a) <- ; T2 search(b) <- T1"},
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
		in   string
		line int
		want string
	}{
		{"T1: the capital\n<search>a|c</search>\n" + block + "<search>a|b</search>", 3,
			"the tool calls before the <plan> at line 3 (from line 2) differ from those after it; write the calls once, after the plan"},
		{"T1: the capital\n<search>a|b|c</search>\n" + block, 2,
			"there are 3 tool calls before the plan but only 2 tasks without their own tool; the extra call is <search>c</search>"},
		{"T1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n<search>a|b|c</search>\n" + block, 3,
			"there are 3 tool calls before the plan but only 2 tasks without their own tool; the extra call is <search>c</search>"},
		{block + "<search>a|b|c</search>", 5,
			"there are 3 tool calls after the plan but only 2 tasks without their own tool; the extra call is <search>c</search>"},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search", "actor"}})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.line || pe.Message != c.want {
			t.Errorf("Parse(%q): %v, want a syntax error at line %d: %s", c.in, err, c.line, c.want)
		}
	}
}

// FuzzStreamedTaskList: however a task list streams in, a task released
// from the plan so far (cut where the planner-gateway parses it, after a
// newline or a '>') is the task the whole output has, when that is a plan.
func FuzzStreamedTaskList(f *testing.F) {
	seeds(f,
		"<plan>\nT1: search(\"a\")\nT2: search(\"b\")\nDependencies:\n- T2 depends on T1\n</plan>\n<search>x</search>",
		"<plan>\nT1: search(\"a\")\nT2: Find b\n</plan>\nT2 depends on T1\n<search>b</search>\nDependencies:\n- T2 after T1\n",
		"T1: search(\"a\") - Dependencies: none\nT2: search(\"b\")\nT3: search(\"c\")\n- T2 depends on T1\n- Dependencies: T2")
	tools := []string{"search"}
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 2048 {
			return
		}
		r, err := Parse(text, Options{Format: FormatTaskList, Tools: tools})
		if err != nil || r.Plan == nil {
			return
		}
		final := map[string]Node{}
		for _, n := range r.Plan.Nodes {
			final[n.ID] = n
		}
		for end := range len(text) {
			if text[end] != '\n' && text[end] != '>' {
				continue
			}
			p, err := Parse(text[:end+1], Options{Format: FormatTaskList, Tools: tools, DefaultTool: waiting, Partial: true})
			if err != nil || p.Plan == nil {
				continue
			}
			for _, n := range p.Plan.Nodes {
				if !slices.Contains(tools, n.Tool) {
					break
				}
				if f, ok := final[n.ID]; ok && (!slices.Equal(n.Deps, f.Deps) || n.Tool != f.Tool || n.Input() != f.Input()) {
					t.Fatalf("after %q, %s is released as %s(%s) <- %v; the whole output has %s(%s) <- %v",
						text[:end+1], n.ID, n.Tool, n.Input(), n.Deps, f.Tool, f.Input(), f.Deps)
				}
			}
		}
	})
}

// TestTasksAfterPlanBeforeDependencies: task lines between a </plan> and
// dependency lines are the plan written again, with those lines: held to
// the rule for tasks after a <plan>, not skipped as the plan's tail.
func TestTasksAfterPlanBeforeDependencies(t *testing.T) {
	const in = "<plan>\nT1: Find a\nT2: Find b\n</plan>\nT1: Find a\nT2: Find b\nT3: Find c\nDependencies:\n- T2 depends on T1\n<search>a|b</search>"
	_, err := Parse(in, Options{Tools: []string{"search"}})
	const want = "the output holds two different plans, the <plan> at line 1 and the task list at line 5; write one <plan> with the whole plan"
	var pe *Error
	if !errors.As(err, &pe) || pe.Message != want {
		t.Errorf("Parse(%q): %v, want %s", in, err, want)
	}
}

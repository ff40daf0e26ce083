package plan

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestDependencySection: dependencies given apart from the tasks, one a
// line under an empty "Dependencies:" heading, are each task's
// dependencies; a line there that cannot be read is an error naming it,
// never a dependency dropped or given to the task above the heading.
func TestDependencySection(t *testing.T) {
	const tasks = "T1: Find a\nT2: Find b\nT3: Find c\n"
	for _, c := range []struct{ name, in, want string }{
		{"statements", tasks + "Dependencies:\n- T2 depends on T1\n- T3 after T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T2"},
		{"in a plan with calls", "<plan>\n" + tasks + "Dependencies:\n- T2 depends on T1\n- T3 after T2\n</plan>\n<search>a|b|c</search>",
			"T1 search(a) <- ; T2 search(b) <- T1; T3 search(c) <- T2"},
		{"bold heading, numbered lines", tasks + "**Dependencies:**\n1. T2 requires T1\n2. T3 needs T1 and T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T1,T2"},
		{"markdown heading", tasks + "## Dependencies\n- T2 uses T1\n- T3 uses T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T2"},
		{"colons", tasks + "Dependencies:\n- T1: none\n- T2: T1\n- T3: T1, T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T1,T2"},
		{"arrows", tasks + "Dependencies:\nT1 -> T2 -> T3\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T2"},
		{"before", tasks + "Dependencies:\n- T1 before T2, T3\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T1"},
		{"by number", tasks + "Dependencies:\n- Task 2 and 3 depend on 1\n- T1 has no dependencies\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T1"},
		{"the last task's own list", "T1: Find a - Dependencies: none\nT2: Find b - Dependencies: none\nT3: Combine\n  Dependencies:\n  - T1\n  - T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- ; T3 actor(Combine) <- T1,T2"},
		{"a task's own list in a plan", "<plan>\nT1: Find a - Dependencies: none\nT2: Find b\nDependencies:\n- T1\n</plan>\n<search>a|b</search>",
			"T1 search(a) <- ; T2 search(b) <- T1"},
		{"prose and calls after", "T1: Find a\nT2: Find b\nDependencies:\n- T2 depends on T1\n\nNow the calls:\n<search>a|b</search>",
			"T1 search(a) <- ; T2 search(b) <- T1"},
		{"a task after", "T1: Find a\nT2: Find b\nDependencies:\n- T2: T1\nT3: Find c - Dependencies: T2\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- T2"},
		// Without a heading, a line about another task is about that task.
		{"another task's line", "T1: Find a - Dependencies: none\nT2: Find b\nT3: Find c - Dependencies: none\n- T2 depends on T1\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1; T3 actor(Find c) <- "},
		// An empty list followed by the next task still says none.
		{"empty list", "T1: Find a - Dependencies:\nT2: Find b - Dependencies: T1\n",
			"T1 actor(Find a) <- ; T2 actor(Find b) <- T1"},
	} {
		r, err := Parse(c.in, Options{})
		if err != nil {
			t.Errorf("%s: Parse(%q): %v", c.name, c.in, err)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("%s: Parse(%q) = %s, want %s", c.name, c.in, g, c.want)
		}
	}
	for _, c := range []struct {
		name, in string
		line     int
		has      string
	}{
		{"unreadable line", tasks + "Dependencies:\n- T2 depends on T1\n- T2 is needed by T3\n", 6,
			`the line "T2 is needed by T3" (line 6) under the dependencies does not say which task depends on which`},
		{"unknown task", tasks + "Dependencies:\n- T5 depends on T1\n", 5,
			`the dependency line "T5 depends on T1" (line 5) is about T5, which is not a task of the plan`},
		{"two on a line", tasks + "Dependencies:\n- T2 depends on T1 and T3 depends on T2\n", 5,
			`the dependency line "T2 depends on T1 and T3 depends on T2" (line 5): it says more than one thing`},
		{"no task named", tasks + "Dependencies:\n- T2 depends on the first one\n", 5,
			`(line 5): it names no task after "depends on"`},
		{"two on a line, no heading", tasks + "- T2 depends on T1 and T3 depends on T2\n", 4,
			`(line 4): it says more than one thing`},
	} {
		_, err := Parse(c.in, Options{})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Line != c.line || !strings.Contains(pe.Message, c.has) {
			t.Errorf("%s: Parse(%q): %v, want a syntax error at line %d containing %q", c.name, c.in, err, c.line, c.has)
		}
	}
}

// TestTasksAfterPlan: task lines after the last <plan> follow the rule for
// those before it: the same tasks are the plan written again and read
// once, others are a second plan and an error naming both, and lines that
// give neither dependencies nor a tool are prose.
func TestTasksAfterPlan(t *testing.T) {
	const block = "<plan>\nT1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n</plan>\n"
	const again = "T1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n"
	for _, c := range []struct{ name, in, want string }{
		{"same, then calls", block + again + "<search>a|b</search>", "T1 search(a) <- ; T2 search(b) <- T1"},
		{"calls, then same", block + "<search>a|b</search>\n" + again, "T1 search(a) <- ; T2 search(b) <- T1"},
		{"same calls around the same", block + "<search>a|b</search>\n" + again + "<search>a|b</search>", "T1 search(a) <- ; T2 search(b) <- T1"},
		{"after a repeated plan", block + block + "<search>a|b</search>\n" + again, "T1 search(a) <- ; T2 search(b) <- T1"},
		{"prose", block + "<search>a|b</search>\nSo:\nT1: finds a\nT2: finds b\n", "T1 search(a) <- ; T2 search(b) <- T1"},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("%s: Parse(%q): %v", c.name, c.in, err)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("%s: Parse(%q) = %s, want %s", c.name, c.in, g, c.want)
		}
	}
	for _, c := range []struct {
		name, in    string
		first, line int
	}{
		{"a task more", block + "<search>a|b</search>\nT3: Find c - Dependencies: T2\n", 1, 6},
		{"a revision", block + "<search>a|b</search>\nT1: Find c - Dependencies: none\n", 1, 6},
		{"after a repeated plan", block + block + "<search>a</search>\nT2: Find c - Dependencies: T1\n", 1, 10},
		{"a tool named", block + "T1: search(\"c\")\n", 1, 5},
		{"other calls around the same", block + "<search>a|b</search>\n" + again + "<search>x|y</search>", 1, 6},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search"}})
		want := fmt.Sprintf("the output holds two different plans, the <plan> at line %d and the task list at line %d; write one <plan> with the whole plan", c.first, c.line)
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Message != want || pe.Line != c.line {
			t.Errorf("%s: Parse(%q): %v, want a syntax error at line %d: %s", c.name, c.in, err, c.line, want)
		}
	}
}

// TestCallsBeforePlan: tool calls written between a task list and the same
// tasks in a <plan> are the plan's calls, held to the rule for calls
// around a repeated plan: the same calls are read once, and different
// ones are an error naming both lists.
func TestCallsBeforePlan(t *testing.T) {
	const bare = "T1: Find a - Dependencies: none\nT2: Find b - Dependencies: T1\n"
	const block = "<plan>\n" + bare + "</plan>"
	for _, c := range []struct{ name, in, want string }{
		{"calls before", bare + "<search>a|b</search>\n" + block, "T1 search(a) <- ; T2 search(b) <- T1"},
		{"the same before and after", bare + "<search>a|b</search>\n" + block + "\n<search>a|b</search>", "T1 search(a) <- ; T2 search(b) <- T1"},
		{"calls after", bare + block + "\n<search>a|b</search>", "T1 search(a) <- ; T2 search(b) <- T1"},
		// The <plan> is cut off: the calls before it are its calls.
		{"cut off", bare + "<search>a|b</search>\n<plan>\nT1: Find a - Dependencies: none\nT2: Fi", "T1 search(a) <- "},
	} {
		r, err := Parse(c.in, Options{Tools: []string{"search"}})
		if err != nil {
			t.Errorf("%s: Parse(%q): %v", c.name, c.in, err)
			continue
		}
		if g := planString(r.Plan); g != c.want {
			t.Errorf("%s: Parse(%q) = %s, want %s", c.name, c.in, g, c.want)
		}
	}
	for _, c := range []struct{ name, in string }{
		{"other calls after", bare + "<search>x|y</search>\n" + block + "\n<search>a|b</search>"},
		{"split around the plan", bare + "<search>a</search>\n" + block + "\n<search>b</search>"},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search", "actor"}})
		const want = "the output holds two different plans, the task list at line 1 and the <plan> at line 4; write one <plan> with the whole plan"
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Message != want || pe.Line != 4 {
			t.Errorf("%s: Parse(%q): %v, want a syntax error at line 4: %s", c.name, c.in, err, want)
		}
	}
}

package plannergateway

import (
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// formatInstructions tell the planner how to write a plan in each format.
var formatInstructions = map[string]string{
	string(plan.FormatGraph): `Write the plan as a graph. Each node is one tool call; "depends" lists the nodes it needs, and {id} stands for that node's result:
<graph>
<node id="s1">search("capital of France")</node>
<node id="s2" depends="s1">search("population of {s1}")</node>
</graph>`,
	string(plan.FormatTaskList): `Write the plan as a task list, then one tag per tool with the calls in task order; "|" separates calls that run in parallel and {T1} stands for task T1's result:
<plan>
T1: Find the capital of France
- Dependencies: none
T2: Find the population of that capital
- Dependencies: T1
</plan>
<search>capital of France|population of {T1}</search>`,
	string(plan.FormatJSON): `Write the plan as JSON; {T1} stands for node T1's result:
{"nodes":[{"id":"T1","tool":"search","args":{"query":"capital of France"},"depends_on":[]},{"id":"T2","tool":"search","args":{"query":"population of {T1}"},"depends_on":["T1"]}]}`,
	string(plan.FormatNumbered): `Write the plan as numbered calls; $1 stands for the result of call 1; end with join():
1. search("capital of France")
2. search("population of $1")
3. join()`,
	string(plan.FormatSteps): `Write the plan as a JSON list of steps; {step_1} stands for step_1's result:
[{"id":"step_1","action":"search","params":{"query":"capital of France"},"dependencies":[]},{"id":"step_2","action":"search","params":{"query":"population of {step_1}"},"dependencies":["step_1"]}]`,
}

// RenderPrompt is the planner's first-turn prompt: the task, the tools, the
// plan format and how to answer. Later turns append observations to the
// token trajectory instead of re-rendering.
func RenderPrompt(task schema.Task, cfg schema.Config) string {
	var b strings.Builder
	b.WriteString("You are the planner. Break the question into sub-tasks that tools can solve, and say which sub-tasks depend on which: independent sub-tasks run in parallel. ")
	b.WriteString("After each plan you will see an <observation> with every result. When you know the answer, reply with <answer>your answer</answer> and nothing else.\n")
	b.WriteString("Tools:\n")
	for _, t := range cfg.Tools {
		desc := t.Description
		if desc == "" {
			desc = "a tool"
		}
		fmt.Fprintf(&b, "- %s: %s\n", t.Name, desc)
	}
	format := cfg.PlanFormat
	instr, ok := formatInstructions[format]
	if !ok {
		format, instr = string(plan.FormatGraph), formatInstructions[string(plan.FormatGraph)]
	}
	fmt.Fprintf(&b, "Plan format: %s\n%s\n", format, instr)
	fmt.Fprintf(&b, "Question: %s\n", task.Prompt)
	return b.String()
}

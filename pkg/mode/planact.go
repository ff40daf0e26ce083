package mode

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// PlanAct is the plan_act mode (DESIGN.md): each turn the planner reads the
// task and everything observed so far and writes a plan (a DAG of tool
// calls) or a final <answer>; the plan's acts run (the actor model or HTTP
// tools), and what they return is the planner's next observation, up to
// max_turns. Every sample is rewarded with the final answer's score (the
// acts' split among them with split_act_reward).
type PlanAct struct{}

// Name is plan_act.
func (PlanAct) Name() string { return schema.ModePlanAct }

// Open asks the planner for turn 1.
func (PlanAct) Open(n int64, e int, _ schema.Task, _ schema.Config, plannerVersion string) schema.Message {
	return &schema.PlanRequest{Rollout: n, Episode: e, Turn: 1, WeightVersion: plannerVersion}
}

// FirstPlannerTurn is 1: the planner goes first.
func (PlanAct) FirstPlannerTurn() int { return 1 }

// ParseNeedsObservation is false: a plan is parsed from its text alone.
func (PlanAct) ParseNeedsObservation(schema.Config) bool { return false }

// Parse parses the output's plan in any format (pkg/plan) into a validated
// DAG, a final answer, or a precise error.
func (PlanAct) Parse(ctx context.Context, out *schema.PlanOutput, _ string, cfg schema.Config) (schema.Message, error) {
	opts := cfg.ParseOptions()
	if out.FinishReason == engine.FinishStop {
		// The engine may have stopped on a stop string and stripped it
		// (an answer's "</answer>"): the parser must know which it may be.
		opts.Stop = cfg.PlannerSampling.Stop
	}
	res, err := plan.ParseContext(ctx, out.Text, opts)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, err
	}
	if err != nil {
		pe := &schema.PlanError{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, ErrorKind: "syntax", Message: err.Error(), FinishReason: out.FinishReason}
		if e, ok := err.(*plan.Error); ok {
			pe.ErrorKind = string(e.Kind)
		}
		if out.FinishReason == "length" && out.Text == "" {
			pe.ErrorKind, pe.Message = schema.PlanErrContextFull, "the episode ran out of context before the planner could answer"
			if out.Truncated != "" {
				pe.Message += ": " + out.Truncated
			}
		}
		return pe, nil
	}
	if len(res.Answers) > 0 {
		return &schema.PlanAnswer{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, Answers: res.Answers, FinishReason: out.FinishReason}, nil
	}
	return &schema.PlanDAG{Rollout: out.Rollout, Episode: out.Episode, Turn: out.Turn, Plan: *res.Plan, FinishReason: out.FinishReason}, nil
}

// Tool is one of the rollout's tools.
func (PlanAct) Tool(cfg schema.Config, name string) (schema.Tool, bool) { return cfg.Tool(name) }

// ActorPrompt asks the actor to carry out one step of the plan.
func (PlanAct) ActorPrompt(_ schema.Task, tool schema.Tool, _ Node, input string) string {
	return StepPrompt(tool, input)
}

// RunLocal: plan_act adds no local tool.
func (m PlanAct) RunLocal(tool schema.Tool, _ Node) (string, error) {
	return "", errNoLocal(m, tool.Name)
}

// StepPrompt is what the actor model is asked for one step of a plan.
func StepPrompt(tool schema.Tool, input string) string {
	var b strings.Builder
	b.WriteString("You are the actor. Carry out one step of a larger plan and reply with the result only, as short as possible.\n")
	fmt.Fprintf(&b, "Tool: %s\n", tool.Name)
	if tool.Description != "" {
		fmt.Fprintf(&b, "Tool description: %s\n", tool.Description)
	}
	fmt.Fprintf(&b, "Input: %s\nResult:", input)
	return b.String()
}

// Observation renders what a turn's acts observed, for the planner's next
// turn: one line per node, `<id> <tool>("<input>") -> <output>`.
func (PlanAct) Observation(r *schema.Run, _ schema.Config) string {
	var b strings.Builder
	b.WriteString("\n<observation>\n")
	for _, n := range r.Nodes {
		input := n.Input
		if input == "" {
			input = n.Node.Input()
		}
		fmt.Fprintf(&b, "%s %s(%q) -> ", n.Node.ID, n.Node.Tool, input)
		switch n.Status {
		case schema.NodeDone, schema.NodeCached:
			b.WriteString(oneLine(n.Output))
		case schema.NodeFailed:
			b.WriteString("ERROR: " + oneLine(n.Error))
		default:
			b.WriteString("SKIPPED: " + oneLine(n.Error))
		}
		b.WriteByte('\n')
	}
	b.WriteString("</observation>\n")
	return b.String()
}

// ErrorObservation tells the planner why its output could not be used
// (every mode: the parse-error policy is below the seam).
func ErrorObservation(msg string) string {
	return "\n<observation>\nYour plan could not be used: " + oneLine(msg) + "\n</observation>\n"
}

// Rewards gives every sample the final answer's score; with
// split_act_reward the acts share it.
func (PlanAct) Rewards(ep *Episode) {
	if ep.Config.SplitActReward && len(ep.Actor) > 0 {
		for i := range ep.Actor {
			ep.Actor[i].Reward = ep.Score / float64(len(ep.Actor))
		}
	}
}

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

// PlannerPrompt is the planner's first-turn prompt: the task, the tools, the
// plan format and how to answer. Later turns append observations to the
// token trajectory instead of re-rendering.
func (PlanAct) PlannerPrompt(task schema.Task, cfg schema.Config) string {
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
	if cf, custom := plan.Custom(plan.Format(format)); !ok && custom {
		instr, ok = cf.Instructions, true // a format of the program's own
	}
	if !ok {
		format, instr = string(plan.FormatGraph), formatInstructions[string(plan.FormatGraph)]
	}
	fmt.Fprintf(&b, "Plan format: %s\n%s\n", format, instr)
	fmt.Fprintf(&b, "Question: %s\n", task.Prompt)
	return b.String()
}

// Package plan turns what a planner model writes into one validated IR: a
// list of nodes (sub-tasks) with their tool, arguments and dependencies, or
// a final answer, or a precise error that can be fed back to the planner.
//
// # Answers
//
// A final answer is a closed <answer>…</answer> element that the planner
// wrote as its answer. These hold the tag but are not answers:
//
//   - mentions: an <answer> never closed ("I will give the result in
//     <answer> tags"), an element between quotes, one whose text only
//     repeats the prompt's template ("your answer") or has no letter or
//     digit ("…");
//   - code: anything in a `code span` or a ``` fenced block;
//   - plan text: anything inside a closed <graph>, <plan> or <node>
//     element, or inside the text the plan was read from (a JSON plan's
//     strings, a numbered call's arguments, a tool tag after a task list);
//     an <answer> opened before a plan block is not closed after it;
//   - echoes: anything in <think> or in an echo block (below).
//
// Of the answers left the last one wins (a planner that corrects itself
// ends with the answer it means), and it wins over any plan. Engines strip
// the stop string they stop on: when Options.Stop holds "</answer>", an
// <answer> left open at the very end of the output, holding no other tag,
// counts as closed.
//
// # Echo blocks
//
// Planners imitate what they are shown, and write <observation> blocks of
// their own like the ones planact appends after each turn (also
// <observations>, <tool_response>, <tool_result>, <result>). Everything in
// a closed echo block is ignored by every format, as is everything in
// <think>. An echo tag that is never closed is a mention and hides nothing;
// but one in a streamed plan (Options.Partial) may be closed yet, so what
// follows it is held until it is.
//
// # Placeholders
//
// A placeholder ({s1}, {T1}, {step_1}, ${name}, and $1, ${1}, {1}) must
// name a node of the plan that is one of its node's dependencies, or the
// plan is rejected with ErrBadPlaceholder. Numbers are node names only in
// plans that name nodes by number (numbered plans, or a node id that is a
// number); elsewhere "$100" or "x^{2}" is text.
//
// # Cost
//
// Parse takes time linear in the length of the output, whatever the
// output: every scan resumes where the last one stopped, and the JSON
// candidates share a budget of a few passes over the text. ParseContext
// also stops when its context ends.
package plan

// Format names a plan syntax.
type Format string

// The plan formats planact understands (DESIGN §4).
const (
	FormatAuto     Format = "auto"     // detect from the text
	FormatGraph    Format = "graph"    // GAP <graph><node id depends>…</node></graph>
	FormatTaskList Format = "tasklist" // <plan>T1: … - Dependencies: …</plan> + tool tags
	FormatJSON     Format = "json"     // {"nodes":[{"id","tool","args","depends_on"}]}
	FormatNumbered Format = "numbered" // 1. search("…") / 2. math("…", ["$1"]) / 3. join()
	FormatSteps    Format = "steps"    // [{"id","action","params","dependencies"}]
	FormatAnswer   Format = "answer"   // <answer>…</answer>
)

// Node is one sub-task of a plan.
type Node struct {
	ID          string         `msgpack:"id" json:"id"`
	Tool        string         `msgpack:"tool" json:"tool"`
	Args        map[string]any `msgpack:"args" json:"args"`
	Deps        []string       `msgpack:"deps" json:"deps"`
	Description string         `msgpack:"description,omitempty" json:"description,omitempty"`
}

// Plan is a parsed, validated graph of nodes, in the order the planner wrote them.
type Plan struct {
	Format Format `msgpack:"format" json:"format"`
	Nodes  []Node `msgpack:"nodes" json:"nodes"`
}

// Result is what Parse found: a plan, or final answers (Answers non-empty).
type Result struct {
	Format  Format   `json:"format"`
	Plan    *Plan    `json:"plan,omitempty"`
	Answers []string `json:"answers,omitempty"`
	// Truncated is set when the output was cut off (by the length limit)
	// but the complete nodes before the cut form a valid plan: it says
	// what was lost.
	Truncated string `json:"truncated,omitempty"`
}

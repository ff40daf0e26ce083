// Package plan turns what a planner model writes into one validated IR: a
// list of nodes (sub-tasks) with their tool, arguments and dependencies, or
// a final answer, or a precise error that can be fed back to the planner.
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

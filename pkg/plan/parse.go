package plan

import (
	"fmt"
	"strings"
)

// Options configure Parse. The zero value detects the format, accepts any
// tool and applies the default limits.
type Options struct {
	Format      Format   // "" or FormatAuto: detect
	Tools       []string // known tool names; empty: accept any tool
	DefaultTool string   // tool of tasks that name none (task lists); "": "actor"
	MaxNodes    int      // 0: 64
	MaxDepth    int      // 0: 16 (longest dependency chain, in nodes)
	MaxArgBytes int      // 0: 4096 (any single argument value)
}

// Defaults of Options.
const (
	DefaultTool        = "actor"
	DefaultMaxNodes    = 64
	DefaultMaxDepth    = 16
	DefaultMaxArgBytes = 4096
)

func (o Options) withDefaults() Options {
	if o.Format == "" {
		o.Format = FormatAuto
	}
	if o.DefaultTool == "" {
		o.DefaultTool = DefaultTool
	}
	if o.MaxNodes <= 0 {
		o.MaxNodes = DefaultMaxNodes
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	if o.MaxArgBytes <= 0 {
		o.MaxArgBytes = DefaultMaxArgBytes
	}
	return o
}

// Formats lists the formats Parse accepts in Options.Format.
func Formats() []Format {
	return []Format{FormatAuto, FormatGraph, FormatTaskList, FormatJSON, FormatNumbered, FormatSteps, FormatAnswer}
}

// rawNode is a node as a format parser found it, with the line it starts on.
type rawNode struct {
	Node
	line int
}

// parsed is what a format parser returns.
type parsed struct {
	format Format
	nodes  []rawNode
	// cut is non-empty when the output ends in the middle of the plan; it
	// says where, e.g. `inside <node id="s4">`. nodes holds the complete
	// nodes before the cut.
	cut string
}

type formatParser func(d *doc, o *Options) (parsed, *Error)

var parsers = map[Format]formatParser{
	FormatGraph:    parseGraph,
	FormatTaskList: parseTaskList,
	FormatJSON:     parseJSON,
	FormatSteps:    parseJSON,
	FormatNumbered: parseNumbered,
}

// Parse turns a planner's output into a validated plan or final answers.
// An <answer> anywhere outside <think> blocks wins over a plan. A non-nil
// error is always a *Error whose message can be shown to the planner.
func Parse(text string, opts Options) (Result, error) {
	r, err := parse(text, opts)
	if err != nil {
		return Result{}, err
	}
	return r, nil
}

func parse(text string, opts Options) (Result, *Error) {
	o := opts.withDefaults()
	d := newDoc(text)
	if a := d.answers(); a != nil {
		return Result{Format: FormatAnswer, Answers: a}, nil
	}
	f := o.Format
	if f == FormatAnswer {
		return Result{}, errorf(ErrSyntax, "expected a final answer in <answer>…</answer>, but there is none")
	}
	if f == FormatAuto {
		f = detect(d)
	}
	if f == FormatAuto {
		switch {
		case d.thinkCut:
			return Result{}, errorf(ErrTruncated, "the output was cut off inside <think> before any plan or answer; think less and write the plan")
		case strings.TrimSpace(d.text) == "":
			return Result{}, errorf(ErrEmpty, "the output has no plan and no answer; write a plan or an <answer>")
		}
		return Result{}, errorf(ErrUnknownFormat, "no plan or answer found in the output; write a plan in one of the supported formats or an <answer>")
	}
	fp, ok := parsers[f]
	if !ok {
		return Result{}, errorf(ErrUnknownFormat, "unknown plan format %q", string(f))
	}
	p, err := fp(d, &o)
	if err != nil {
		return Result{}, err
	}
	if p.format == "" {
		p.format = f
	}
	verr := validate(p.nodes, &o)
	plan := &Plan{Format: p.format, Nodes: make([]Node, len(p.nodes))}
	for i, n := range p.nodes {
		if n.Deps == nil {
			n.Deps = []string{}
		}
		if n.Args == nil {
			n.Args = map[string]any{}
		}
		plan.Nodes[i] = n.Node
	}
	if p.cut == "" {
		if verr != nil {
			return Result{}, verr
		}
		return Result{Format: p.format, Plan: plan}, nil
	}
	switch {
	case len(p.nodes) == 0:
		return Result{}, errorf(ErrTruncated, "the output was cut off %s before any complete node; write a shorter plan", p.cut)
	case verr != nil:
		e := errorf(ErrTruncated, "the output was cut off %s, and the %s before it do not form a valid plan (%s); write a shorter plan",
			p.cut, count(len(p.nodes), "complete node"), verr.Message)
		e.Node, e.Cycle, e.Line = verr.Node, verr.Cycle, verr.Line
		return Result{}, e
	}
	return Result{Format: p.format, Plan: plan,
		Truncated: fmt.Sprintf("the output was cut off %s; kept the %s before it", p.cut, count(len(p.nodes), "complete node"))}, nil
}

func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// Detect names the format of a planner's output, or returns FormatAuto if
// it recognises none. An <answer> outside <think> blocks is FormatAnswer.
func Detect(text string) Format {
	d := newDoc(text)
	if d.answers() != nil {
		return FormatAnswer
	}
	return detect(d)
}

// detect picks the format whose unambiguous marker comes first (a tag or a
// JSON key); failing that, the first task line or numbered call.
func detect(d *doc) Format {
	best, at := FormatAuto, len(d.lower)+1
	consider := func(f Format, pos int) {
		if pos >= 0 && pos < at {
			best, at = f, pos
		}
	}
	consider(FormatGraph, tagIndex(d, "graph", 0))
	consider(FormatGraph, tagIndex(d, "node", 0))
	consider(FormatTaskList, tagIndex(d, "plan", 0))
	consider(FormatJSON, jsonKeyIndex(d, "nodes"))
	consider(FormatSteps, jsonKeyIndex(d, "steps"))
	consider(FormatSteps, jsonKeyIndex(d, "action"))
	if best != FormatAuto {
		return best
	}
	for off := 0; off < len(d.text); {
		end := strings.IndexByte(d.text[off:], '\n')
		if end < 0 {
			end = len(d.text)
		} else {
			end += off
		}
		line := d.text[off:end]
		if _, _, ok := taskLine(line); ok {
			return FormatTaskList
		}
		if _, _, ok := numberedLine(line); ok {
			return FormatNumbered
		}
		off = end + 1
	}
	// A bare JSON list or object of nodes with ids.
	if jsonKeyIndex(d, "id") >= 0 && (jsonKeyIndex(d, "tool") >= 0 || jsonKeyIndex(d, "depends_on") >= 0) {
		return FormatJSON
	}
	return FormatAuto
}

// tagIndex finds an opening tag <name> or <name attr…> at or after from.
func tagIndex(d *doc, name string, from int) int {
	for {
		i := d.index("<"+name, from)
		if i < 0 {
			return -1
		}
		j := i + 1 + len(name)
		if j < len(d.lower) {
			switch d.lower[j] {
			case '>', ' ', '\t', '\n', '\r', '/':
				return i
			}
		} else {
			return i // cut off right after the name
		}
		from = j
	}
}

// jsonKeyIndex finds "key" followed by a colon.
func jsonKeyIndex(d *doc, key string) int {
	q := `"` + key + `"`
	for from := 0; ; {
		i := d.index(q, from)
		if i < 0 {
			return -1
		}
		j := i + len(q)
		for j < len(d.text) && (d.text[j] == ' ' || d.text[j] == '\t' || d.text[j] == '\n' || d.text[j] == '\r') {
			j++
		}
		if j < len(d.text) && d.text[j] == ':' {
			return i
		}
		from = i + 1
	}
}

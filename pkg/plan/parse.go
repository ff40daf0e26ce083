package plan

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Options configure Parse. The zero value detects the format, accepts any
// tool and applies the default limits.
type Options struct {
	Format      Format   // "" or FormatAuto: detect
	Tools       []string // known tool names; empty: accept any tool
	DefaultTool string   // tool of nodes that name none; "": "actor" (checked against Tools)
	MaxNodes    int      // 0: 64
	MaxDepth    int      // 0: 16 (longest dependency chain, in nodes)
	MaxArgBytes int      // 0: 4096 (any single argument value)
	// Stop lists the stop strings that may have ended the output (the
	// planner's stop strings, when the engine finished with "stop").
	// Engines strip the stop string they stop on: when one is "</answer>",
	// an <answer> left open at the end of the output counts as closed.
	Stop []string
	// Partial says that the text is the beginning of an output still
	// being written (a streamed plan): nodes with the default tool (a task
	// list's tasks still waiting for their tool calls, or for the point
	// after which no dependency can be added to them) are not checked
	// against Tools, for the caller to leave out (schema.Config.PartialNodes).
	// Otherwise the default tool is held to Tools like any other.
	Partial bool
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
	// from and to delimit the text the plan was read from, when to > 0:
	// an <answer> in there is part of the plan (an argument, say).
	from, to int
}

// holds reports whether the plan's text overlaps s[start:end].
func (p *parsed) holds(start, end int) bool {
	return p.to > 0 && start < p.to && p.from < end
}

type formatParser func(d *doc, o *Options) (parsed, *Error)

var parsers = map[Format]formatParser{
	FormatGraph:    parseGraph,
	FormatTaskList: parseTaskList,
	FormatJSON:     parseJSON,
	FormatSteps:    parseJSON,
	FormatNumbered: parseNumbered,
}

// Parse turns a planner's output into a validated plan or final answers
// (see the package documentation for what counts as an answer). A non-nil
// error is always a *Error whose message can be shown to the planner.
// Parse takes time linear in the length of text; ParseContext can also be
// stopped.
func Parse(text string, opts Options) (Result, error) {
	return ParseContext(context.Background(), text, opts)
}

// ParseContext is Parse that stops when ctx ends: then it returns an error
// that wraps ctx.Err() (and is not a *Error: the planner is not at fault).
func ParseContext(ctx context.Context, text string, opts Options) (Result, error) {
	r, perr, _, err := parseCounted(ctx, text, opts)
	if err != nil {
		return Result{}, fmt.Errorf("plan: parse stopped: %w", err)
	}
	if perr != nil {
		return Result{}, perr
	}
	return r, nil
}

// parseCounted is ParseContext that also says how many steps (bytes
// examined) the parse took, so that tests can bound the work per byte.
func parseCounted(ctx context.Context, text string, opts Options) (r Result, perr *Error, steps int, err error) {
	steps, err = run(ctx, func(m *meter) {
		o := opts.withDefaults()
		r, perr = parseDoc(newDoc(text, m, o.Partial), &o)
	})
	return r, perr, steps, err
}

// parseDoc decides between the answers and the plan of d.
func parseDoc(d *doc, o *Options) (Result, *Error) {
	ans := d.findAnswers(o)
	answer := func(e answerElem) (Result, *Error) {
		return Result{Format: FormatAnswer, Answers: e.answers}, nil
	}
	if o.Format == FormatAnswer {
		if n := len(ans.elems); n > 0 {
			return answer(ans.elems[n-1])
		}
		if e := unclosedAnswer(d, ans); e != nil {
			return Result{}, e
		}
		return Result{}, errorf(ErrSyntax, "expected a final answer in <answer>…</answer>, but there is none")
	}
	var candidates []Format
	if o.Format == FormatAuto {
		candidates = detectAll(d)
	} else if _, ok := parsers[o.Format]; ok {
		candidates = []Format{o.Format}
	} else if _, ok := Custom(o.Format); ok {
		candidates = []Format{o.Format} // a format registered by the program (register.go)
	} else if len(ans.elems) == 0 {
		return Result{}, errorf(ErrUnknownFormat, "unknown plan format %q; the formats are graph, tasklist, json, numbered, steps and answer", string(o.Format))
	}
	// The first format that parses wins; a format that finds its markers
	// but no plan (prose that mentions <graph>, say) gives way to the next.
	var (
		r     Result
		err   *Error
		p     parsed
		first *Error
	)
	for _, f := range candidates {
		r, err, p = parseAs(d, f, o)
		if err == nil || err.Kind != ErrSyntax && err.Kind != ErrEmpty {
			first = nil
			break
		}
		if first == nil {
			first = err
		}
		p = parsed{}
	}
	if first != nil {
		r, err = Result{}, first
	}
	// An answer wins over the plan, unless it is part of the plan's text.
	for i := len(ans.elems) - 1; i >= 0; i-- {
		if e := ans.elems[i]; !p.holds(e.start, e.end) {
			return answer(e)
		}
	}
	if len(candidates) > 0 {
		return r, err
	}
	switch {
	case d.thinkCut:
		return Result{}, errorf(ErrTruncated, "the output was cut off inside <think> before any plan or answer; think less and write the plan")
	case ans.empty >= 0:
		return Result{}, errorf(ErrEmpty, "the <answer> is empty; write the answer between <answer> and </answer>")
	}
	if e := unclosedAnswer(d, ans); e != nil {
		return Result{}, e
	}
	d.m.add(len(d.text))
	if strings.TrimSpace(d.text) == "" {
		return Result{}, errorf(ErrEmpty, "the output has no plan and no answer; write a plan or an <answer>")
	}
	return Result{}, errorf(ErrUnknownFormat, "no plan or answer found in the output; write a plan in one of the supported formats or an <answer>")
}

// unclosedAnswer is the error for an output whose only answer is never
// closed, or nil.
func unclosedAnswer(d *doc, ans answerScan) *Error {
	if ans.open < 0 {
		return nil
	}
	line := d.line(ans.open)
	return &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
		"the <answer> at line %d is never closed; write the final answer as <answer>…</answer>", line)}
}

// parseAs parses d in format f and validates the plan.
func parseAs(d *doc, f Format, o *Options) (Result, *Error, parsed) {
	parse, ok := parsers[f]
	if !ok {
		parse, _ = customParser(f)
	}
	p, err := parse(d, o)
	if err != nil {
		return Result{}, err, p
	}
	if p.format == "" {
		p.format = f
	}
	verr := validate(d.m, p.nodes, o, p.format)
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
			return Result{}, verr, p
		}
		return Result{Format: p.format, Plan: plan}, nil, p
	}
	switch {
	case len(p.nodes) == 0:
		return Result{}, errorf(ErrTruncated, "the output was cut off %s before any complete node; write a shorter plan", p.cut), p
	case verr != nil:
		verb := "do"
		if len(p.nodes) == 1 {
			verb = "does"
		}
		e := errorf(ErrTruncated, "the output was cut off %s, and the %s before it %s not form a valid plan (%s); write a shorter plan",
			p.cut, count(len(p.nodes), "complete node"), verb, verr.Message)
		e.Node, e.Cycle, e.Line = verr.Node, verr.Cycle, verr.Line
		return Result{}, e, p
	}
	return Result{Format: p.format, Plan: plan,
		Truncated: fmt.Sprintf("the output was cut off %s; kept the %s before it", p.cut, count(len(p.nodes), "complete node"))}, nil, p
}

func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// Detect names the format of a planner's output, or returns FormatAuto if
// it recognises none. An output that Parse takes for an answer is
// FormatAnswer.
func Detect(text string) Format {
	f := FormatAuto
	_, _ = run(context.Background(), func(m *meter) {
		o := Options{}.withDefaults()
		d := newDoc(text, m, false)
		if len(d.findAnswers(&o).elems) > 0 {
			if r, _ := parseDoc(d, &o); r.Format == FormatAnswer {
				f = FormatAnswer
				return
			}
		}
		if c := detectAll(d); len(c) > 0 {
			f = c[0]
		}
	})
	return f
}

// detectAll lists the formats whose markers appear in d, most likely
// first: formats with an unambiguous marker (a tag or a JSON key) in order
// of where it appears, then the format of the first task line or numbered
// call, then bare JSON lists of nodes.
func detectAll(d *doc) []Format {
	type mark struct {
		f   Format
		pos int
	}
	var marks []mark
	add := func(f Format, pos int) {
		if pos < 0 {
			return
		}
		for i, m := range marks {
			if m.f == f {
				if pos < m.pos {
					marks[i].pos = pos
				}
				return
			}
		}
		marks = append(marks, mark{f, pos})
	}
	add(FormatGraph, tagIndex(d, "graph", 0))
	add(FormatGraph, tagIndex(d, "node", 0))
	add(FormatTaskList, tagIndex(d, "plan", 0))
	add(FormatJSON, jsonKeyIndex(d, "nodes"))
	add(FormatSteps, jsonKeyIndex(d, "steps"))
	add(FormatSteps, jsonKeyIndex(d, "action"))
	slices.SortStableFunc(marks, func(a, b mark) int { return a.pos - b.pos })
	var out []Format
	for _, m := range marks {
		out = append(out, m.f)
	}
	weak := func(f Format) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for off := 0; off < len(d.text); {
		end := strings.IndexByte(d.text[off:], '\n')
		if end < 0 {
			end = len(d.text)
		} else {
			end += off
		}
		line := d.text[off:end]
		d.m.add(2*len(line) + 1)
		if _, _, ok := taskLine(line); ok {
			weak(FormatTaskList)
			break
		}
		if _, _, ok := numberedLine(line); ok {
			weak(FormatNumbered)
			break
		}
		off = end + 1
	}
	if jsonKeyIndex(d, "id") >= 0 {
		weak(FormatJSON)
	}
	return out
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
		d.m.add(j - i)
		if j < len(d.text) && d.text[j] == ':' {
			return i
		}
		from = i + 1
	}
}

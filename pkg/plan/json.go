package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxJSONCandidates bounds how many '{' and '[' Parse tries as the start of
// a JSON plan.
const maxJSONCandidates = 64

// The JSON candidates of one output may read, in all, jsonBudgetPerByte
// times its length plus jsonBudgetBase bytes. A candidate that is not a
// plan but is never closed (text full of "{"id":") reads to the end of the
// output, and so would every candidate inside it: the budget keeps that
// linear. A real plan is read within the first pass or two.
const (
	jsonBudgetPerByte = 4
	jsonBudgetBase    = 64 << 10
)

// parseJSON reads a JSON plan, bare or in a ```json fence, with text around:
//
//	{"nodes":[{"id":"T1","tool":"search","args":{"query":"…"},"depends_on":[]}]}
//	[{"id":"step_1","action":"search","params":{"query":"…"},"dependencies":[]}]
//
// Field names vary between planners (args/params/arguments,
// depends_on/dependencies/deps, tool/action); all map to one Node.
func parseJSON(d *doc, o *Options) (parsed, *Error) {
	var nearMiss *Error
	tries := 0
	budget := jsonBudgetPerByte*len(d.text) + jsonBudgetBase
	keys := &planKeyIndex{text: d.lower, m: d.m, last: -2}
	cutOff := false // a candidate that is not a plan runs to the end of a partial output
	// try walks the JSON value at off; skip is how far a complete value
	// that is not a plan extends, so that its inner brackets are not tried.
	try := func(off int) (p parsed, err *Error, ok bool, skip int) {
		tries++
		r := &jsonReader{s: d.text[off:], m: d.m, budget: &budget}
		w := &jsonWalk{s: d.text[off:], off: off, r: r, m: d.m, keys: keys}
		w.walk()
		d.m.halt()
		if w.exhausted {
			budget = 0
			return p, nil, false, 0
		}
		if !w.found {
			if o.Partial && w.cutOff {
				// The rest of the output may close this value, and the
				// whole output then skips what it holds: nothing in it
				// (or after it) is a plan yet.
				cutOff = true
			}
			return p, nil, false, w.skip
		}
		if w.err != nil {
			if nearMiss == nil {
				at, err := w.errAt()
				nearMiss = &Error{Kind: ErrSyntax, Line: d.line(off + at),
					Message: fmt.Sprintf("the JSON plan is not valid JSON at line %d: %s", d.line(off+at), err)}
			}
			return p, nil, false, 0
		}
		p.format = w.format
		p.from, p.to = off, off+w.end()
		for i, e := range w.elems {
			n, err := jsonNode(e.v, i, o)
			n.line = d.line(off + e.at)
			if err != nil {
				err.Line = n.line
				return p, err, true, 0
			}
			p.nodes = append(p.nodes, n)
		}
		if !w.complete {
			p.cut = "inside the JSON plan"
			if len(p.nodes) > 0 {
				p.cut = fmt.Sprintf("inside the JSON plan, after node %s", p.nodes[len(p.nodes)-1].ID)
			}
		}
		return p, nil, true, 0
	}
	for _, off := range fenceStarts(d) {
		if budget <= 0 {
			break
		}
		if p, err, ok, _ := try(off); ok {
			return p, err
		}
		if cutOff {
			return parsed{}, errorf(ErrSyntax, "no complete JSON plan yet")
		}
	}
	for i := 0; i < len(d.text) && tries < maxJSONCandidates && budget > 0; i++ {
		k := strings.IndexAny(d.text[i:], "{[")
		if k < 0 {
			d.m.add(len(d.text) - i)
			break
		}
		d.m.add(k + 1)
		i += k
		p, err, ok, skip := try(i)
		if ok {
			return p, err
		}
		if cutOff {
			return parsed{}, errorf(ErrSyntax, "no complete JSON plan yet")
		}
		if skip > 1 {
			i += skip - 1
		}
	}
	if nearMiss != nil {
		return parsed{}, nearMiss
	}
	return parsed{}, errorf(ErrSyntax, `expected a JSON plan such as {"nodes": [...]} or a list of steps, but there is none`)
}

// jsonReader serves a candidate's text to encoding/json in chunks, charging
// what it serves to the meter and to the JSON budget: decoding is counted
// like every other scan, and can be stopped between chunks.
type jsonReader struct {
	s      string
	i      int
	m      *meter
	budget *int
}

// errJSONBudget ends a candidate that would read past the JSON budget.
var errJSONBudget = errors.New("the JSON candidates read more than their budget")

// jsonChunk is the most a Read serves at once.
const jsonChunk = 16 << 10

func (r *jsonReader) Read(b []byte) (int, error) {
	if r.i >= len(r.s) {
		return 0, io.EOF
	}
	if *r.budget <= 0 {
		return 0, errJSONBudget
	}
	n := min(len(b), len(r.s)-r.i, jsonChunk, *r.budget)
	copy(b, r.s[r.i:r.i+n])
	r.i += n
	*r.budget -= n
	if err := r.m.charge(n); err != nil {
		return n, err
	}
	return n, nil
}

// fenceStarts lists the offsets of the first '{' or '[' in each ``` fence.
func fenceStarts(d *doc) []int {
	var out []int
	for from := 0; len(out) < maxJSONCandidates/2; {
		i := d.index("```", from)
		if i < 0 {
			break
		}
		nl := strings.IndexByte(d.text[i:], '\n')
		if nl < 0 {
			break
		}
		body := i + nl + 1
		end := d.index("```", body)
		limit := end
		if end < 0 {
			limit = len(d.text)
		}
		d.m.add(limit - i)
		if j := strings.IndexAny(d.text[body:limit], "{["); j >= 0 {
			out = append(out, body+j)
		}
		if end < 0 {
			break
		}
		from = end + 3
	}
	return out
}

type jsonElem struct {
	v  any
	at int // offset of the element in the walked text
}

// jsonWalk streams one JSON value looking for a list of plan nodes, so that
// the nodes before a cut-off (or before a syntax error) are kept.
type jsonWalk struct {
	s    string
	off  int // where s starts in the text
	r    *jsonReader
	m    *meter
	keys *planKeyIndex
	dec  *json.Decoder

	found     bool // a node list was seen (a plan key or a list of objects)
	complete  bool // the node list was closed
	format    Format
	elems     []jsonElem
	err       error // a syntax error inside the plan
	errOff    int   // where, if known; else see errAt
	exhausted bool  // the walk stopped at the end of the JSON budget
	cutOff    bool  // the walk stopped at the end of the text, inside the value
	open      int   // containers open when the walk stopped
	skip      int   // the length of a complete value that is not a plan, or 0
}

// planKeys hold the node list in an object.
var planKeys = map[string]Format{"nodes": FormatJSON, "steps": FormatSteps, "plan": "", "tasks": "", "subtasks": ""}

func (w *jsonWalk) walk() {
	w.dec = json.NewDecoder(w.r)
	tok, err := w.dec.Token()
	if err != nil {
		return
	}
	w.open = 1
	switch tok {
	case json.Delim('['):
		w.list("", true)
	case json.Delim('{'):
		w.object(0)
	default:
		return
	}
	if !w.found && w.open >= 0 {
		// Not a plan: read to the end of the value, so that the brackets
		// inside it are not tried as plans of their own.
		for ; w.open > 0; w.open-- {
			if !w.skipRest() {
				return
			}
		}
		w.skip = int(w.dec.InputOffset())
	}
}

// end is the length of the plan's JSON value: the rest of the containers
// around the node list is read (but not beyond what the budget allows).
func (w *jsonWalk) end() int {
	if w.complete {
		for ; w.open > 0; w.open-- {
			if !w.skipRest() {
				return w.r.i
			}
		}
		return int(w.dec.InputOffset())
	}
	return w.r.i
}

// errAt returns w.err and its offset in w.s. The decoder's offsets are
// relative to whatever it was reading; decoding from the start finds the
// same error at an offset from the start, in what the walk read (the
// error is in it).
func (w *jsonWalk) errAt() (int, error) {
	if w.errOff >= 0 {
		return w.errOff, w.err
	}
	var se *json.SyntaxError
	var v any
	w.m.add(w.r.i)
	if errors.As(json.Unmarshal([]byte(w.s[:w.r.i]), &v), &se) {
		return max(int(se.Offset)-1, 0), se
	}
	return 0, w.err
}

// object walks the members of an object whose '{' was read, looking into
// nested objects ({"plan": {"nodes": …}}) two levels deep. w.open counts
// the containers still open when it returns: -1 after an error.
func (w *jsonWalk) object(depth int) {
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			w.stopped(err)
			return
		}
		key, _ := tok.(string)
		f, isPlan := planKeys[asciiLower(key)]
		if tok, err = w.dec.Token(); err != nil {
			w.stopped(err)
			return
		}
		switch {
		case tok == json.Delim('[') && isPlan:
			w.open++
			w.list(f, false)
			return
		case tok == json.Delim('{') && depth < 2:
			w.open++
			w.object(depth + 1)
			if w.found || w.open < 0 {
				return
			}
		case tok == json.Delim('['), tok == json.Delim('{'):
			if !w.skipRest() {
				w.open = -1 // skipRest said why
				return
			}
		}
	}
	if _, err := w.dec.Token(); err != nil { // '}'
		w.stopped(err)
		return
	}
	w.open--
}

// stopped records why the walk stopped before the end of the value: -1
// open containers, and whether the text ended inside it.
func (w *jsonWalk) stopped(err error) {
	w.open = -1
	w.cutOff = w.cutOff || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// skipRest skips the rest of a container whose opening token was read.
func (w *jsonWalk) skipRest() bool {
	for depth := 1; depth > 0; {
		tok, err := w.dec.Token()
		if err != nil {
			w.stopped(err)
			return false
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
	return true
}

// list walks a node list whose '[' was read. A bare list counts as a plan
// only if its first element is an object.
func (w *jsonWalk) list(f Format, bare bool) {
	if !bare {
		w.found = true
	}
	for {
		start := int(w.dec.InputOffset())
		if !w.dec.More() {
			break
		}
		var v any
		if err := w.dec.Decode(&v); err != nil {
			w.fail(err, start+leadingSpace(w.s[start:]), bare)
			return
		}
		m, isObj := v.(map[string]any)
		if bare && !w.found {
			if !isObj || !looksLikeNode(m) {
				return // still inside the list: w.open counts it
			}
			w.found = true
		}
		w.elems = append(w.elems, jsonElem{v: v, at: start + leadingSpace(w.s[start:])})
	}
	if _, err := w.dec.Token(); err != nil { // ']'
		w.fail(err, int(w.dec.InputOffset()), bare)
		return
	}
	w.open--
	w.complete = true
	w.setFormat(f)
}

// planKeyIndex says whether a node's key ("id" or "action", in any case:
// text is lowered) starts at or after an offset of the text. It finds the last one once per parse: each
// bare list that breaks off then costs one comparison, where it used to
// scan the rest of the text, so that 64 candidates cost 128 steps per byte.
type planKeyIndex struct {
	text string
	m    *meter
	last int // where the last key starts; -1: none; -2: not looked for yet
}

func (k *planKeyIndex) after(at int) bool {
	if k.last == -2 {
		k.m.add(2 * len(k.text))
		k.last = max(strings.LastIndex(k.text, `"id"`), strings.LastIndex(k.text, `"action"`))
	}
	return k.last >= at
}

// fail records an error near offset at.
func (w *jsonWalk) fail(err error, at int, bare bool) {
	w.stopped(err)
	if errors.Is(err, errJSONBudget) || w.m.err != nil {
		w.exhausted = true // not a verdict on the text
		return
	}
	if bare && !w.found {
		// A cut-off bare list is a plan if it starts like one: a node's
		// key follows where it broke off.
		if !(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)) || !w.keys.after(w.off+at) {
			return
		}
		w.found = true
	}
	w.setFormat("")
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return // cut off: complete stays false
	}
	w.err, w.errOff = err, at
	var se *json.SyntaxError
	if errors.As(err, &se) {
		w.errOff = -1 // errAt finds it
	}
}

func (w *jsonWalk) setFormat(f Format) {
	if f != "" {
		w.format = f
		return
	}
	w.format = FormatJSON
	if len(w.elems) > 0 {
		if m, ok := w.elems[0].v.(map[string]any); ok {
			for _, k := range []string{"action", "params", "step_id", "parameters"} {
				if _, ok := lowerKeys(m)[k]; ok {
					w.format = FormatSteps
				}
			}
		}
	} else if w.m.add(w.r.i); strings.Contains(asciiLower(w.s[:w.r.i]), `"action"`) {
		w.format = FormatSteps
	}
}

// leadingSpace measures the white space and the one comma before a list
// element.
func leadingSpace(s string) int {
	n, comma := 0, false
	for n < len(s) {
		switch c := s[n]; {
		case c == ' ' || c == '\n' || c == '\t' || c == '\r':
		case c == ',' && !comma:
			comma = true
		default:
			return n
		}
		n++
	}
	return n
}

func looksLikeNode(m map[string]any) bool {
	lower := lowerKeys(m)
	for _, k := range []string{"id", "step_id", "task_id", "tool", "action"} {
		if _, ok := lower[k]; ok {
			return true
		}
	}
	return false
}

// lowerKeys returns m with its keys lowered, for keys to be matched
// ignoring case. Of keys that differ only in case ("id" and "ID") the one
// spelled in lower case wins, else the first in byte order: never the
// map's iteration order.
func lowerKeys(m map[string]any) map[string]any {
	lower := make(map[string]any, len(m))
	for _, k := range sortedKeys(m) {
		l := asciiLower(k)
		if _, taken := lower[l]; !taken || k == l {
			lower[l] = m[k]
		}
	}
	return lower
}

// Field names planners use for each part of a node, in order of preference.
var (
	idKeys   = []string{"id", "step_id", "task_id", "node_id", "step"}
	toolKeys = []string{"tool", "action", "tool_name", "function", "name"}
	argKeys  = []string{"args", "arguments", "params", "parameters", "input", "tool_input", "inputs"}
	depKeysJ = []string{"depends_on", "deps", "dependencies", "depends", "dependency", "requires", "after"}
	descKeys = []string{"description", "desc", "thought", "task", "reason", "goal", "title"}
)

// jsonNode converts element i of a JSON node list.
func jsonNode(v any, i int, o *Options) (rawNode, *Error) {
	var n rawNode
	m, ok := v.(map[string]any)
	if !ok {
		return n, errorf(ErrSyntax, "step %d of the JSON plan is not an object", i+1)
	}
	// Keys are matched ignoring case (lowerKeys), here and in a tool
	// given as an object.
	lower := lowerKeys(m)
	get := func(keys []string) (any, string) {
		for _, k := range keys {
			if x, ok := lower[k]; ok && x != nil {
				return x, k
			}
		}
		return nil, ""
	}
	id, _ := get(idKeys)
	n.ID = scalar(id)
	if s, ok := id.(string); ok {
		n.ID = strings.TrimSpace(s)
	}
	if _, isString := id.(string); isString && n.ID == "" {
		return n, errorf(ErrSyntax, "step %d of the JSON plan has an empty id; give every step an id", i+1)
	}
	if id != nil && n.ID == "" {
		return n, errorf(ErrSyntax, "step %d of the JSON plan has an id that is not a string or number", i+1)
	}
	tool, toolKey := get(toolKeys)
	if toolKey == "name" && n.ID == "" {
		tool = nil // "name" is the node's name, not a tool
	}
	n.Args = map[string]any{}
	switch t := tool.(type) {
	case string:
		n.Tool = strings.TrimSpace(t)
	case map[string]any: // "action": {"name": "search", "args": {…}}
		t = lowerKeys(t)
		for _, k := range []string{"name", "tool", "type"} {
			if s, ok := t[k].(string); ok {
				n.Tool = strings.TrimSpace(s)
				break
			}
		}
		for _, k := range argKeys {
			if a, ok := t[k]; ok {
				n.Args = argMap(a)
				break
			}
		}
	case nil:
	default:
		return n, errorf(ErrSyntax, "node %s: the tool is not a string", orUnnamed(n.ID))
	}
	if a, _ := get(argKeys); a != nil {
		n.Args = argMap(a)
	}
	if dv, key := get(depKeysJ); dv != nil {
		// A dependency that is not an id (an object, a list, true) is a
		// mistake to say, not one to drop: the node would run without
		// waiting for what it needs.
		notID := func(x any) *Error {
			b, _ := json.Marshal(x)
			e := errorf(ErrSyntax, "node %s: the dependency %s in %q is not a node id; write the ids of the nodes it depends on, as in \"%s\": [\"T1\", \"T2\"]",
				orUnnamed(n.ID), shorten(string(b), 60), key, key)
			e.Node = n.ID
			return e
		}
		switch dv := dv.(type) {
		case []any:
			for _, x := range dv {
				s := scalar(x)
				switch x.(type) {
				case nil:
				case string, float64:
					if s = strings.TrimSpace(s); s != "" {
						n.Deps = append(n.Deps, s)
					}
				default:
					return n, notID(x)
				}
			}
			n.Deps = dedupe(n.Deps)
		case string:
			n.Deps = depList(dv)
		case float64:
			n.Deps = []string{scalar(dv)}
		default:
			return n, notID(dv)
		}
	}
	if dv, _ := get(descKeys); dv != nil {
		n.Description, _ = dv.(string)
	}
	if n.Tool == "" {
		n.Tool = o.DefaultTool
	}
	if len(n.Args) == 0 && n.Description != "" {
		n.Args["input"] = n.Description
	}
	return n, nil
}

// argMap turns a JSON args value into named arguments: an object as it
// is, a list as positional arguments, anything else as the input.
func argMap(a any) map[string]any {
	switch a := a.(type) {
	case map[string]any:
		return a
	case []any:
		args := map[string]any{}
		assignPositional(args, a)
		return args
	case nil:
		return map[string]any{}
	default:
		return map[string]any{"input": a}
	}
}

// scalar renders a string or number as an id; other values give "".
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return ""
	}
	return ""
}

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
// depends_on/dependencies/deps, tool/action); all map to one Node. The
// output holds one plan: another node list, in the plan's own value or in
// another one, is an error unless it holds the same nodes (see onePlan).
func parseJSON(d *doc, o *Options) (parsed, *Error) {
	s := &jsonScan{d: d, o: o, budget: jsonBudgetPerByte*len(d.text) + jsonBudgetBase,
		keys: &planKeyIndex{text: d.lower, m: d.m, last: -2}, invalidAt: -1}
	var c jsonTry
	fenced := false
	for _, off := range fenceStarts(d) {
		if s.budget <= 0 {
			break
		}
		if c = s.try(off); c.found || c.hold {
			fenced = true
			break
		}
	}
	if !c.found && !c.hold {
		s.each(0, 0, 0, func(t jsonTry) bool {
			c = t
			return !t.found && !t.hold
		})
	}
	switch {
	case c.hold:
		return parsed{}, errorf(ErrSyntax, "no complete JSON plan yet")
	case !c.found && s.nearMiss != nil:
		return parsed{}, s.nearMiss
	case !c.found:
		return parsed{}, errorf(ErrSyntax, `expected a JSON plan such as {"nodes": [...]} or a list of steps, but there is none`)
	case c.err != nil:
		return c.p, c.err
	}
	return c.p, s.onePlan(c, fenced)
}

// jsonScan tries the '{' and '[' of an output as the start of a JSON plan.
type jsonScan struct {
	d         *doc
	o         *Options
	budget    int // what the candidates may still read
	tries     int
	keys      *planKeyIndex
	nearMiss  *Error // the first node list that is not valid JSON
	invalidAt int    // where its value starts; -1: none
}

// jsonTry is what one candidate holds.
type jsonTry struct {
	p       parsed
	err     *Error // a node of the plan is not a node
	found   bool   // a node list, valid JSON as far as it goes
	invalid bool   // a node list that is not valid JSON
	hold    bool   // Partial: no node list yet, but the rest of the output may close the value, and the whole output skips what it holds
	// ends says that the text ends inside the value: nothing follows it.
	ends bool
	next int // where to look for the next value: the end of this one, or where it broke off
	skip int // the length of a value whose brackets are not to be tried on their own, or 0
	key  string
	at   int        // the plan's key ("" for a bare list) and where its '[' is
	more []jsonList // node lists after the plan's in the same value
}

// try walks the JSON value at off.
func (s *jsonScan) try(off int) (t jsonTry) {
	d := s.d
	s.tries++
	r := &jsonReader{s: d.text[off:], m: d.m, budget: &s.budget}
	w := &jsonWalk{s: d.text[off:], off: off, r: r, m: d.m, keys: s.keys}
	w.walk()
	d.m.halt()
	if w.exhausted {
		s.budget = 0
		return t
	}
	if !w.found {
		// A value the rest of the output may close is skipped whole then,
		// and what it holds with it: nothing in it (or after it) is a
		// plan yet.
		t.hold = s.o.Partial && w.cutOff
		t.skip = w.skip
		return t
	}
	if w.err != nil {
		if s.nearMiss == nil {
			at, err := w.errAt()
			s.nearMiss = &Error{Kind: ErrSyntax, Line: d.line(off + at),
				Message: fmt.Sprintf("the JSON plan is not valid JSON at line %d: %s", d.line(off+at), err)}
			s.invalidAt = off
		}
		t.invalid, t.p.from = true, off
		return t
	}
	t.found, t.key, t.at, t.more = true, w.key, off+w.at, w.more
	t.ends = !w.complete || w.open < 0 && w.cutOff
	t.next = off + int(w.dec.InputOffset())
	if !t.ends {
		t.skip = t.next - off // a copy's own lists are not tried again
	}
	t.p.format = w.format
	t.p.from, t.p.to = off, off+w.end()
	t.p.nodes, t.err = s.nodes(w.elems, off)
	if t.err != nil {
		return t
	}
	if !w.complete {
		t.p.cut = "inside the JSON plan"
		if len(t.p.nodes) > 0 {
			t.p.cut = fmt.Sprintf("inside the JSON plan, after node %s", t.p.nodes[len(t.p.nodes)-1].ID)
		}
	}
	return t
}

// nodes converts the elements of a node list in the value at off.
func (s *jsonScan) nodes(elems []jsonElem, off int) ([]rawNode, *Error) {
	var out []rawNode
	for i, e := range elems {
		n, err := jsonNode(e.v, i, s.o)
		n.line = s.d.line(off + e.at)
		if err != nil {
			err.Line = n.line
			return out, err
		}
		out = append(out, n)
	}
	return out, nil
}

// each tries the candidates from offset from on, but none in
// [skipFrom, skipTo), until fn returns false, or the candidates or the
// budget run out.
func (s *jsonScan) each(from, skipFrom, skipTo int, fn func(jsonTry) bool) {
	d := s.d
	for i := from; i < len(d.text) && s.tries < maxJSONCandidates && s.budget > 0; i++ {
		if i >= skipFrom && i < skipTo {
			i = skipTo
		}
		k := strings.IndexAny(d.text[i:], "{[")
		if k < 0 {
			d.m.add(len(d.text) - i)
			return
		}
		d.m.add(k + 1)
		i += k
		if i >= skipFrom && i < skipTo {
			i = skipTo - 1
			continue
		}
		t := s.try(i)
		if !fn(t) {
			return
		}
		if t.skip > 1 {
			i += t.skip - 1
		}
	}
}

// onePlan checks that the output holds no plan but c's: another node list
// in c's value ({"nodes": [...], "nodes": [...]}) or in another value,
// before or after it, is a second plan, and which one the planner means is
// a guess (a revision, or a draft after the plan), unless it holds the same
// nodes. A list without nodes is a mention; a list that is not valid JSON,
// or that the end of the output cuts off, is not the same plan (while a
// plan streams, the nodes wait for the rest). fenced says that c was read
// from a fence before the text before it was tried.
func (s *jsonScan) onePlan(c jsonTry, fenced bool) *Error {
	d, p := s.d, c.p
	for _, l := range c.more {
		if !s.same(p.nodes, l) {
			second := ""
			if asciiLower(l.key) == asciiLower(c.key) {
				second = "second "
			}
			line := d.line(l.at)
			return &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
				"the output holds two different plans, the %q list at line %d and the %s%q list at line %d; write one JSON plan with the whole plan",
				c.key, d.line(c.at), second, l.key, line)}
		}
	}
	two := func(other int) *Error {
		a, b := d.line(min(p.from, other)), d.line(max(p.from, other))
		return &Error{Kind: ErrSyntax, Line: d.line(other), Message: fmt.Sprintf(
			"the output holds two different plans, the JSON plan at line %d and the JSON plan at line %d; write one JSON plan with the whole plan",
			a, b)}
	}
	if s.invalidAt >= 0 {
		return two(s.invalidAt)
	}
	if c.ends {
		return nil
	}
	from, skipTo := c.next, 0
	if fenced {
		from, skipTo = 0, c.next
	}
	var err *Error
	s.tries = 0
	s.each(from, p.from, skipTo, func(t jsonTry) bool {
		switch {
		case t.hold:
			err = errorf(ErrSyntax, "no complete JSON plan yet")
		case t.invalid:
			err = two(t.p.from)
		case !t.found:
		case t.err != nil || t.p.cut != "" || len(t.p.nodes) > 0 && !sameNodes(p.nodes, t.p.nodes):
			err = two(t.p.from)
		default:
			for _, l := range t.more {
				if !s.same(p.nodes, l) {
					err = two(t.p.from)
				}
			}
		}
		return err == nil
	})
	return err
}

// same reports whether the node list l holds the same nodes (or none).
func (s *jsonScan) same(nodes []rawNode, l jsonList) bool {
	if !l.complete || l.invalid {
		return false
	}
	if len(l.elems) == 0 {
		return true // a mention: {"nodes": []}
	}
	other, err := s.nodes(l.elems, 0)
	return err == nil && sameNodes(nodes, other)
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
	err       error      // a syntax error inside the plan
	errOff    int        // where, if known; else see errAt
	exhausted bool       // the walk stopped at the end of the JSON budget
	cutOff    bool       // the walk stopped at the end of the text, inside the value
	open      int        // containers open when the walk stopped
	skip      int        // the length of a complete value that is not a plan, or 0
	key       string     // the node list's key, "" in a bare list
	at        int        // where its '[' is in s
	more      []jsonList // node lists after it in the same value
}

// jsonList is a node list after the plan's in the same value: a second
// plan, unless it holds the same nodes.
type jsonList struct {
	key      string
	at       int // where its '[' is in the text
	elems    []jsonElem
	complete bool // closed with ']'
	invalid  bool // not valid JSON
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

// end is the length of the plan's JSON value, or of what was read of it
// when the walk stopped before its end.
func (w *jsonWalk) end() int {
	if w.complete && w.open == 0 {
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
// nested objects ({"plan": {"nodes": …}}) two levels deep. After the node
// list it reads the rest of the value for node lists that follow it. w.open
// counts the containers still open when it returns: -1 after an error.
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
		case tok == json.Delim('[') && isPlan && w.found:
			w.open++
			if !w.another(key) {
				return
			}
		case tok == json.Delim('[') && isPlan:
			w.open++
			w.key, w.at = key, int(w.dec.InputOffset())-1
			w.list(f, false)
			if w.open < 0 {
				return
			}
		case tok == json.Delim('{') && depth < 2:
			w.open++
			w.object(depth + 1)
			if w.open < 0 {
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

// another reads a node list after the plan's, whose '[' was read, into
// w.more: false when the walk stops in it.
func (w *jsonWalk) another(key string) bool {
	l := jsonList{key: key, at: w.off + int(w.dec.InputOffset()) - 1}
	stop := func(err error) bool {
		w.stopped(err)
		if errors.Is(err, errJSONBudget) || w.m.err != nil {
			return false // not a verdict on the text
		}
		l.invalid = !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF)
		w.more = append(w.more, l)
		return false
	}
	for w.dec.More() {
		start := int(w.dec.InputOffset())
		var v any
		if err := w.dec.Decode(&v); err != nil {
			return stop(err)
		}
		l.elems = append(l.elems, jsonElem{v: v, at: start + leadingSpace(w.s[start:])})
	}
	if _, err := w.dec.Token(); err != nil { // ']'
		return stop(err)
	}
	w.open--
	l.complete = true
	w.more = append(w.more, l)
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

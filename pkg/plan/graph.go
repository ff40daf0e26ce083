package plan

import (
	"errors"
	"fmt"
	"html"
	"reflect"
	"slices"
	"strings"
)

// parseGraph reads GAP graph XML:
//
//	<graph>
//	<node id="s1">search("capital of France")</node>
//	<node id="s2" depends="s1">search("population of {s1}")</node>
//	</graph>
//
// The <graph> wrapper is optional (an empty <graph></graph> is a mention
// of it), a missing </graph> or </node> is forgiven when the next tag
// makes the intent clear, and a node cut off by the end of the output is
// dropped and reported in parsed.cut. A second
// <graph> with nodes is a second plan: an error naming both, unless it
// holds the same nodes as the first; so is a node outside the <graph>.
func parseGraph(d *doc, o *Options) (parsed, *Error) {
	p := parsed{format: FormatGraph}
	start, end := 0, len(d.text)
	closed := false // a real </graph> ends the region
	// Each node asks where the next <node and the next </node> are; the
	// finders answer all of those questions in one scan each.
	nodes, closes := d.tagFinder("node"), d.finder("</node>")
	for g := tagIndex(d, "graph", 0); g >= 0; {
		gt := strings.IndexByte(d.text[g:], '>')
		if gt < 0 {
			d.m.add(len(d.text) - g)
			p.cut = "inside the <graph> tag"
			return p, nil
		}
		d.m.add(gt)
		start, p.from = g+gt+1, g
		c := d.index("</graph>", start)
		if c < 0 {
			end, closed = len(d.text), false
			break
		}
		end, closed = c, true
		// A closed <graph> without a node ("write it in `<graph>…</graph>`
		// tags") is a mention: the plan is in the next one, if any, else
		// its nodes are written without a <graph> (without any, the
		// <graph> is an empty plan).
		if n := nodes.next(start); n >= 0 && n < end {
			break
		}
		if g = tagIndex(d, "graph", c+len("</graph>")); g < 0 && nodes.next(0) >= 0 {
			start, end, closed, p.from = 0, len(d.text), false, 0
		}
	}
	err := graphNodes(d, o, &p, start, end, closed, nodes, closes)
	switch {
	case err != nil:
		return p, err
	case closed:
		p.to = end + len("</graph>")
	case p.cut != "":
		p.to = len(d.text)
	case len(p.nodes) == 0 && start == 0 && nodes.next(start) < 0:
		return p, errorf(ErrSyntax, "expected a <graph> of <node> elements, but there is none")
	}
	if start == 0 || len(p.nodes) == 0 && p.cut == "" {
		return p, nil // no <graph>, or a mention of one
	}
	return p, outsideGraph(d, o, &p, closed, nodes, closes)
}

// outsideGraph checks what lies outside the plan's <graph>, p: a node
// element before or after it, or another <graph> with nodes that are not
// p's, is part of a plan that p leaves out, and which plan the planner
// means is anyone's guess (it may revise a plan, write a draft after it,
// or forget a node outside it). An empty <graph> is a mention. closed says
// that p's <graph> ends before the end of the output.
func outsideGraph(d *doc, o *Options, p *parsed, closed bool, nodes *tagFinder, closes *finder) *Error {
	first := d.line(p.from)
	strays := strayNodes{d: d, nodes: d.tagFinder("node"), closes: d.finder("</node>")}
	stray := func(from, to int) *Error {
		at, id := strays.find(from, to)
		if at < 0 {
			return nil
		}
		what, line := "<node>", d.line(at)
		if id != "" {
			what = fmt.Sprintf("<node id=%q>", id)
		}
		return &Error{Kind: ErrSyntax, Line: line, Node: id, Message: fmt.Sprintf(
			"the %s at line %d is outside the <graph> at line %d; write every node of the plan inside the one <graph>",
			what, line, first)}
	}
	if err := stray(0, p.from); err != nil || !closed {
		return err
	}
	for from := p.to; ; {
		g := tagIndex(d, "graph", from)
		if g < 0 {
			return stray(from, len(d.text))
		}
		if err := stray(from, g); err != nil {
			return err
		}
		gt := strings.IndexByte(d.text[g:], '>')
		if gt < 0 {
			d.m.add(len(d.text) - g)
			return nil // cut off inside the tag: a plan without nodes
		}
		d.m.add(gt)
		start, end, closed := g+gt+1, len(d.text), false
		if c := d.index("</graph>", start); c >= 0 {
			end, closed = c, true
		}
		if n := nodes.next(start); n < 0 || n >= end {
			if !closed {
				return nil
			}
			from = end + len("</graph>")
			continue
		}
		q := parsed{from: g}
		err := graphNodes(d, o, &q, start, end, closed, nodes, closes)
		if err != nil || q.cut != "" || !sameNodes(p.nodes, q.nodes) {
			line := d.line(g)
			return &Error{Kind: ErrSyntax, Line: line, Message: fmt.Sprintf(
				"the output holds two different plans, the <graph> at line %d and the <graph> at line %d; write one <graph> with the whole plan",
				first, line)}
		}
		if !closed {
			return nil
		}
		from = end + len("</graph>")
	}
}

// strayNodes finds node elements outside a <graph>, in one scan of the
// text for all the stretches it is asked about, in order.
type strayNodes struct {
	d      *doc
	nodes  *tagFinder
	closes *finder
}

// find returns the offset of the first node element in d.text[from:to],
// and its id, or -1: a <node …>…</node>, or a <node …/> with attributes.
// A tag that is never closed ("each <node> is one step", "<node id="s2">
// runs first"), or one in quotes or a code span, is prose about nodes.
func (s *strayNodes) find(from, to int) (at int, id string) {
	for from < to {
		i := s.nodes.next(from)
		if i < 0 || i >= to {
			break
		}
		attrs, tagEnd, selfClosing, err := parseAttrs(s.d.text[:to], i+len("<node"))
		s.d.m.add(tagEnd - i)
		from = max(tagEnd, i+1)
		switch {
		case err != nil, i > 0 && strings.IndexByte("`\"'", s.d.text[i-1]) >= 0:
			continue
		case selfClosing:
			if len(attrs) == 0 {
				continue
			}
		default:
			if c, n := s.closes.next(tagEnd), s.nodes.next(tagEnd); c < 0 || c >= to || n >= 0 && n < c {
				continue
			}
		}
		return i, strings.TrimSpace(attrs["id"])
	}
	return -1, ""
}

// sameNodes reports whether a and b are the same nodes, wherever written.
func sameNodes(a, b []rawNode) bool {
	return slices.EqualFunc(a, b, func(x, y rawNode) bool { return reflect.DeepEqual(x.Node, y.Node) })
}

// graphNodes reads the <node> elements of d.text[start:end] into p; closed
// says that a </graph> ends the region.
func graphNodes(d *doc, o *Options, p *parsed, start, end int, closed bool, nodes *tagFinder, closes *finder) *Error {
	for pos := start; ; {
		i := nodes.next(pos)
		if i < 0 || i >= end {
			break
		}
		if start == 0 && len(p.nodes) == 0 {
			p.from = i
		}
		attrs, tagEnd, selfClosing, err := parseAttrs(d.text[:end], i+len("<node"))
		d.m.add(tagEnd - i)
		if errors.Is(err, errEOF) {
			if closed {
				return &Error{Kind: ErrSyntax, Line: d.line(i), Message: fmt.Sprintf("the <node> tag at line %d is not closed with '>'", d.line(i))}
			}
			p.cut = "inside a <node> tag"
			if id := attrs["id"]; id != "" {
				p.cut = fmt.Sprintf("inside the <node> tag of %s", id)
			}
			break
		}
		if err != nil {
			return &Error{Kind: ErrSyntax, Line: d.line(i), Message: fmt.Sprintf("the <node> tag at line %d is malformed: %s", d.line(i), err)}
		}
		n := rawNode{line: d.line(i)}
		n.ID = strings.TrimSpace(attrs["id"])
		var content string
		if selfClosing {
			pos = tagEnd
		} else {
			c := closes.next(tagEnd)
			if c >= end {
				c = -1
			}
			next := nodes.next(tagEnd)
			if next >= end {
				next = -1
			}
			switch {
			case next >= 0 && (c < 0 || next < c) && o.Partial && start == 0:
				// Without a <graph>, a node whose </node> is forgotten is
				// a node only while no <graph> follows (outside one it is
				// prose): in a streamed plan, that is not known yet.
				p.cut = "inside <node>"
				if n.ID != "" {
					p.cut = fmt.Sprintf("inside <node id=%q>", n.ID)
				}
				p.to = len(d.text)
				return nil
			case next >= 0 && (c < 0 || next < c): // </node> forgotten
				content, pos = d.text[tagEnd:next], next
			case c >= 0:
				content, pos = d.text[tagEnd:c], c+len("</node>")
			case closed:
				content, pos = d.text[tagEnd:end], end
			default:
				p.cut = "inside <node>"
				if n.ID != "" {
					p.cut = fmt.Sprintf("inside <node id=%q>", n.ID)
				}
				p.to = len(d.text)
				return nil
			}
		}
		if err := fillGraphNode(d.m, &n, attrs, content, o); err != nil {
			err.Line = n.line
			return err
		}
		p.nodes = append(p.nodes, n)
		p.to = pos
	}
	return nil
}

func fillGraphNode(m *meter, n *rawNode, attrs map[string]string, content string, o *Options) *Error {
	m.add(2 * len(content))
	for _, k := range []string{"depends", "depends_on", "deps", "dependencies", "depend", "dep", "needs"} {
		if v, ok := attrs[k]; ok {
			n.Deps = depList(v)
			break
		}
	}
	n.Description = firstAttr(attrs, "description", "desc", "title")
	content = strings.TrimSpace(content)
	if strings.IndexByte(content, '&') >= 0 {
		content = html.UnescapeString(content)
	}
	n.Args = map[string]any{}
	for _, k := range []string{"input", "query"} {
		if v, ok := attrs[k]; ok {
			n.Args[k] = v
		}
	}
	if tool := firstAttr(attrs, "tool", "action"); tool != "" {
		n.Tool = tool
		if c, note, ok, _ := callRegion(m, content); ok && strings.EqualFold(c.tool, tool) {
			n.Args = c.args
			if n.Description == "" {
				n.Description = note
			}
		} else if content != "" {
			n.Args["input"] = content
		}
	} else {
		c, note, ok, err := callRegion(m, content)
		switch {
		case ok:
			n.Tool, n.Args = c.tool, c.args
			if n.Description == "" {
				n.Description = note
			}
		case errors.Is(err, errEOF):
			return errorf(ErrSyntax, "node %s: the call %s is not closed", orUnnamed(n.ID), describe(content))
		case err != nil:
			return errorf(ErrSyntax, "node %s: the call %s is malformed; write it as tool(\"text\", [\"{s1}\"])", orUnnamed(n.ID), describe(content))
		case content != "":
			n.Tool = o.DefaultTool
			n.Args["input"] = content
		}
	}
	if content == "" && len(n.Args) == 0 {
		return errorf(ErrSyntax, "node %s is empty; put a tool call such as search(\"…\") or a task inside it", orUnnamed(n.ID))
	}
	return nil
}

func orUnnamed(id string) string {
	if id == "" {
		return "without id"
	}
	return id
}

func firstAttr(attrs map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(attrs[k]); v != "" {
			return v
		}
	}
	return ""
}

// depList splits a dependency list written "s1,s2", "s1 s2", "[s1, s2]",
// "s1 and s2", "{s1}" or "none". A range, "s1 - s3" or "s1 to s3", is one
// dependency, "s1-s3".
func depList(s string) []string {
	f := strings.FieldsFunc(s, func(r rune) bool {
		switch r {
		case ',', ';', ' ', '\t', '\n', '\r', '[', ']', '(', ')', '{', '}', '"', '\'', '$', '&', '+':
			return true
		}
		return false
	})
	none := func(x string) bool {
		switch strings.ToLower(x) {
		case "none", "-", "null", "nil", "n/a", "na", "and", "no", "nothing", "empty":
			return true
		}
		return false
	}
	var out []string
	for i := 0; i < len(f); i++ {
		x := f[i]
		// "s1 - s3", "s1 to s3": a range, kept as one dependency "s1-s3"
		// for validation to refuse by name (ids may hold '-', so a range
		// is never guessed at), not two dependencies without s2.
		switch strings.ToLower(x) {
		case "-", "–", "—", "to", "through":
			if i > 0 && !none(f[i-1]) && i+1 < len(f) && !none(f[i+1]) {
				out[len(out)-1] += "-" + strings.TrimRight(f[i+1], ".")
				i++
				continue
			}
		}
		if !none(x) {
			out = append(out, strings.TrimRight(x, "."))
		}
	}
	return dedupe(out)
}

// parseAttrs reads XML-ish attributes from s[i:] up to '>' or '/>'. Names
// are lowered; values may be double-, single- or not quoted.
func parseAttrs(s string, i int) (attrs map[string]string, end int, selfClosing bool, err error) {
	attrs = map[string]string{}
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
		if i >= len(s) {
			return attrs, i, false, errEOF
		}
		switch s[i] {
		case '>':
			return attrs, i + 1, false, nil
		case '/':
			if i+1 >= len(s) {
				return attrs, i, false, errEOF
			}
			if s[i+1] == '>' {
				return attrs, i + 2, true, nil
			}
			return attrs, i, false, errors.New("stray '/'")
		}
		j := i
		for j < len(s) && (isIdent(s[j]) || s[j] == ':') {
			j++
		}
		if j == i {
			return attrs, i, false, fmt.Errorf("unexpected %q", s[i])
		}
		name := asciiLower(s[i:j])
		for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
			j++
		}
		if j >= len(s) {
			return attrs, j, false, errEOF
		}
		if s[j] != '=' {
			attrs[name] = ""
			i = j
			continue
		}
		j++
		for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
			j++
		}
		if j >= len(s) {
			return attrs, j, false, errEOF
		}
		var v string
		if q := s[j]; q == '"' || q == '\'' {
			k := strings.IndexByte(s[j+1:], q)
			if k < 0 {
				return attrs, len(s), false, errEOF
			}
			v, i = s[j+1:j+1+k], j+k+2
		} else {
			k := j
			for k < len(s) && s[k] != ' ' && s[k] != '\t' && s[k] != '\n' && s[k] != '>' && !(s[k] == '/' && k+1 < len(s) && s[k+1] == '>') {
				k++
			}
			v, i = s[j:k], k
		}
		if strings.IndexByte(v, '&') >= 0 {
			v = html.UnescapeString(v)
		}
		if _, dup := attrs[name]; !dup {
			attrs[name] = v
		}
	}
}

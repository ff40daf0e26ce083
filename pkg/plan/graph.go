package plan

import (
	"errors"
	"fmt"
	"html"
	"strings"
)

// parseGraph reads GAP graph XML:
//
//	<graph>
//	<node id="s1">search("capital of France")</node>
//	<node id="s2" depends="s1">search("population of {s1}")</node>
//	</graph>
//
// The <graph> wrapper is optional, a missing </graph> or </node> is
// forgiven when the next tag makes the intent clear, and a node cut off by
// the end of the output is dropped and reported in parsed.cut.
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
		// tags") is a mention: the plan is in the next one, if any.
		if n := nodes.next(start); n >= 0 && n < end {
			break
		}
		g = tagIndex(d, "graph", c+len("</graph>"))
	}
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
				return p, &Error{Kind: ErrSyntax, Line: d.line(i), Message: fmt.Sprintf("the <node> tag at line %d is not closed with '>'", d.line(i))}
			}
			p.cut = "inside a <node> tag"
			if id := attrs["id"]; id != "" {
				p.cut = fmt.Sprintf("inside the <node> tag of %s", id)
			}
			break
		}
		if err != nil {
			return p, &Error{Kind: ErrSyntax, Line: d.line(i), Message: fmt.Sprintf("the <node> tag at line %d is malformed: %s", d.line(i), err)}
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
				return p, nil
			}
		}
		if err := fillGraphNode(d.m, &n, attrs, content, o); err != nil {
			err.Line = n.line
			return p, err
		}
		p.nodes = append(p.nodes, n)
		p.to = pos
	}
	if closed {
		p.to = end + len("</graph>")
	} else if p.cut != "" {
		p.to = len(d.text)
	}
	if len(p.nodes) == 0 && p.cut == "" && nodes.next(start) < 0 {
		if start == 0 {
			return p, errorf(ErrSyntax, "expected a <graph> of <node> elements, but there is none")
		}
	}
	return p, nil
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
// "s1 and s2", "{s1}" or "none".
func depList(s string) []string {
	f := strings.FieldsFunc(s, func(r rune) bool {
		switch r {
		case ',', ';', ' ', '\t', '\n', '\r', '[', ']', '(', ')', '{', '}', '"', '\'', '$', '&', '+':
			return true
		}
		return false
	})
	var out []string
	for _, x := range f {
		switch strings.ToLower(x) {
		case "none", "-", "null", "nil", "n/a", "na", "and", "no", "nothing", "empty":
			continue
		}
		out = append(out, strings.TrimRight(x, "."))
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

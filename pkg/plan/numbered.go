package plan

import (
	"errors"
	"fmt"
	"strings"
)

// parseNumbered reads LLMCompiler-style numbered calls:
//
//	Thought: I need the capital first.
//	1. search("capital of France")
//	2. search("population of $1")
//	3. math("compare", ["$1", "${2}"])
//	4. join()
//
// Ids are the numbers; dependencies are the ids that the arguments refer
// to ($1, ${1}, {1}); join() or <END_OF_PLAN> ends the plan (after the call
// on its line, if any). Several calls may share a line ("1. a(…); 2. b(…)").
// A Thought line becomes the description of the call after it.
func parseNumbered(d *doc, o *Options) (parsed, *Error) {
	p := parsed{format: FormatNumbered}
	s := d.text
	// A call may run over several lines (a long prompt), but it ends before
	// the next numbered line: so no line is read by two calls, and a call
	// left open does not read the rest of the output once per line.
	var starts []int
	for off := 0; off < len(s); {
		lineEnd := len(s)
		if nl := strings.IndexByte(s[off:], '\n'); nl >= 0 {
			lineEnd = off + nl
		}
		d.m.add(2 * (lineEnd - off + 1))
		if _, _, ok := numberedLine(s[off:lineEnd]); ok {
			starts = append(starts, off)
		}
		off = lineEnd + 1
	}
	// <END_OF_PLAN> ends the plan where it stands, after a call on its
	// line too.
	stop := d.index("<end_of_plan>", 0)
	if stop < 0 {
		stop = len(s)
	}
	var thought string
	next := 0     // index in starts of the first numbered line after off
	lineEnd := -1 // the end of the line off is in, once found
	for off := 0; off < stop; {
		if off > lineEnd {
			// A new line (several calls on one line are read in turn
			// without looking for its end again: linear work).
			lineEnd = stop
			if nl := strings.IndexByte(s[off:stop], '\n'); nl >= 0 {
				lineEnd = off + nl
			}
			d.m.add(2 * (lineEnd - off + 1))
		}
		line := s[off:lineEnd]
		id, at, ok := numberedLine(line)
		if !ok {
			t := strings.TrimSpace(strings.TrimLeft(line, " \t*#>-"))
			if len(t) >= 8 && strings.EqualFold(t[:8], "thought:") {
				thought = strings.TrimSpace(strings.Trim(t[8:], "* "))
			}
			off = lineEnd + 1
			continue
		}
		if len(p.nodes) == 0 {
			p.from = off
		}
		for next < len(starts) && starts[next] <= off {
			next++
		}
		limit := stop
		if next < len(starts) {
			limit = min(starts[next], stop)
		}
		lineNo := d.line(off)
		lastLine := lineEnd == len(s)
		c, err := parseCall(d.m, s[:limit], off+at)
		after := lineEnd + 1
		if err == nil {
			// The call may span lines; skip what follows it on its last
			// line (a comment), unless that is the next numbered call.
			if c.end > lineEnd {
				// It spans lines: its last line is the one it ends on.
				lineEnd = limit
				if nl := strings.IndexByte(s[c.end:limit], '\n'); nl >= 0 {
					lineEnd = c.end + nl
				}
				d.m.add(lineEnd - c.end + 1)
			}
			after = min(lineEnd+1, limit)
			rest := strings.TrimLeft(s[c.end:after], " \t;,")
			d.m.add(after - c.end - len(rest) + 1)
			if _, _, ok := numberedLine(rest); ok {
				after -= len(rest)
			}
		} else {
			region := line[at:]
			if k := nextCallOnLine(d.m, line, at); k >= 0 {
				// "1. search(a); 2. search(b)": the first call ends at the ';'.
				region, after = line[at:strings.LastIndexByte(line[:k], ';')], off+k
				lastLine = false
			}
			c, _, ok, err = callRegion(d.m, region)
			if !ok {
				if errors.Is(err, errEOF) && lastLine || errors.Is(err, errEOF) && strings.TrimSpace(s[lineEnd:]) == "" {
					p.cut = fmt.Sprintf("inside step %s", id)
					p.to = len(s)
					break
				}
				if lastLine && !strings.HasSuffix(strings.TrimSpace(line), ")") {
					p.cut = fmt.Sprintf("inside step %s", id)
					p.to = len(s)
					break
				}
				return p, &Error{Kind: ErrSyntax, Line: lineNo, Node: id, Message: fmt.Sprintf(
					"line %d: step %s is not a well-formed call such as search(\"…\"): %s", lineNo, id, describe(line[at:]))}
			}
		}
		off = after
		p.to = min(after, len(s))
		if strings.EqualFold(c.tool, "join") || strings.EqualFold(c.tool, "finish") {
			break
		}
		n := rawNode{line: lineNo, Node: Node{ID: id, Tool: c.tool, Args: c.args, Description: thought}}
		thought = ""
		p.nodes = append(p.nodes, n)
	}
	ids := make(map[string]bool, len(p.nodes))
	for _, n := range p.nodes {
		ids[n.ID] = true
	}
	for i := range p.nodes {
		n := &p.nodes[i]
		seen := map[string]bool{}
		refs(d.m, n.Args, func(name, _ string) bool {
			if ids[name] && !seen[name] {
				seen[name] = true
				n.Deps = append(n.Deps, name)
			}
			return true
		})
	}
	if len(p.nodes) == 0 && p.cut == "" {
		return p, errorf(ErrSyntax, `expected numbered calls such as 1. search("…"), but there are none`)
	}
	return p, nil
}

// nextCallOnLine finds, in line after from, a numbered call that follows
// a ';' ("1. search(a); 2. search(b)"), and returns its offset, or -1.
func nextCallOnLine(m *meter, line string, from int) int {
	m.add(len(line) - from)
	for i := from; i < len(line); i++ {
		k := strings.IndexByte(line[i:], ';')
		if k < 0 {
			return -1
		}
		i += k
		j := i + 1
		for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
			j++
		}
		if _, _, ok := numberedLine(line[j:]); ok {
			return j
		}
	}
	return -1
}

// numberedLine recognises "1. search(…)", "2) math(…)", "**3.** join()"
// and returns the number and the offset of the call in line.
func numberedLine(line string) (id string, at int, ok bool) {
	i := 0
	for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '*') {
		i++
	}
	j := digitsEnd(line, i)
	if j == i || j-i > 6 || j >= len(line) {
		return "", 0, false
	}
	switch line[j] {
	case '.', ')', ':':
	default:
		return "", 0, false
	}
	id = strings.TrimLeft(line[i:j], "0")
	if id == "" {
		id = "0"
	}
	k := j + 1
	for k < len(line) && (line[k] == ' ' || line[k] == '\t' || line[k] == '*') {
		k++
	}
	e := identAt(line, k)
	if e == k || e >= len(line) || line[e] != '(' {
		return "", 0, false
	}
	return id, k, true
}

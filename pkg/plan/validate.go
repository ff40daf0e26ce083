package plan

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/dag"
)

// maxIDLen bounds node ids: they become NATS subject tokens.
const maxIDLen = 64

// validate checks a parsed plan against the rules of DESIGN §4 and the
// limits in o. It fills in default tools and canonical tool spellings.
func validate(m *meter, nodes []rawNode, o *Options, format Format) *Error {
	m.add(len(nodes))
	if len(nodes) == 0 {
		return errorf(ErrEmpty, "the plan has no nodes; write at least one step")
	}
	if len(nodes) > o.MaxNodes {
		return errorf(ErrTooManyNodes, "the plan has %d nodes; the limit is %d, so plan fewer steps at a time", len(nodes), o.MaxNodes)
	}
	at := func(e *Error, n rawNode) *Error {
		e.Node, e.Line = n.ID, n.line
		return e
	}
	seen := make(map[string]int, len(nodes))
	for i, n := range nodes {
		if n.ID == "" {
			e := errorf(ErrSyntax, "step %d has no id; give every step an id", i+1)
			e.Line = n.line
			return e
		}
		if !validID(n.ID) {
			return at(errorf(ErrSyntax, "node id %q is not allowed; use at most %d letters, digits, '_' and '-'", n.ID, maxIDLen), n)
		}
		if j, dup := seen[n.ID]; dup {
			return at(errorf(ErrDuplicateID, "node id %s is used by two nodes (steps %d and %d); give every node its own id", n.ID, j+1, i+1), n)
		}
		seen[n.ID] = i
	}
	ids := make([]string, len(nodes))
	deps := make(map[string][]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
		deps[n.ID] = n.Deps
		m.add(len(n.Deps))
		for _, d := range n.Deps {
			if _, ok := seen[d]; !ok {
				if r := rangeNodes(d, seen, o.MaxNodes); r != nil {
					return at(errorf(ErrUnknownDependency, "node %s depends on %s, which is not a node of the plan; a dependency names one node, not a range, so list each node it depends on: %s",
						n.ID, d, strings.Join(r, ", ")), n)
				}
				return at(errorf(ErrUnknownDependency, "node %s depends on %s, which is not a node of the plan", n.ID, d), n)
			}
		}
	}
	if c := dag.FindCycle(ids, deps); c != nil {
		e := at(errorf(ErrCycle, "plan has a cycle: %s; no node may depend on itself, directly or through others", strings.Join(c, " -> ")), nodes[seen[c[0]]])
		e.Cycle = c
		return e
	}
	if depth, _ := dag.Depth(ids, deps); depth > o.MaxDepth {
		// The error names the first node of the chain past the limit: the
		// one the planner has to move or drop.
		path, _ := dag.CriticalPath(ids, deps, nil)
		past := path[o.MaxDepth]
		return at(errorf(ErrTooDeep, "the plan's longest chain of dependencies has %d nodes (%s); the limit is %d, and node %s is past it, so run more steps in parallel or plan fewer at a time",
			depth, strings.Join(path, " -> "), o.MaxDepth, past), nodes[seen[past]])
	}
	for i := range nodes {
		n := &nodes[i]
		if n.Tool == "" {
			n.Tool = o.DefaultTool
		}
		// The default tool is held to the tools like any other: a node
		// left with a tool the rollout lacks would fail only when it runs.
		// A streamed plan's tasks still wait for their calls (Partial).
		if len(o.Tools) > 0 && !(o.Partial && n.Tool == o.DefaultTool) {
			canon, ok := knownTool(o.Tools, n.Tool)
			switch {
			case !ok && n.Tool == o.DefaultTool:
				return at(errorf(ErrUnknownTool, "node %s uses the tool %q (the default, for a step that names no tool), which is not one of the tools: %s; give it one of these tools",
					n.ID, n.Tool, strings.Join(o.Tools, ", ")), *n)
			case !ok:
				return at(errorf(ErrUnknownTool, "node %s uses the unknown tool %q; the tools are: %s", n.ID, n.Tool, strings.Join(o.Tools, ", ")), *n)
			}
			n.Tool = canon
		}
		for _, k := range sortedKeys(n.Args) {
			size := argSize(n.Args[k])
			m.add(size)
			if size > o.MaxArgBytes {
				return at(errorf(ErrArgumentTooLarge, "node %s: argument %q is %d bytes; the limit is %d", n.ID, k, size, o.MaxArgBytes), *n)
			}
		}
	}
	// Numbers are node names only in plans that name nodes by number; in
	// others "$100" or "x^{2}" is text.
	numbered := format == FormatNumbered
	for _, n := range nodes {
		numbered = numbered || isNumber(n.ID)
	}
	for _, n := range nodes {
		var bad *Error
		isDep := make(map[string]bool, len(n.Deps))
		for _, d := range n.Deps {
			isDep[d] = true
		}
		refs(m, n.Args, func(name, lit string) bool {
			_, isNode := seen[name]
			switch {
			case isDep[name] || !numbered && isNumber(name):
				return true
			case name == n.ID:
				bad = errorf(ErrBadPlaceholder, "node %s refers to its own output with %s; a node can only use the outputs of its dependencies", n.ID, lit)
			case isNode:
				bad = errorf(ErrBadPlaceholder, "node %s uses %s, but %s is not one of its dependencies; add %s to its dependencies or remove %s",
					n.ID, lit, name, name, lit)
			case len(n.Deps) == 0:
				bad = errorf(ErrBadPlaceholder, "node %s uses %s, but the plan has no node %s, and node %s has no dependencies; remove %s, or add the node it needs and depend on it",
					n.ID, lit, name, n.ID, lit)
			default:
				bad = errorf(ErrBadPlaceholder, "node %s uses %s, but the plan has no node %s; a placeholder can only name one of node %s's dependencies: %s",
					n.ID, lit, name, n.ID, strings.Join(n.Deps, ", "))
			}
			return false
		})
		if bad != nil {
			return at(bad, n)
		}
	}
	return nil
}

// rangeNodes reads a dependency that names no node as a range of nodes,
// "s1-3" or "s1-s3" (also with an en or em dash), and returns the nodes
// from the first to the last if every one of them is a node of the plan,
// or nil. Ids may hold '-' ("1-c1"), so a graph's or JSON plan's
// dependency is never read as a range; this only makes the error say what
// to write instead.
func rangeNodes(dep string, seen map[string]int, limit int) []string {
	if len(dep) > 2*maxIDLen+len("—") {
		return nil // longer than any range of ids
	}
	for _, sep := range []string{"-", "–", "—"} {
		for i := strings.Index(dep, sep); i >= 0; {
			left, right := dep[:i], dep[i+len(sep):]
			// The end is a number ("s1-3") or an id with the same prefix
			// ("s1-s3").
			a := digitsStart(left)
			end := strings.TrimPrefix(right, left[:a])
			from, ferr := strconv.Atoi(left[a:])
			to, terr := strconv.Atoi(end)
			if a < len(left) && isNumber(end) && ferr == nil && terr == nil && from < to && to-from < limit {
				var out []string
				for k := from; k <= to; k++ {
					id := left[:a] + strconv.Itoa(k)
					if _, ok := seen[id]; !ok {
						return nil
					}
					out = append(out, id)
				}
				return out
			}
			j := strings.Index(right, sep)
			if j < 0 {
				break
			}
			i += len(sep) + j
		}
	}
	return nil
}

// digitsStart returns where the digits that s ends with begin.
func digitsStart(s string) int {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	return i
}

// isNumber reports whether s is all ASCII digits.
func isNumber(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func validID(id string) bool {
	if len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// knownTool matches a tool name exactly, else ignoring case, and returns
// the configured spelling.
func knownTool(tools []string, name string) (string, bool) {
	for _, t := range tools {
		if t == name {
			return t, true
		}
	}
	for _, t := range tools {
		if strings.EqualFold(t, name) {
			return t, true
		}
	}
	return "", false
}

// argSize is the size of an argument value: its length for a string, its
// JSON encoding otherwise.
func argSize(v any) int {
	if s, ok := v.(string); ok {
		return len(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// refs calls fn with the name and literal text of every placeholder in the
// strings of v (maps in key order) until fn returns false. m, if not nil,
// is charged for the bytes examined.
func refs(m *meter, v any, fn func(name, lit string) bool) bool {
	switch v := v.(type) {
	case string:
		if m != nil {
			m.add(len(v))
		}
		for i := 0; i < len(v); i++ {
			if v[i] != '{' && v[i] != '$' {
				continue
			}
			name, n := placeholderAt(v, i)
			if n == 0 {
				continue
			}
			if !fn(name, v[i:i+n]) {
				return false
			}
			i += n - 1
		}
	case []any:
		for _, x := range v {
			if !refs(m, x, fn) {
				return false
			}
		}
	case map[string]any:
		for _, k := range sortedKeys(v) {
			if !refs(m, v[k], fn) {
				return false
			}
		}
	}
	return true
}

// dedupe removes repeated and empty ids, keeping the first occurrence.
func dedupe(ids []string) []string {
	out := ids[:0]
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if id != "" && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// describe shortens a fragment of output for an error message.
func describe(s string) string {
	return fmt.Sprintf("%q", shorten(s, 60))
}

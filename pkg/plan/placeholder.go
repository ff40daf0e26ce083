package plan

import (
	"maps"
	"slices"
	"strings"
)

// placeholderAt recognises a placeholder at s[i]: {s1}, {T1}, {step_1},
// {1}, ${1}, ${s1} or $1; ${…} also takes any node id ("${1-c1}"). It
// returns the name and the placeholder's length, or 0 if there is none.
func placeholderAt(s string, i int) (name string, n int) {
	switch {
	case s[i] == '{':
		j := i + 1
		if j < len(s) && s[j] >= '0' && s[j] <= '9' {
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
		} else {
			j = nameEnd(s, j)
		}
		if j > i+1 && j < len(s) && s[j] == '}' {
			return s[i+1 : j], j + 1 - i
		}
	case s[i] == '$' && i+1 < len(s) && s[i+1] == '{':
		j := nameEnd(s, i+2)
		if j == i+2 {
			// An id may start with a digit (numbered steps, and the
			// candidates made from them: "1-c1"): ${…} is unambiguous.
			j = idEnd(s, i+2)
		}
		if j > i+2 && j < len(s) && s[j] == '}' {
			return s[i+2 : j], j + 1 - i
		}
	case s[i] == '$':
		if j := digitsEnd(s, i+1); j > i+1 {
			return s[i+1 : j], j - i
		}
	}
	return "", 0
}

// idEnd returns the end of the node id chars (letters, digits, '_', '-')
// starting at s[i].
func idEnd(s string, i int) int {
	for i < len(s) && (s[i] == '_' || s[i] == '-' || '0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'z' || 'A' <= s[i] && s[i] <= 'Z') {
		i++
	}
	return i
}

func digitsEnd(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// nameEnd returns the end of a node name starting at s[i] (letters,
// digits, '_', '-', '.'; first a letter or '_'), or i.
func nameEnd(s string, i int) int {
	if i >= len(s) || !isIdentStart(s[i]) {
		return i
	}
	j := i + 1
	for j < len(s) && isIdent(s[j]) {
		j++
	}
	return j
}

// Placeholders returns the node names that s refers to, in order of first
// appearance: {s1}, {T1}, {step_1}, $1, ${1}.
func Placeholders(s string) []string {
	var out []string
	seen := map[string]bool{}
	for i := 0; i < len(s); i++ {
		if s[i] != '{' && s[i] != '$' {
			continue
		}
		name, n := placeholderAt(s, i)
		if n == 0 {
			continue
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
		i += n - 1
	}
	return out
}

// Placeholders returns the names that the node's arguments refer to, in
// order of first appearance (arguments in key order, recursively).
func (n Node) Placeholders() []string {
	var out []string
	seen := map[string]bool{}
	refs(nil, n.Args, func(name, _ string) bool {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
		return true
	})
	return out
}

// Substitute returns a copy of n in which every placeholder in every string
// argument (recursively in lists and maps) that names a key of outputs is
// replaced by that output. Other placeholders are left as they are.
func Substitute(n Node, outputs map[string]string) Node {
	out := n
	out.Args = substitute(n.Args, outputs).(map[string]any)
	out.Deps = append([]string(nil), n.Deps...)
	return out
}

func substitute(v any, outputs map[string]string) any {
	switch v := v.(type) {
	case string:
		return substituteString(v, outputs)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = substitute(x, outputs)
		}
		return out
	case map[string]any:
		if v == nil {
			return map[string]any(nil)
		}
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = substitute(x, outputs)
		}
		return out
	default:
		return v
	}
}

func substituteString(s string, outputs map[string]string) string {
	if !strings.ContainsAny(s, "{$") {
		return s
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '{' && s[i] != '$' {
			continue
		}
		name, n := placeholderAt(s, i)
		if n == 0 {
			continue
		}
		if val, ok := outputs[name]; ok {
			b.WriteString(s[last:i])
			b.WriteString(val)
			last = i + n
		}
		i += n - 1
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

package plan

import (
	"errors"
	"testing"
)

// TestTooDeepNamesNode: a plan deeper than the limit names the first node
// of its longest chain past the limit, with that node's line.
func TestTooDeepNamesNode(t *testing.T) {
	for _, c := range []struct {
		in   string
		node string
		line int
	}{
		{"1. search(\"a\")\n2. search(\"$1\")\n3. search(\"$2\")\n4. search(\"$3\")", "3", 3},
		{"<graph>\n<node id=\"s1\">search(\"a\")</node>\n<node id=\"s2\">search(\"b\")</node>\n" +
			"<node id=\"s3\" depends=\"s2\">search(\"{s2}\")</node>\n<node id=\"s4\" depends=\"s1,s3\">search(\"{s1} {s3}\")</node>\n</graph>", "s4", 5},
	} {
		_, err := Parse(c.in, Options{Tools: []string{"search"}, MaxDepth: 2})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrTooDeep || pe.Node != c.node || pe.Line != c.line {
			t.Errorf("Parse(%q) = %#v; want too_deep at node %s, line %d", c.in, err, c.node, c.line)
		}
	}
}

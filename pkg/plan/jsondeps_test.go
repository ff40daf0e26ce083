package plan

import (
	"errors"
	"testing"
)

// TestJSONDependencyNotAnID: a JSON node's dependency that is not a node
// id (an object, a list, a boolean) is a syntax error naming the node and
// the dependency, never dropped: the node would run without waiting for
// what it needs. Null and "" say nothing and are dropped.
func TestJSONDependencyNotAnID(t *testing.T) {
	const t1 = `{"id":"T1","tool":"search","args":{"query":"a"}}`
	for _, c := range []struct {
		deps string
		want string
	}{
		{`[{"id":"T1"}]`, `node T2: the dependency {"id":"T1"} in "depends_on" is not a node id; write the ids of the nodes it depends on, as in "depends_on": ["T1", "T2"]`},
		{`[["T1"]]`, `node T2: the dependency ["T1"] in "depends_on" is not a node id; write the ids of the nodes it depends on, as in "depends_on": ["T1", "T2"]`},
		{`["T1", true]`, `node T2: the dependency true in "depends_on" is not a node id; write the ids of the nodes it depends on, as in "depends_on": ["T1", "T2"]`},
		{`{"T1": true}`, `node T2: the dependency {"T1":true} in "depends_on" is not a node id; write the ids of the nodes it depends on, as in "depends_on": ["T1", "T2"]`},
	} {
		in := `{"nodes":[` + t1 + `,{"id":"T2","tool":"search","args":{"query":"b"},"depends_on":` + c.deps + `}]}`
		r, err := Parse(in, Options{Tools: []string{"search"}})
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != ErrSyntax || pe.Node != "T2" || pe.Line != 1 || pe.Message != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want a syntax error about T2: %s", in, r.Plan, err, c.want)
		}
	}
	for _, c := range []struct{ deps, want string }{
		{`["T1", null, ""]`, "T1 search(a) <- ; T2 search(b) <- T1"},
		{`null`, "T1 search(a) <- ; T2 search(b) <- "},
		{`"T1"`, "T1 search(a) <- ; T2 search(b) <- T1"},
	} {
		in := `{"nodes":[` + t1 + `,{"id":"T2","tool":"search","args":{"query":"b"},"depends_on":` + c.deps + `}]}`
		r, err := Parse(in, Options{Tools: []string{"search"}})
		if err != nil || planString(r.Plan) != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %s", in, r.Plan, err, c.want)
		}
	}
	// An empty id is not an id of the wrong type.
	in := `{"nodes":[` + t1 + `,{"id":" ","tool":"search","args":{"query":"b"}}]}`
	const want = "step 2 of the JSON plan has an empty id; give every step an id"
	_, err := Parse(in, Options{Tools: []string{"search"}})
	var pe *Error
	if !errors.As(err, &pe) || pe.Message != want {
		t.Errorf("Parse(%q): %v, want %s", in, err, want)
	}
}

package plan

import (
	"reflect"
	"strings"
	"testing"
)

func TestInput(t *testing.T) {
	tests := []struct {
		args map[string]any
		want string
	}{
		{nil, ""},
		{map[string]any{"input": "a", "query": "b"}, "a"},
		{map[string]any{"query": "b", "prompt": "c"}, "b"},
		{map[string]any{"prompt": "c", "question": "d"}, "c"},
		{map[string]any{"question": "d", "expression": "e"}, "d"},
		{map[string]any{"expression": "e", "a": "f"}, "e"},
		{map[string]any{"zeta": "z", "alpha": "a", "beta": 3.0}, "a"},
		{map[string]any{"input": 3.0, "b": "x"}, "x"},
		{map[string]any{"n": 1.0}, ""},
	}
	for _, tt := range tests {
		if got := (Node{Args: tt.args}).Input(); got != tt.want {
			t.Errorf("Input(%v) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"no refs, $ alone, {} and { s1 }", nil},
		{"population of {s1}", []string{"s1"}},
		{"{T1} and {T2} and {T1}", []string{"T1", "T2"}},
		{"$1 ${2} {3} {step_1} ${s4}", []string{"1", "2", "3", "step_1", "s4"}},
		{"costs $100", []string{"100"}},
		{"{{s1}} {s1", []string{"s1"}},
		{"${", nil},
	}
	for _, tt := range tests {
		if got := Placeholders(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Placeholders(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	n := Node{ID: "s3", Tool: "math", Deps: []string{"s1", "2"}, Args: map[string]any{
		"input":   "compare {s1} with $2 and ${2}; keep {s9} and $x",
		"context": []any{"$2", map[string]any{"k": "{s1}!"}, 7.0},
		"n":       1.0,
	}}
	out := map[string]string{"s1": "Paris", "2": "2.1M"}
	got := Substitute(n, out)
	want := map[string]any{
		"input":   "compare Paris with 2.1M and 2.1M; keep {s9} and $x",
		"context": []any{"2.1M", map[string]any{"k": "Paris!"}, 7.0},
		"n":       1.0,
	}
	if !reflect.DeepEqual(got.Args, want) {
		t.Errorf("Substitute = %#v\nwant %#v", got.Args, want)
	}
	// The original is untouched.
	if n.Args["input"] != "compare {s1} with $2 and ${2}; keep {s9} and $x" || n.Args["context"].([]any)[0] != "$2" {
		t.Errorf("Substitute changed its input: %#v", n.Args)
	}
	if got.ID != "s3" || got.Tool != "math" || !reflect.DeepEqual(got.Deps, n.Deps) {
		t.Errorf("Substitute changed the node: %+v", got)
	}
	if s := Substitute(Node{}, out); s.Args != nil {
		t.Errorf("Substitute(empty) args = %#v", s.Args)
	}
}

func diamond(t *testing.T) *Plan {
	t.Helper()
	r, err := Parse(`<graph>
<node id="s1">search("capital of France")</node>
<node id="s2" depends="s1">search("population of {s1}")</node>
<node id="s3" depends="s1">search("area of {s1}")</node>
<node id="s4" depends="s2,s3">math("{s2} / {s3}")</node>
</graph>`, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Plan
}

func TestPlanLevelsAndCriticalPath(t *testing.T) {
	p := diamond(t)
	if got, want := p.Levels(), [][]string{{"s1"}, {"s2", "s3"}, {"s4"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Levels = %v, want %v", got, want)
	}
	path, total := p.CriticalPath(nil)
	if !reflect.DeepEqual(path, []string{"s1", "s2", "s4"}) || total != 3 {
		t.Errorf("CriticalPath(nil) = %v, %v", path, total)
	}
	path, total = p.CriticalPath(func(n Node) float64 {
		if strings.HasPrefix(n.Input(), "area") {
			return 10
		}
		return 1
	})
	if !reflect.DeepEqual(path, []string{"s1", "s3", "s4"}) || total != 12 {
		t.Errorf("CriticalPath(cost) = %v, %v", path, total)
	}
}

func TestDOT(t *testing.T) {
	got := diamond(t).DOT()
	for _, want := range []string{
		"digraph plan {",
		`"s1" [label="s1: search\ncapital of France"];`,
		`"s4" [label="s4: math\n{s2} / {s3}"];`,
		`"s1" -> "s2";`,
		`"s3" -> "s4";`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("DOT lacks %q:\n%s", want, got)
		}
	}
	p := &Plan{Nodes: []Node{{ID: "a", Tool: "x", Args: map[string]any{"input": `say "hi" \ ` + strings.Repeat("long ", 30)}}}}
	if dot := p.DOT(); !strings.Contains(dot, `say \"hi\" \\ long`) || !strings.Contains(dot, "…") {
		t.Errorf("DOT escaping:\n%s", dot)
	}
}

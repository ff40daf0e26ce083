package dag

import (
	"errors"
	"reflect"
	"testing"
)

type graph struct {
	ids  []string
	deps map[string][]string
}

var (
	empty   = graph{}
	single  = graph{[]string{"a"}, nil}
	chain   = graph{[]string{"a", "b", "c"}, map[string][]string{"b": {"a"}, "c": {"b"}}}
	diamond = graph{[]string{"s1", "s2", "s3", "s4"}, map[string][]string{
		"s2": {"s1"}, "s3": {"s1"}, "s4": {"s2", "s3"}}}
	// parallel roots, a join, and a long side chain.
	wide = graph{[]string{"x", "y", "z", "j", "p", "q"}, map[string][]string{
		"j": {"x", "y", "z"}, "p": {"x"}, "q": {"p"}}}
	unordered = graph{[]string{"c", "b", "a"}, map[string][]string{"c": {"b"}, "b": {"a"}}}
	selfLoop  = graph{[]string{"a", "b"}, map[string][]string{"b": {"b"}}}
	cycle3    = graph{[]string{"s1", "s2", "s3"}, map[string][]string{
		"s1": {"s3"}, "s2": {"s1"}, "s3": {"s2"}}}
	cycleTail = graph{[]string{"a", "b", "c", "d"}, map[string][]string{
		"b": {"a", "d"}, "c": {"b"}, "d": {"c"}}}
	unknown = graph{[]string{"a", "b"}, map[string][]string{"b": {"a", "zz"}}}
	dupDeps = graph{[]string{"a", "b"}, map[string][]string{"b": {"a", "a"}}}
)

func TestLevels(t *testing.T) {
	tests := []struct {
		name    string
		g       graph
		want    [][]string
		wantErr error
	}{
		{"empty", empty, nil, nil},
		{"single", single, [][]string{{"a"}}, nil},
		{"chain", chain, [][]string{{"a"}, {"b"}, {"c"}}, nil},
		{"diamond", diamond, [][]string{{"s1"}, {"s2", "s3"}, {"s4"}}, nil},
		{"wide", wide, [][]string{{"x", "y", "z"}, {"j", "p"}, {"q"}}, nil},
		{"unordered", unordered, [][]string{{"a"}, {"b"}, {"c"}}, nil},
		{"duplicate deps", dupDeps, [][]string{{"a"}, {"b"}}, nil},
		{"self loop", selfLoop, nil, &CycleError{Cycle: []string{"b", "b"}}},
		{"cycle", cycle3, nil, &CycleError{Cycle: []string{"s1", "s2", "s3", "s1"}}},
		{"cycle with tail", cycleTail, nil, &CycleError{Cycle: []string{"b", "c", "d", "b"}}},
		{"unknown", unknown, nil, &UnknownError{ID: "b", Dep: "zz"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Levels(tt.g.ids, tt.g.deps)
			if !reflect.DeepEqual(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Levels = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFindCycle(t *testing.T) {
	tests := []struct {
		name string
		g    graph
		want []string
	}{
		{"empty", empty, nil},
		{"diamond", diamond, nil},
		{"wide", wide, nil},
		{"unknown deps ignored", unknown, nil},
		{"self loop", selfLoop, []string{"b", "b"}},
		{"three", cycle3, []string{"s1", "s2", "s3", "s1"}},
		{"tail", cycleTail, []string{"b", "c", "d", "b"}},
		{"two", graph{[]string{"a", "b"}, map[string][]string{"a": {"b"}, "b": {"a"}}}, []string{"a", "b", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FindCycle(tt.g.ids, tt.g.deps); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FindCycle = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDepth(t *testing.T) {
	tests := []struct {
		name    string
		g       graph
		want    int
		wantErr bool
	}{
		{"empty", empty, 0, false},
		{"single", single, 1, false},
		{"chain", chain, 3, false},
		{"diamond", diamond, 3, false},
		{"wide", wide, 3, false},
		{"cycle", cycle3, 0, true},
		{"unknown", unknown, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Depth(tt.g.ids, tt.g.deps)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("Depth = %d, %v; want %d, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestCriticalPath(t *testing.T) {
	costs := map[string]float64{"s1": 1, "s2": 5, "s3": 2, "s4": 1, "x": 10, "y": 1, "z": 1, "j": 1, "p": 1, "q": 1}
	byMap := func(id string) float64 { return costs[id] }
	tests := []struct {
		name      string
		g         graph
		cost      func(string) float64
		wantPath  []string
		wantTotal float64
	}{
		{"empty", empty, nil, nil, 0},
		{"single", single, nil, []string{"a"}, 1},
		{"chain", chain, nil, []string{"a", "b", "c"}, 3},
		{"diamond by count takes first branch", diamond, nil, []string{"s1", "s2", "s4"}, 3},
		{"diamond by cost", diamond, byMap, []string{"s1", "s2", "s4"}, 7},
		{"diamond by cost other branch", diamond, func(id string) float64 {
			if id == "s3" {
				return 9
			}
			return 1
		}, []string{"s1", "s3", "s4"}, 11},
		{"wide by count", wide, nil, []string{"x", "p", "q"}, 3},
		{"wide by cost", wide, byMap, []string{"x", "p", "q"}, 12},
		{"wide by cost through join", wide, func(id string) float64 {
			if id == "z" {
				return 20
			}
			return 1
		}, []string{"z", "j"}, 21},
		{"cycle", cycle3, nil, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, total := CriticalPath(tt.g.ids, tt.g.deps, tt.cost)
			if !reflect.DeepEqual(path, tt.wantPath) || total != tt.wantTotal {
				t.Errorf("CriticalPath = %v, %v; want %v, %v", path, total, tt.wantPath, tt.wantTotal)
			}
		})
	}
}

func TestErrorsAs(t *testing.T) {
	_, err := Levels(cycle3.ids, cycle3.deps)
	var ce *CycleError
	if !errors.As(err, &ce) || ce.Error() != "cycle: s1 -> s2 -> s3 -> s1" {
		t.Fatalf("err = %v", err)
	}
	_, err = Levels(unknown.ids, unknown.deps)
	var ue *UnknownError
	if !errors.As(err, &ue) || ue.Error() != "b depends on unknown zz" {
		t.Fatalf("err = %v", err)
	}
}

func TestLargeChainNoRecursion(t *testing.T) {
	const n = 200000
	ids := make([]string, n)
	deps := make(map[string][]string, n)
	for i := range ids {
		ids[i] = string(rune('a'+i%26)) + itoa(i)
		if i > 0 {
			deps[ids[i]] = []string{ids[i-1]}
		}
	}
	deps[ids[0]] = []string{ids[n-1]}
	if c := FindCycle(ids, deps); len(c) != n+1 || c[0] != ids[0] {
		t.Fatalf("cycle length %d", len(c))
	}
	deps[ids[0]] = nil
	if d, err := Depth(ids, deps); err != nil || d != n {
		t.Fatalf("Depth = %d, %v", d, err)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

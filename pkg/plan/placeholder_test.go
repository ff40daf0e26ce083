package plan

import (
	"reflect"
	"testing"
)

// TestPlaceholderAnyID: ${id} names any valid node id, one that starts
// with a digit too ("1-c1", an ensemble candidate of numbered step 1), and
// is filled like any other placeholder.
func TestPlaceholderAnyID(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"${1-c1} ${1-c2}_ ${12_b}", []string{"1-c1", "1-c2", "12_b"}},
		{"${s1} ${1} $2 {T3}", []string{"s1", "1", "2", "T3"}},
		{"{1-c1}", nil}, // braces alone take a number or a name: "{1st}" is text
		{"${1-c1", nil},
	} {
		if got := Placeholders(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Placeholders(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	n := Node{ID: "1", Tool: "vote", Args: map[string]any{"candidates": []any{"${1-c1}", "${1-c2}", "${1-c3}"}}}
	got := Substitute(n, map[string]string{"1-c1": "Paris", "1-c2": "Lyon", "1-c3": "paris"}).Args["candidates"]
	if want := []any{"Paris", "Lyon", "paris"}; !reflect.DeepEqual(got, want) {
		t.Errorf("filled %q, want %q", got, want)
	}
}

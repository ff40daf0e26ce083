package engine

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// slowLogprobs is the reading the fast path must agree with.
func slowLogprobs(t *testing.T, b string) ([]float64, []int, int) {
	t.Helper()
	var triples [][]any
	if err := json.Unmarshal([]byte(b), &triples); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var lps []float64
	var ids []int
	missing := 0
	for _, tr := range triples {
		lp, ok := tr[0].(float64)
		if !ok {
			missing++
		}
		lps, ids = append(lps, lp), append(ids, int(tr[1].(float64)))
	}
	return lps, ids, missing
}

func TestLogprobList(t *testing.T) {
	cases := []string{
		`[]`,
		`[[-0.5, 12, "a"]]`,
		`[[null, 3, null], [-1e-5, 4, "\"]["], [0, 5, "\\"], [-2.5E+1,6,"x"]]`,
		" [ [ -0.25 , 7 , \"\\u005d\" ] , [ -1 , 8 ] ] ",
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		var parts []string
		for range r.IntN(40) {
			text := []string{`null`, `"tok"`, `"]"`, `"a\"b"`, `"\\"`, `" , ["`}[r.IntN(6)]
			lp := fmt.Sprint(-r.Float64() * 10)
			if r.IntN(10) == 0 {
				lp = "null"
			}
			parts = append(parts, fmt.Sprintf("[%s,%d,%s]", lp, r.IntN(150000), text))
		}
		cases = append(cases, "["+strings.Join(parts, ",")+"]")
	}
	for _, c := range cases {
		var l logprobList
		if err := json.Unmarshal([]byte(c), &l); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		lps, ids, missing := slowLogprobs(t, c)
		if !slices.Equal(l.ids, ids) || !slices.Equal(l.logprobs, lps) || l.missing != missing {
			t.Errorf("%s:\n got %v %v (%d missing)\nwant %v %v (%d missing)", c, l.logprobs, l.ids, l.missing, lps, ids, missing)
		}
		if _, _, _, ok := scanLogprobs([]byte(c)); !ok {
			t.Errorf("%s: the fast path did not take the usual shape", c)
		}
	}
	// An unusual shape still reads, through encoding/json.
	var l logprobList
	if err := json.Unmarshal([]byte(`[[-0.5, 12, {"text": "a"}]]`), &l); err != nil || !slices.Equal(l.ids, []int{12}) || l.missing != 0 {
		t.Errorf("unusual shape: %v %v", l.ids, err)
	}
	if err := json.Unmarshal([]byte(`[[null, 12, {"text": "a"}], [-1, 13, {}]]`), &l); err != nil || !slices.Equal(l.ids, []int{12, 13}) || l.missing != 1 {
		t.Errorf("unusual shape with a null log-prob: %v, %d missing, %v", l.ids, l.missing, err)
	}
	if err := json.Unmarshal([]byte(`[[-0.5, "x", "a"]]`), &l); err == nil {
		t.Error("a token id that is not a number reads")
	}
}

package plannergateway

import (
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// TestContextFull: a turn with no room to generate says which limit, and
// what did not fit.
func TestContextFull(t *testing.T) {
	seg := func(kind string, n int) schema.Segment { return schema.Segment{Kind: kind, IDs: make([]int, n)} }
	prompt := seg(schema.SegPrompt, 10)
	gen := seg(schema.SegGenerated, 4)
	for _, tc := range []struct {
		max  int
		turn int
		segs []schema.Segment
		want string
	}{
		{8, 1, []schema.Segment{prompt}, "the prompt is 10 tokens, more than max_context_tokens 8: nothing was generated"},
		{10, 1, []schema.Segment{prompt}, "the prompt is 10 tokens, all of max_context_tokens 10: nothing was generated"},
		{16, 2, []schema.Segment{prompt, gen, seg(schema.SegObservation, 3)}, "max_context_tokens 16: the trajectory holds 14 tokens before turn 2, and its observation (3 tokens) does not fit: it is left out"},
		{17, 2, []schema.Segment{prompt, gen, seg(schema.SegObservation, 3)}, "max_context_tokens 17: the trajectory holds 17 tokens before turn 2: no room to generate"},
		// The planner's first turn is turn 2 (the actor went first): its
		// prompt is no trajectory held before it, and one that does not
		// fit is said so, whatever the observation after it.
		{8, 2, []schema.Segment{{Kind: schema.SegPrompt, Turn: 2, IDs: make([]int, 10)}, {Kind: schema.SegObservation, Turn: 2, IDs: make([]int, 3)}},
			"the prompt is 10 tokens, more than max_context_tokens 8: its observation (3 tokens) is left out, and nothing was generated"},
		{12, 2, []schema.Segment{{Kind: schema.SegPrompt, Turn: 2, IDs: make([]int, 10)}, {Kind: schema.SegObservation, Turn: 2, IDs: make([]int, 3)}},
			"max_context_tokens 12: the prompt is 10 tokens, and its observation (3 tokens) does not fit: it is left out"},
	} {
		if got := contextFull(tc.max, tc.turn, tc.segs); !strings.HasPrefix(got, tc.want) {
			t.Errorf("contextFull(%d, turn %d) = %q, want %q", tc.max, tc.turn, got, tc.want)
		}
	}
}

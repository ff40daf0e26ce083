package mode_test

import (
	"context"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// TestPeerReviewEmpty: an empty review, or an attempt whose answer is
// empty, is never taken for an answer: the review is a parse error naming
// its turn, and an empty attempt is no answer to accept or to end with.
func TestPeerReviewEmpty(t *testing.T) {
	m := mode.PeerReview{}
	cfg := schema.Config{Mode: schema.ModePeerReview}.WithDefaults() // max_turns 4
	attempt := func(output string) string {
		return m.Observation(&schema.Run{Nodes: []*schema.NodeState{{Node: plan.Node{ID: "attempt"}, Status: schema.NodeDone, Output: output}}}, schema.Config{})
	}
	obs := attempt("Addis Ababa")
	parse := func(turn int, text, observation string) schema.Message {
		t.Helper()
		msg, err := m.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Episode: 2, Turn: turn, Text: text, FinishReason: "stop"}, observation, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}

	for _, review := range []string{"", " \n\t", "<think>The answer looks right.</think>\n"} {
		pe, ok := parse(3, review, obs).(*schema.PlanError)
		if !ok || pe.ErrorKind != string(plan.ErrEmpty) || !strings.Contains(pe.Message, "turn 3") || !strings.Contains(pe.Message, "review is empty") {
			t.Errorf("review %q: %#v, want an error of kind empty naming turn 3 and the empty review", review, parse(3, review, obs))
		}
	}

	// The attempt is empty: as the observation shows it now, and as it was
	// shown before ("Answer: " and nothing).
	for name, empty := range map[string]string{"blank": attempt(" \n "), "none": attempt(""), "recorded": "\n<observation>\nAnswer: \n</observation>\n"} {
		if strings.Contains(empty, "Answer:") && name != "recorded" {
			t.Errorf("%s: the observation shows an empty answer as one: %q", name, empty)
		}
		pe, ok := parse(3, "<accept/>", empty).(*schema.PlanError)
		if !ok || !strings.Contains(pe.Message, "turn 3") || !strings.Contains(pe.Message, "attempt reviewed is empty") {
			t.Errorf("%s: accept: %#v, want an error naming turn 3 and the empty attempt", name, parse(3, "<accept/>", empty))
		}
		// At max_turns a critique of an empty attempt does not end the
		// episode with it: the actor is asked again, with no previous answer.
		d, ok := parse(4, "<revise>say something</revise>", empty).(*schema.PlanDAG)
		if !ok || len(d.Plan.Nodes) != 1 || d.Plan.Nodes[0].Args["previous"] != nil {
			t.Errorf("%s: revise at max_turns: %#v, want a revision with no previous answer", name, parse(4, "<revise>say something</revise>", empty))
		}
		// The empty attempt is the one reviewed: Observed does not walk
		// back past it to an earlier answer.
		segs := []schema.Segment{{Kind: schema.SegObservation, Text: obs}, {Kind: schema.SegObservation, Text: empty}}
		if got := mode.Observed(m, segs); got != empty {
			t.Errorf("%s: Observed = %q, want the empty attempt %q", name, got, empty)
		}
	}
}

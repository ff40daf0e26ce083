package plannergateway

import (
	"reflect"
	"testing"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/schema"
)

// TestMessages: a chat engine sees the episode as a conversation: the
// prompt and the observations are the user's turns, generations the
// assistant's, each with the ids the trajectory holds for it.
func TestMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		segs []schema.Segment
		want []engine.Message
	}{
		{"turn 1", []schema.Segment{{Kind: schema.SegPrompt, Text: "P", IDs: []int{1}}},
			[]engine.Message{{Role: engine.RoleUser, Text: "P", IDs: []int{1}}}},
		{"turn 2", []schema.Segment{
			{Kind: schema.SegPrompt, Text: "P", IDs: []int{1}},
			{Kind: schema.SegGenerated, Text: "G", IDs: []int{2, 3}, LogProbs: []float64{-1, -2}},
			{Kind: schema.SegObservation, Text: "O", IDs: []int{4}},
		}, []engine.Message{
			{Role: engine.RoleUser, Text: "P", IDs: []int{1}},
			{Role: engine.RoleAssistant, Text: "G", IDs: []int{2, 3}},
			{Role: engine.RoleUser, Text: "O", IDs: []int{4}},
		}},
	} {
		if got := messages(tc.segs); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: messages = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

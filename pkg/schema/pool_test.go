package schema

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// Decoders come from a pool: what one decode gave must not change when the
// decoder is used again, by this goroutine or another.
func TestUnmarshalKeepsNothingOfThePool(t *testing.T) {
	body := func(i int) []byte {
		b, err := Marshal(&PlanOutput{Rollout: int64(i), Episode: i, Turn: 1, Text: fmt.Sprintf("plan %d %s", i, string(rune('a'+i%26))),
			Segments: []Segment{{Kind: SegPrompt, Turn: 1, Text: fmt.Sprint("prompt ", i), IDs: []int{i, i + 1, i + 2}}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var kept []PlanOutput
			for i := g * 100; i < g*100+100; i++ {
				var m PlanOutput
				if err := Unmarshal(body(i), &m); err != nil {
					t.Error(err)
					return
				}
				kept = append(kept, m)
			}
			for j, m := range kept {
				i := g*100 + j
				if m.Text != fmt.Sprintf("plan %d %s", i, string(rune('a'+i%26))) || m.Segments[0].Text != fmt.Sprint("prompt ", i) ||
					!slices.Equal(m.Segments[0].IDs, []int{i, i + 1, i + 2}) {
					t.Errorf("message %d changed after later decodes: %+v", i, m)
				}
			}
		}()
	}
	wg.Wait()
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/sim"
)

// TestTokenDrift: an engine that takes another input than planact sent, and
// says so, is caught on the request where it does, for good, with where:
// SGLang's prompt_tokens count (one more than sent: position unknown),
// vLLM's prompt_token_ids (a BOS first: position 0), a chat server whose
// rendering of the conversation no longer begins with the trajectory (at
// the end of the first user turn). The requests before drift pass, and an
// engine that reports the input it was sent passes.
func TestTokenDrift(t *testing.T) {
	ids := sim.Encode(actorPrompt)
	for _, c := range []struct {
		proto string
		at    int
		ev    string
	}{
		{ProtocolSGLang, -1, "prompt_tokens"},
		{ProtocolOpenAI, 0, "prompt_token_ids"},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", c.proto, stream), func(t *testing.T) {
				_, url := serveSim(t, sim.Config{Role: sim.RoleActor, DriftFrom: 2})
				cl, _ := New(c.proto, url, "sim-actor", nil)
				r := Request{InputIDs: ids, Text: actorPrompt, RoutingKey: "7-0"}
				if _, err := generate(cl, r, stream); err != nil {
					t.Fatalf("request 1: %v", err)
				}
				_, err := generate(cl, r, stream)
				var d *DriftError
				if !errors.As(err, &d) || !errors.Is(err, ErrTokenDrift) || fail.KindOf(err) != fail.Permanent {
					t.Fatalf("request 2: %v (kind %v), want a permanent DriftError", err, fail.KindOf(err))
				}
				if d.At != c.at || d.Sent != len(ids) || d.Consumed != len(ids)+1 || d.Evidence != c.ev {
					t.Errorf("drift %+v, want at %d, %d sent, %d consumed, by %s", *d, c.at, len(ids), len(ids)+1, c.ev)
				}
				// Another episode's first request: no drift.
				r.RoutingKey = "7-1"
				if _, err := generate(cl, r, stream); err != nil {
					t.Errorf("another episode: %v", err)
				}
			})
		}
	}
	t.Run("openai-chat", func(t *testing.T) {
		_, url := serveSim(t, sim.Config{Role: sim.RolePlanner, Seed: 4, DriftFrom: 2})
		c, _ := New(ProtocolOpenAIChat, url, "sim-planner", nil)
		prompt := plannerPrompt(t)
		r1 := Request{Messages: []Message{{Role: RoleUser, Text: prompt}}, RoutingKey: "7-0"}
		g1, err := c.Generate(context.Background(), r1)
		if err != nil {
			t.Fatalf("turn 1: %v", err)
		}
		first := TrajectoryIDs(r1, g1, nil)
		_, err = c.Generate(context.Background(), Request{RoutingKey: "7-0", Messages: []Message{
			{Role: RoleUser, Text: prompt, IDs: first},
			{Role: RoleAssistant, Text: g1.Text, IDs: g1.OutputIDs},
			{Role: RoleUser, Text: "\n<observation>\n</observation>\n"},
		}})
		var d *DriftError
		if !errors.As(err, &d) || fail.KindOf(err) != fail.Permanent {
			t.Fatalf("turn 2: %v, want a permanent DriftError", err)
		}
		// The first user turn's EOS, last of its ids, is where it differs.
		if d.At != len(first)-len(sim.Encode("<|assistant|>\n"))-1 || d.Sent != len(first)+len(g1.OutputIDs) {
			t.Errorf("drift %+v: want at %d of %d", *d, len(first)-len(sim.Encode("<|assistant|>\n"))-1, len(first)+len(g1.OutputIDs))
		}
	})
}

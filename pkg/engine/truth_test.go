package engine

// What an engine did not return is absent or an error, never a zero: tests
// against the simulated engines told to leave fields out, and against
// replies written by hand.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/sim"
)

// generate runs r on c, streamed or not.
func generate(c Client, r Request, stream bool) (Generation, error) {
	if stream {
		return c.(Streamer).GenerateStream(context.Background(), r, nil)
	}
	return c.Generate(context.Background(), r)
}

// TestCompletionsWithoutTokenIDs: a /v1/completions server that returns
// neither token_ids nor "token_id:<id>" log-prob tokens is refused for
// good, and the error names the options that return ids.
func TestCompletionsWithoutTokenIDs(t *testing.T) {
	_, url := serveSim(t, sim.Config{Role: sim.RoleActor, Omit: sim.Omit{TokenIDs: true}})
	c, _ := New(ProtocolOpenAI, url, "sim-actor", nil)
	for _, stream := range []bool{false, true} {
		g, err := generate(c, Request{InputIDs: sim.Encode(actorPrompt), Text: actorPrompt}, stream)
		if err == nil || fail.KindOf(err) != fail.Permanent ||
			!strings.Contains(err.Error(), "return_token_ids") || !strings.Contains(err.Error(), "return_tokens_as_token_ids") {
			t.Errorf("stream %v: %+v, %v; want a permanent error naming return_token_ids and return_tokens_as_token_ids", stream, g, err)
		}
	}
}

// TestLogProbsAbsentNotZero: a reply without log-probs, or with a null
// among them, gives a generation with its exact ids, no log-probs at all,
// and the reason; never zeros.
func TestLogProbsAbsentNotZero(t *testing.T) {
	want := append(sim.Encode("Paris"), sim.EOSID)
	for _, proto := range []string{ProtocolSGLang, ProtocolOpenAI} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", proto, stream), func(t *testing.T) {
				_, url := serveSim(t, sim.Config{Role: sim.RoleActor, Omit: sim.Omit{LogProbs: true}})
				c, _ := New(proto, url, "sim-actor", nil)
				g, err := generate(c, Request{InputIDs: sim.Encode(actorPrompt), Text: actorPrompt}, stream)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(g.OutputIDs, want) || g.LogProbs != nil || !strings.Contains(g.LogProbsMissing, "log") {
					t.Errorf("ids %v, log-probs %v, missing %q; want %v, none, and why", g.OutputIDs, g.LogProbs, g.LogProbsMissing, want)
				}
			})
		}
	}
	for _, tc := range []struct {
		name, proto, reply, why string
	}{
		{"sglang null", ProtocolSGLang, `{"text":"ab","output_ids":[5,6],"meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":2,` +
			`"output_token_logprobs":[[null,5,null],[-0.5,6,null]]}}`, "1 of 2"},
		{"openai null", ProtocolOpenAI, `{"choices":[{"text":"ab","finish_reason":"stop","token_ids":[5,6],` +
			`"logprobs":{"tokens":["token_id:5","token_id:6"],"token_logprobs":[-0.5,null]}}]}`, "1 of 2"},
		{"openai none", ProtocolOpenAI, `{"choices":[{"text":"ab","finish_reason":"stop","token_ids":[5,6],"logprobs":null}]}`, "no log-probs"},
		{"openai some", ProtocolOpenAI, `{"choices":[{"text":"ab","finish_reason":"stop","token_ids":[5,6],` +
			`"logprobs":{"tokens":["a"],"token_logprobs":[-0.5]}}]}`, "log-probs for 1 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.reply) }))
			defer srv.Close()
			c, _ := New(tc.proto, srv.URL, "m", nil)
			g, err := c.Generate(context.Background(), Request{InputIDs: []int{1, 2}})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(g.OutputIDs, []int{5, 6}) || g.LogProbs != nil || !strings.Contains(g.LogProbsMissing, tc.why) {
				t.Errorf("ids %v, log-probs %v, missing %q; want [5 6], none, and %q", g.OutputIDs, g.LogProbs, g.LogProbsMissing, tc.why)
			}
		})
	}
}

// TestTextWithoutIDs: an SGLang reply with text but neither output_ids nor
// output_token_logprobs cannot be made token-exact: refused for good.
func TestTextWithoutIDs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"text":"Paris","meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":2}}`)
	}))
	defer srv.Close()
	c, _ := New(ProtocolSGLang, srv.URL, "", nil)
	g, err := c.Generate(context.Background(), Request{InputIDs: []int{1, 2}})
	if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "output ids") {
		t.Errorf("%+v, %v; want a permanent error: no output ids", g, err)
	}
}

// TestPromptCut: an engine that took fewer prompt tokens than it was sent
// (it cut the prompt to its context length) is refused for good: what it
// generated from is not the trajectory. A prompt it took whole is fine.
func TestPromptCut(t *testing.T) {
	ids := sim.Encode(actorPrompt)
	for _, proto := range []string{ProtocolSGLang, ProtocolOpenAI} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", proto, stream), func(t *testing.T) {
				_, url := serveSim(t, sim.Config{Role: sim.RoleActor, ContextLength: len(ids) - 1})
				c, _ := New(proto, url, "sim-actor", nil)
				g, err := generate(c, Request{InputIDs: ids, Text: actorPrompt}, stream)
				if !errors.Is(err, ErrPromptCut) || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), fmt.Sprintf("%d of the %d", len(ids)-1, len(ids))) {
					t.Errorf("%+v, %v; want ErrPromptCut, for good, with the counts", g, err)
				}
				_, whole := serveSim(t, sim.Config{Role: sim.RoleActor, ContextLength: len(ids)})
				c, _ = New(proto, whole, "sim-actor", nil)
				if _, err := generate(c, Request{InputIDs: ids, Text: actorPrompt}, stream); err != nil {
					t.Errorf("a prompt the engine took whole: %v", err)
				}
			})
		}
	}
}

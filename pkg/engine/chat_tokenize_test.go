package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/sim"
)

// TestChatTokenizeOnTheWire: a chat engine renders a conversation for
// its count with vLLM's /tokenize, as its chat completions do (the
// generation prompt, no special tokens beyond the template's); its
// rendering must begin with the trajectory so far, and a reply without
// tokens is refused.
func TestChatTokenizeOnTheWire(t *testing.T) {
	msgs := []Message{{Role: RoleUser, Text: "hi", IDs: []int{1, 2}}, {Role: RoleAssistant, Text: "yo", IDs: []int{3}}, {Role: RoleUser, Text: "ok"}}
	for _, tc := range []struct {
		name, reply string
		want        []int
		kind        fail.Kind
		why         string
	}{
		{"rendered", `{"count":5,"max_model_len":32768,"tokens":[1,2,3,7,8]}`, []int{1, 2, 3, 7, 8}, fail.Unknown, ""},
		{"history re-rendered", `{"tokens":[1,9,3,7,8]}`, nil, fail.Permanent, "re-rendered the conversation"},
		{"no tokens", `{"count":5}`, nil, fail.Permanent, `no "tokens"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body map[string]any
			var path string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				path = r.URL.Path
				_ = json.NewDecoder(r.Body).Decode(&body)
				fmt.Fprint(w, tc.reply)
			}))
			defer srv.Close()
			c, _ := New(ProtocolOpenAIChat, srv.URL+"/v1", "m", nil)
			ids, err := c.(ChatTokenizer).TokenizeChat(context.Background(), msgs)
			if tc.why == "" {
				if err != nil || !slices.Equal(ids, tc.want) {
					t.Fatalf("TokenizeChat = %v, %v; want %v", ids, err, tc.want)
				}
			} else if fail.KindOf(err) != tc.kind || err == nil || !strings.Contains(err.Error(), tc.why) || errors.Is(err, ErrTokenDrift) != (tc.name == "history re-rendered") {
				t.Fatalf("error %v (kind %v), want %v naming %q", err, fail.KindOf(err), tc.kind, tc.why)
			}
			sent, _ := json.Marshal(body["messages"])
			if path != "/tokenize" || string(sent) != `[{"content":"hi","role":"user"},{"content":"yo","role":"assistant"},{"content":"ok","role":"user"}]` ||
				body["add_generation_prompt"] != true || body["add_special_tokens"] != false || body["model"] != "m" || body["prompt"] != nil {
				t.Errorf("request %s %v", path, body)
			}
		})
	}
	c, _ := New(ProtocolOpenAIChat, "http://127.0.0.1:1", "m", nil)
	if _, err := c.(ChatTokenizer).TokenizeChat(context.Background(), []Message{{Role: RoleUser, Text: "a"}, {Role: RoleUser, Text: "b"}}); fail.KindOf(err) != fail.Invalid {
		t.Errorf("a history without ids: %v, want invalid", err)
	}
}

// TestChatGeneratesFromWhatWasCounted: when the newest message's ids are
// known (its rendering by /tokenize, on which the context was counted),
// a generation from another prompt is token drift; from the same, it is
// the generation.
func TestChatGeneratesFromWhatWasCounted(t *testing.T) {
	msgs := []Message{{Role: RoleUser, Text: "hi", IDs: []int{1, 2}}, {Role: RoleAssistant, Text: "yo", IDs: []int{3}}, {Role: RoleUser, Text: "ok", IDs: []int{7, 8}}}
	for _, tc := range []struct {
		name, prompt string
		at           int // where it drifted; -1: it did not
	}{
		{"as counted", "[1,2,3,7,8]", -1},
		{"another rendering", "[1,2,3,7,9]", 4},
		{"longer", "[1,2,3,7,8,5]", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, `{"choices":[{"message":{"content":"x"},"finish_reason":"stop","token_ids":[4],"logprobs":{"content":[{"token":"x","logprob":-0.5}]}}],"prompt_token_ids":%s}`, tc.prompt)
			}))
			defer srv.Close()
			c, _ := New(ProtocolOpenAIChat, srv.URL, "m", nil)
			g, err := c.Generate(context.Background(), Request{Messages: msgs})
			var d *DriftError
			switch {
			case tc.at < 0 && (err != nil || !reflect.DeepEqual(g.OutputIDs, []int{4})):
				t.Errorf("generation %+v, %v", g, err)
			case tc.at >= 0 && (!errors.As(err, &d) || fail.KindOf(err) != fail.Permanent || d.At != tc.at || d.Sent != 5 || !strings.Contains(err.Error(), "max_context_tokens")):
				t.Errorf("error %v (%+v), want a permanent DriftError at %d of 5 naming the count", err, d, tc.at)
			}
		})
	}
}

// TestChatTokenizeIsTheGenerationsPrompt: the simulator's /tokenize
// renders a conversation as its chat completions do, turn after turn; a
// lease answers a first turn's rendering, which the copies of a task
// share, from what the engine said before.
func TestChatTokenizeIsTheGenerationsPrompt(t *testing.T) {
	var tokenizes atomic.Int64
	e := sim.New(sim.Config{Role: sim.RolePlanner, Seed: 4})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			tokenizes.Add(1)
		}
		e.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var pool Pool
	lease, err := pool.Acquire(context.Background(), ProtocolOpenAIChat, srv.URL, "sim-planner")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	ctx := context.Background()
	msgs := []Message{{Role: RoleUser, Text: plannerPrompt(t)}}
	for turn := 1; turn <= 3; turn++ {
		ids, err := lease.TokenizeChat(ctx, msgs)
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		known := 0
		for _, m := range msgs[:len(msgs)-1] {
			known += len(m.IDs)
		}
		msgs[len(msgs)-1].IDs = ids[known:]
		g, err := lease.Generate(ctx, Request{Messages: msgs, Sampling: Sampling{MaxNewTokens: 64}})
		if err != nil || !slices.Equal(g.PromptIDs, ids) {
			t.Fatalf("turn %d: generation from %d ids (%v), /tokenize rendered %d", turn, len(g.PromptIDs), err, len(ids))
		}
		msgs = append(msgs, Message{Role: RoleAssistant, Text: g.Text, IDs: g.OutputIDs}, Message{Role: RoleUser, Text: "\n<observation>\nnone\n</observation>\n"})
	}
	first := []Message{{Role: RoleUser, Text: plannerPrompt(t)}}
	if _, err := lease.TokenizeChat(ctx, first); err != nil || tokenizes.Load() != 3 {
		t.Errorf("the first turn again: %v after %d /tokenize calls, want 3 (the first turn's answered from before)", err, tokenizes.Load())
	}
}

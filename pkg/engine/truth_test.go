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

// TestReplyThatSaysNothing: a reply that carries neither output ids nor a
// finish reason is refused, even with a completion_tokens of 0 (a count,
// not a finish: the sample would be "completed" with no reason), and so is
// one that carries an error; a reply without ids that names a finish
// reason (max_new_tokens 0, an abort before the first token) is an empty
// generation.
func TestReplyThatSaysNothing(t *testing.T) {
	for _, tc := range []struct {
		name, proto, reply string
		want               fail.Kind // fail.Unknown: accepted, empty
		says               string
	}{
		{"sglang empty object", ProtocolSGLang, `{}`, fail.Transient, "no finish reason"},
		{"sglang error", ProtocolSGLang, `{"error":{"message":"upstream worker failed"}}`, fail.Transient, "upstream worker failed"},
		{"sglang error string", ProtocolSGLang, `{"text":"","output_ids":[],"error":"boom"}`, fail.Transient, "boom"},
		{"sglang prompt tokens only", ProtocolSGLang, `{"text":"","meta_info":{"prompt_tokens":2}}`, fail.Transient, "no finish reason"},
		{"sglang null finish", ProtocolSGLang, `{"text":"","output_ids":[],"meta_info":{"finish_reason":null,"prompt_tokens":2}}`, fail.Transient, "no finish reason"},
		{"sglang stopped at once", ProtocolSGLang, `{"text":"","output_ids":[],"meta_info":{"finish_reason":{"type":"stop","matched":2},` +
			`"prompt_tokens":2,"completion_tokens":0,"output_token_logprobs":[]}}`, fail.Unknown, ""},
		{"sglang finish only", ProtocolSGLang, `{"text":"","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":2}}`, fail.Unknown, ""},
		{"sglang completion_tokens 0", ProtocolSGLang, `{"text":"","meta_info":{"prompt_tokens":2,"completion_tokens":0}}`, fail.Transient, "no finish reason"},
		{"sglang completion_tokens 0 and ids", ProtocolSGLang, `{"text":"","output_ids":[],"meta_info":{"finish_reason":null,"prompt_tokens":2,"completion_tokens":0,` +
			`"output_token_logprobs":[]}}`, fail.Transient, "no finish reason"},
		{"sglang length 0", ProtocolSGLang, `{"text":"","output_ids":[],"meta_info":{"finish_reason":{"type":"length","length":0},"prompt_tokens":2,"completion_tokens":0}}`,
			fail.Unknown, ""},
		{"openai null finish", ProtocolOpenAI, `{"choices":[{"text":"","finish_reason":null}]}`, fail.Transient, "no finish reason"},
		{"openai error", ProtocolOpenAI, `{"choices":[{"text":"","finish_reason":"stop"}],"error":{"message":"upstream worker failed"}}`, fail.Transient, "upstream worker failed"},
		{"openai error without choices", ProtocolOpenAI, `{"error":{"message":"upstream worker failed"}}`, fail.Transient, "upstream worker failed"},
		{"openai stopped at once", ProtocolOpenAI, `{"choices":[{"text":"","finish_reason":"stop","token_ids":[]}],"usage":{"prompt_tokens":2,"completion_tokens":0}}`, fail.Unknown, ""},
		{"openai completion_tokens 0", ProtocolOpenAI, `{"choices":[{"text":"","finish_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":0}}`, fail.Transient, "no finish reason"},
		{"openai completion_tokens 0 and ids", ProtocolOpenAI, `{"choices":[{"text":"","finish_reason":null,"token_ids":[]}],"usage":{"prompt_tokens":2,"completion_tokens":0}}`,
			fail.Transient, "no finish reason"},
		{"chat null finish", ProtocolOpenAIChat, `{"choices":[{"message":{"content":""},"finish_reason":null}],"prompt_token_ids":[1,2]}`, fail.Transient, "no finish reason"},
		{"chat error", ProtocolOpenAIChat, `{"choices":[{"message":{"content":""},"finish_reason":"stop"}],"prompt_token_ids":[1,2],"error":"boom"}`, fail.Transient, "boom"},
		{"chat completion_tokens 0", ProtocolOpenAIChat, `{"choices":[{"message":{"content":""},"finish_reason":null,"token_ids":[]}],"prompt_token_ids":[1,2],` +
			`"usage":{"prompt_tokens":2,"completion_tokens":0}}`, fail.Transient, "no finish reason"},
		{"chat stopped at once", ProtocolOpenAIChat, `{"choices":[{"message":{"content":""},"finish_reason":"stop","token_ids":[]}],"prompt_token_ids":[1,2]}`, fail.Unknown, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.reply) }))
			defer srv.Close()
			c, _ := NewClient(tc.proto, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
			g, err := c.Generate(context.Background(), Request{InputIDs: []int{1, 2}, Text: "q"})
			if tc.want == fail.Unknown {
				if err != nil || len(g.OutputIDs) != 0 || g.Text != "" {
					t.Fatalf("%+v, %v; want an empty generation", g, err)
				}
				return
			}
			if err == nil || fail.KindOf(err) != tc.want || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%+v, %v; want a %v error saying %q", g, err, tc.want, tc.says)
			}
		})
	}
}

// TestNullTokenIDIsAnError: a token id the engine wrote as null is not
// token 0: the reply is refused, and the error says where the null is.
func TestNullTokenIDIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name, proto, path, reply, where string
	}{
		{"sglang output_ids", ProtocolSGLang, "/generate", `{"text":"ab","output_ids":[5,null,7],"meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":3}}`,
			"output_ids[1] is null"},
		{"sglang log-prob triple", ProtocolSGLang, "/generate", `{"text":"ab","meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":2,` +
			`"output_token_logprobs":[[-0.1,5,"a"],[-0.2,null,"b"]]}}`, "output_token_logprobs[1]"},
		{"sglang tokenize", ProtocolSGLang, "/tokenize", `{"tokens":[1,null,3],"count":3}`, "tokens[1] is null"},
		{"openai token_ids", ProtocolOpenAI, "/v1/completions", `{"choices":[{"text":"ab","finish_reason":"stop","token_ids":[5,null]}]}`,
			"token_ids[1] is null"},
		{"openai prompt_token_ids", ProtocolOpenAI, "/v1/completions", `{"choices":[{"text":"ab","finish_reason":"stop","token_ids":[5,6],"prompt_token_ids":[null,2]}]}`,
			"prompt_token_ids[0] is null"},
		{"openai tokenize", ProtocolOpenAI, "/tokenize", `{"tokens":[null]}`, "tokens[0] is null"},
		{"chat token_ids", ProtocolOpenAIChat, "/v1/chat/completions", `{"choices":[{"message":{"content":"ab"},"finish_reason":"stop","token_ids":[5,null]}],` +
			`"prompt_token_ids":[1,2]}`, "token_ids[1] is null"},
		{"chat prompt_token_ids", ProtocolOpenAIChat, "/v1/chat/completions", `{"choices":[{"message":{"content":"ab"},"finish_reason":"stop","token_ids":[5,6]}],` +
			`"prompt_token_ids":[1,null]}`, "prompt_token_ids[1] is null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.reply) }))
			defer srv.Close()
			c, _ := NewClient(tc.proto, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
			var got any
			var err error
			if tc.path == "/tokenize" {
				got, err = c.Tokenize(context.Background(), "ab")
			} else {
				got, err = c.Generate(context.Background(), Request{InputIDs: []int{1, 2}, Text: "q"})
			}
			if err == nil || !strings.Contains(err.Error(), tc.where) {
				t.Fatalf("%+v, %v; want an error saying %q", got, err, tc.where)
			}
		})
	}
}

// TestIDsFewerThanGenerated: a reply, or a stream, whose output ids are
// fewer than the tokens its usage says were generated (a chunk of the
// stream came with text but without its ids or "token_id:<id>" log-prob
// tokens) is refused: the ids it did return are not the generation, and a
// trajectory built on them would silently lack tokens the model wrote.
func TestIDsFewerThanGenerated(t *testing.T) {
	for _, tc := range []struct {
		name, proto string
		events      []string // a stream's, or one reply when not streamed
		stream      bool
	}{
		{"sglang", ProtocolSGLang, []string{
			`{"text":"Paris","output_ids":[83,100],"meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":1,"completion_tokens":3,` +
				`"output_token_logprobs":[[-0.5,83,null],[-0.25,100,null]]}}`,
		}, false},
		{"sglang stream", ProtocolSGLang, []string{
			`{"text":"Pa","output_ids":[83,100],"meta_info":{"prompt_tokens":1,"completion_tokens":2,"finish_reason":null}}`,
			`{"text":"Paris","output_ids":[83,100],"meta_info":{"prompt_tokens":1,"completion_tokens":3,"finish_reason":{"type":"stop"}}}`,
		}, true},
		{"completions", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Pa","logprobs":{"tokens":["token_id:83","token_id:100"],"token_logprobs":[-0.5,-0.25]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","logprobs":null,"finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}`,
		}, true},
		{"completions token_ids", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Pa","token_ids":[83,100],"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}`,
		}, true},
		{"chat", ProtocolOpenAIChat, []string{
			`{"prompt_token_ids":[7],"choices":[{"index":0,"delta":{"content":"Pa"},"token_ids":[83,100],"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"content":"ris"},"finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}`,
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := New(tc.proto, replyServer(t, tc.events, tc.stream), "m", nil)
			g, err := generate(c, Request{Text: "q"}, tc.stream)
			if err == nil || !strings.Contains(err.Error(), "3") {
				t.Errorf("%+v, %v; want an error: 2 output ids for the 3 tokens generated", g, err)
			}
		})
	}
}

// TestIDsMissingFromAChunk: a stream a chunk of which came with text but
// without its ids (neither token_ids nor "token_id:<id>" log-prob tokens)
// is refused even where no usage says how many tokens were generated (a
// server or proxy that drops stream_options): the chunk itself says that
// the ids returned are not the generation. It used to be taken with the
// ids of the other chunks only, a trajectory that silently lacked tokens
// the model wrote.
func TestIDsMissingFromAChunk(t *testing.T) {
	for _, tc := range []struct {
		name, proto string
		events      []string
	}{
		{"completions", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Pa","logprobs":{"tokens":["token_id:83","token_id:100"],"token_logprobs":[-0.5,-0.25]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","logprobs":null,"finish_reason":"stop"}]}`,
		}},
		{"completions token_ids", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Pa","token_ids":[83,100],"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","finish_reason":"stop"}]}`,
		}},
		{"chat", ProtocolOpenAIChat, []string{
			`{"prompt_token_ids":[7],"choices":[{"index":0,"delta":{"content":"Pa"},"token_ids":[83,100],"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"content":"ris"},"finish_reason":"stop"}]}`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := New(tc.proto, replyServer(t, tc.events, true), "m", nil)
			g, err := generate(c, Request{Text: "q"}, true)
			if err == nil || fail.KindOf(err) != fail.Transient || !strings.Contains(err.Error(), "no token ids") {
				t.Errorf("%+v, %v; want a transient error: a chunk with text and no token ids", g, err)
			}
		})
	}
	// A chunk with no text and no ids (a chat stream's first, naming the
	// role; a last one with only the finish reason) lacks nothing.
	c, _ := New(ProtocolOpenAIChat, replyServer(t, []string{
		`{"prompt_token_ids":[7],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Pa"},"token_ids":[83,100],"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	}, true), "m", nil)
	if g, err := generate(c, Request{Text: "q"}, true); err != nil || !slices.Equal(g.OutputIDs, []int{83, 100}) {
		t.Errorf("%+v, %v; want the ids [83 100]", g, err)
	}
}

// TestIDsDisagreeWithLogProbs: a reply that names its tokens twice (the
// output ids, and the ids its log-probs are of) and whose two lists
// disagree is refused, saying where: before, SGLang's was read from its
// log-probs and an OpenAI-compatible server's log-probs were kept beside
// token_ids they were not the log-probs of.
func TestIDsDisagreeWithLogProbs(t *testing.T) {
	for _, tc := range []struct {
		name, proto string
		events      []string // a stream's, or one reply when not streamed
		stream      bool
	}{
		{"sglang", ProtocolSGLang, []string{
			`{"text":"Paris","output_ids":[83,100],"meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":1,"completion_tokens":2,` +
				`"output_token_logprobs":[[-0.5,83,null],[-0.25,101,null]]}}`,
		}, false},
		{"sglang stream", ProtocolSGLang, []string{
			`{"text":"Pa","output_ids":[83],"meta_info":{"prompt_tokens":1,"completion_tokens":1,"finish_reason":null,"output_token_logprobs":[[-0.5,83,null]]}}`,
			`{"text":"Paris","output_ids":[83,100],"meta_info":{"prompt_tokens":1,"completion_tokens":2,"finish_reason":{"type":"stop"},` +
				`"output_token_logprobs":[[-0.5,83,null],[-0.25,101,null]]}}`,
		}, true},
		{"completions", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Paris","token_ids":[83,100],"logprobs":{"tokens":["token_id:83","token_id:101"],"token_logprobs":[-0.5,-0.25]},` +
				`"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		}, false},
		{"completions stream", ProtocolOpenAI, []string{
			`{"choices":[{"index":0,"text":"Pa","token_ids":[83],"logprobs":{"tokens":["token_id:83"],"token_logprobs":[-0.5]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","token_ids":[100],"logprobs":{"tokens":["token_id:101"],"token_logprobs":[-0.25]},"finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		}, true},
		{"chat", ProtocolOpenAIChat, []string{
			`{"prompt_token_ids":[7],"choices":[{"index":0,"message":{"content":"Paris"},"token_ids":[83,100],` +
				`"logprobs":{"content":[{"token":"token_id:83","logprob":-0.5},{"token":"token_id:101","logprob":-0.25}]},"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := New(tc.proto, replyServer(t, tc.events, tc.stream), "m", nil)
			g, err := generate(c, Request{Text: "q"}, tc.stream)
			if err == nil || !strings.Contains(err.Error(), "100") || !strings.Contains(err.Error(), "101") {
				t.Errorf("%+v, %v; want an error naming token 100 and the log-prob's token 101", g, err)
			}
		})
	}
}

// TestTokenizeToNothingIsAnError: an engine that tokenizes a text with
// words in it into no tokens is refused for good. An act sent with no ids
// went out as text, which the engine tokenized itself: its sample had no
// prompt ids, and what the engine took went unchecked. Whitespace alone
// may tokenize to nothing.
func TestTokenizeToNothingIsAnError(t *testing.T) {
	for _, proto := range []string{ProtocolSGLang, ProtocolOpenAI, ProtocolOpenAIChat} {
		t.Run(proto, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"tokens":[],"count":0}`) }))
			defer srv.Close()
			c, _ := NewClient(proto, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
			ids, err := c.Tokenize(context.Background(), "Tool: search\nInput: capital of France\n")
			if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "into no tokens") {
				t.Errorf("tokenized a prompt into %v, %v; want a permanent error saying it came to no tokens", ids, err)
			}
			if ids, err := c.Tokenize(context.Background(), " \n"); err != nil || len(ids) != 0 {
				t.Errorf("whitespace: %v, %v; want no tokens, no error", ids, err)
			}
		})
	}
}

// TestChatRenderedToNothingIsAnError: a chat engine whose rendering of a
// conversation is no tokens (its /tokenize with messages, or the
// prompt_token_ids of a generation) is refused for good, as a /tokenize of
// a text with words is: its chat template wrote at least the messages, so
// an empty rendering is not what the model generated from. It used to be
// taken as the prompt's ids: a planner turn counted no context and its
// sample, as an act's, held no prompt at all.
func TestChatRenderedToNothingIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"tokens":[],"count":0}`) }))
	defer srv.Close()
	c, _ := NewClient(ProtocolOpenAIChat, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
	ids, err := c.(ChatTokenizer).TokenizeChat(context.Background(), []Message{{Role: RoleUser, Text: "What is the capital of France?"}})
	if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "into no tokens") {
		t.Errorf("rendered a conversation into %v, %v; want a permanent error saying it came to no tokens", ids, err)
	}
	for _, stream := range []bool{false, true} {
		events := []string{`{"prompt_token_ids":[],"choices":[{"index":0,"message":{"content":"Paris"},"token_ids":[83,100],"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":0,"completion_tokens":2}}`}
		if stream {
			events = []string{
				`{"prompt_token_ids":[],"choices":[{"index":0,"delta":{"content":"Paris"},"token_ids":[83,100],"finish_reason":"stop"}]}`,
				`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":2}}`,
			}
		}
		c, _ := New(ProtocolOpenAIChat, replyServer(t, events, stream), "m", nil)
		g, err := generate(c, Request{Text: "What is the capital of France?"}, stream)
		if err == nil || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), "no tokens") {
			t.Errorf("stream %v: %+v, %v; want a permanent error: the prompt rendered as no tokens", stream, g, err)
		}
	}
}

// replyServer is an engine that answers every request with events: the
// first as one reply, or all of them as a stream ending in [DONE]. It
// returns its URL.
func replyServer(t *testing.T, events []string, stream bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !stream {
			fmt.Fprint(w, events[0])
			return
		}
		for _, ev := range events {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

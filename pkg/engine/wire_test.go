package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// recorder is an engine that answers every generation with one token and
// keeps what it was sent.
type recorder struct {
	mu    sync.Mutex
	paths []string
	heads []http.Header
	body  []map[string]any
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in map[string]any
	_ = json.NewDecoder(r.Body).Decode(&in)
	rec.mu.Lock()
	rec.paths = append(rec.paths, r.URL.Path)
	rec.heads = append(rec.heads, r.Header.Clone())
	rec.body = append(rec.body, in)
	rec.mu.Unlock()
	switch r.URL.Path {
	case "/generate":
		fmt.Fprint(w, `{"text":"x","output_ids":[4],"meta_info":{"finish_reason":{"type":"stop"},"output_token_logprobs":[[-0.5,4,null]]}}`)
	case "/v1/completions":
		fmt.Fprint(w, `{"choices":[{"text":"x","finish_reason":"stop","token_ids":[4],"logprobs":{"tokens":["x"],"token_logprobs":[-0.5]}}]}`)
	case "/v1/chat/completions":
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"x"},"finish_reason":"stop","token_ids":[4],
			"logprobs":{"content":[{"token":"x","logprob":-0.5}]}}],"prompt_token_ids":[1,2,3],"usage":{"prompt_tokens":3}}`)
	default:
		http.NotFound(w, r)
	}
}

// TestRoutingKeyOnTheWire: every protocol sends the routing key in the
// X-SMG-Routing-Key header; SGLang also in the body (routing_key), beside
// the request's rid, which is Request.ID or a fresh "planact-<key>-…".
func TestRoutingKeyOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		proto, path string
		body        map[string]any // fields the body must have
		id          string
	}{
		{ProtocolSGLang, "/generate", map[string]any{"routing_key": "7-3"}, ""},
		{ProtocolSGLang, "/generate", map[string]any{"routing_key": "7-3", "rid": "mine"}, "mine"},
		{ProtocolOpenAI, "/v1/completions", nil, ""},
		{ProtocolOpenAIChat, "/v1/chat/completions", nil, ""},
	} {
		t.Run(tc.proto+"/"+tc.id, func(t *testing.T) {
			rec := &recorder{}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			c, _ := New(tc.proto, srv.URL, "m", nil)
			for _, key := range []string{"7-3", ""} {
				if _, err := c.Generate(context.Background(), Request{InputIDs: []int{1}, Text: "q", RoutingKey: key, ID: tc.id}); err != nil {
					t.Fatal(err)
				}
			}
			if len(rec.paths) != 2 || rec.paths[0] != tc.path {
				t.Fatalf("paths %v", rec.paths)
			}
			if got := rec.heads[0].Get(RoutingKeyHeader); got != "7-3" {
				t.Errorf("header %s = %q", RoutingKeyHeader, got)
			}
			if got := rec.heads[1].Values(RoutingKeyHeader); got != nil {
				t.Errorf("no routing key, yet header %v", got)
			}
			for k, v := range tc.body {
				if rec.body[0][k] != v {
					t.Errorf("body %s = %v, want %v", k, rec.body[0][k], v)
				}
			}
			if tc.proto == ProtocolSGLang {
				if rid, _ := rec.body[0]["rid"].(string); tc.id == "" && !strings.HasPrefix(rid, "planact-7-3-") {
					t.Errorf("rid %q: want planact-7-3-…", rid)
				}
				if rid, _ := rec.body[1]["rid"].(string); tc.id == "" && (!strings.HasPrefix(rid, "planact-") || rid == rec.body[0]["rid"]) {
					t.Errorf("second rid %q (first %v)", rid, rec.body[0]["rid"])
				}
				if _, ok := rec.body[1]["routing_key"]; ok {
					t.Errorf("routing_key sent without a key: %v", rec.body[1])
				}
			}
		})
	}
}

// TestChatRequest: what the chat client asks for, and how it reads vLLM's
// reply: token ids beside each choice, the prompt's ids beside the choices.
func TestChatRequest(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, _ := New(ProtocolOpenAIChat, srv.URL+"/v1", "m", nil)
	r := Request{Messages: []Message{{Role: RoleUser, Text: "hi", IDs: []int{1, 2}}, {Role: RoleAssistant, Text: "yo", IDs: []int{3}}, {Role: RoleUser, Text: "ok"}},
		Sampling: Sampling{Temperature: 0.5, MaxNewTokens: 8, Seed: 3, Stop: []string{"</answer>"}}}
	g, err := c.Generate(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	want := Generation{Text: "x", OutputIDs: []int{4}, LogProbs: []float64{-0.5}, FinishReason: "stop", PromptTokens: 3,
		PromptIDs: []int{1, 2, 3}, Latency: g.Latency}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("generation = %+v\nwant %+v", g, want)
	}
	if got := TrajectoryIDs(r, g, []int{99}); len(got) != 0 {
		t.Errorf("TrajectoryIDs = %v: the whole prompt was the trajectory so far", got)
	}
	in := rec.body[0]
	msgs, _ := json.Marshal(in["messages"])
	if string(msgs) != `[{"content":"hi","role":"user"},{"content":"yo","role":"assistant"},{"content":"ok","role":"user"}]` ||
		in["model"] != "m" || in["logprobs"] != true || in["return_token_ids"] != true || in["return_tokens_as_token_ids"] != true ||
		in["max_tokens"] != 8.0 || in["seed"] != 3.0 || in["temperature"] != 0.5 || in["input_ids"] != nil {
		t.Errorf("request = %v", in)
	}
}

// TestChatNotTokenExact: where a chat server cannot give a token-exact
// sample, the chat client fails for good and says why.
func TestChatNotTokenExact(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		r           Request
		kind        fail.Kind
		why         string
	}{
		{"no output ids", `{"choices":[{"message":{"content":"x"},"finish_reason":"stop","logprobs":{"content":[{"token":"x","logprob":-1}]}}],"prompt_token_ids":[1]}`,
			Request{Text: "q"}, fail.Permanent, "no output token ids"},
		{"no prompt ids", `{"choices":[{"message":{"content":"x"},"finish_reason":"stop","token_ids":[4]}]}`,
			Request{Text: "q"}, fail.Permanent, "no prompt_token_ids"},
		{"history re-tokenized", `{"choices":[{"message":{"content":"x"},"finish_reason":"stop","token_ids":[4]}],"prompt_token_ids":[1,2,9,5]}`,
			Request{Messages: []Message{{Role: RoleUser, Text: "a", IDs: []int{1, 2}}, {Role: RoleAssistant, Text: "b", IDs: []int{3}}, {Role: RoleUser, Text: "c"}}},
			fail.Permanent, "re-rendered the conversation: the history the model saw is not the one planact trains on (use a template that renders earlier turns unchanged: no <think> stripping, no trimming; or a completions protocol): token_drift: the engine's input differs from planact's trajectory at token 2 of 3"},
		{"token ids alone", `{}`, Request{InputIDs: []int{1}}, fail.Invalid, "not token ids alone"},
		{"history without ids", `{}`, Request{Messages: []Message{{Role: RoleUser, Text: "a"}, {Role: RoleUser, Text: "c"}}}, fail.Invalid, "has no ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.reply) }))
			defer srv.Close()
			c, _ := New(ProtocolOpenAIChat, srv.URL, "m", nil)
			_, err := c.Generate(context.Background(), tc.r)
			if fail.KindOf(err) != tc.kind || err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("error %v (kind %v), want %v naming %q", err, fail.KindOf(err), tc.kind, tc.why)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 7 ", 7 * time.Second, true},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true}, // IMF-fixdate
		{"Sunday, 01-Mar-26 12:01:00 GMT", time.Minute, true},     // RFC 850
		{"Sun Mar  1 12:00:05 2026", 5 * time.Second, true},       // asctime
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true},                // past: now
		{"-3", 0, false},
		{"soon", 0, false},
		{"1.5", 0, false},
		{"99999999999", 24 * time.Hour, true},
	} {
		got, ok := parseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}.withDefaults()
	for _, tc := range []struct {
		attempt  int
		min, max time.Duration
	}{
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{5, 500 * time.Millisecond, time.Second},
		{60, 500 * time.Millisecond, time.Second},
	} {
		for range 20 {
			if d := b.delay(tc.attempt); d < tc.min || d > tc.max {
				t.Errorf("delay(%d) = %v, want in [%v, %v]", tc.attempt, d, tc.min, tc.max)
			}
		}
	}
}

// TestNotSupported: an engine without control endpoints says so, for good.
func TestNotSupported(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	ctx := context.Background()
	for _, proto := range Protocols {
		c, _ := New(proto, srv.URL, "m", nil)
		_, werr := c.WeightVersion(ctx)
		for name, err := range map[string]error{
			"pause": c.Pause(ctx, PauseAbort), "pause in place": c.Pause(ctx, PauseInPlace),
			"resume": c.Resume(ctx), "weight version": werr,
		} {
			if !errors.Is(err, ErrNotSupported) || fail.KindOf(err) != fail.Permanent {
				t.Errorf("%s %s: %v (kind %v), want ErrNotSupported", proto, name, err, fail.KindOf(err))
			}
		}
	}
	// Modes a protocol has not, whatever the server.
	sg, _ := New(ProtocolSGLang, srv.URL, "", nil)
	if err := sg.Pause(ctx, PauseWait); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "wait") {
		t.Errorf("sglang pause wait: %v", err)
	}
}

// TestWeightVersionFromModelInfo: servers older than /get_weight_version
// report the version in /get_model_info.
func TestWeightVersionFromModelInfo(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/get_model_info" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"model_path":"m","weight_version":"step-3"}`)
	}))
	defer srv.Close()
	c, _ := New(ProtocolSGLang, srv.URL, "", nil)
	if v, err := c.WeightVersion(context.Background()); v != "step-3" || err != nil {
		t.Errorf("WeightVersion = %q, %v", v, err)
	}
	// A newer server that answers only /model_info.
	newer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/model_info" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"model_path":"m","weight_version":"step-4"}`)
	}))
	defer newer.Close()
	c, _ = New(ProtocolSGLang, newer.URL, "", nil)
	if v, err := c.WeightVersion(context.Background()); v != "step-4" || err != nil {
		t.Errorf("WeightVersion from /model_info = %q, %v", v, err)
	}
	// A server older still names none: it cannot say.
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/get_model_info" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"model_path":"m"}`)
	}))
	defer old.Close()
	c, _ = New(ProtocolSGLang, old.URL, "", nil)
	if v, err := c.WeightVersion(context.Background()); !errors.Is(err, ErrNotSupported) {
		t.Errorf("WeightVersion of a server that names none = %q, %v; want ErrNotSupported", v, err)
	}
}

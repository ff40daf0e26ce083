package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// sglangReply is a /generate reply as SGLang writes it.
const sglangReply = `{"text":"Paris","output_ids":[83,100,117,2],
 "meta_info":{"id":"r1","finish_reason":{"type":"stop","matched":2},"prompt_tokens":5,
 "completion_tokens":4,"cached_tokens":0,"weight_version":"v7",
 "output_token_logprobs":[[-0.5,83,null],[-0.25,100,null],[-1,117,null],[-0.125,2,null]]}}`

func TestSGLangGenerate(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/generate" {
			http.NotFound(w, r)
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		fmt.Fprint(w, sglangReply)
	}))
	defer srv.Close()
	c, err := New("", srv.URL+"/", "", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.Generate(context.Background(), Request{InputIDs: []int{1, 2, 3, 4, 5}, Text: "ignored",
		Sampling: Sampling{Temperature: 0.7, TopP: 0.9, MaxNewTokens: 32, Stop: []string{"</answer>"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := Generation{Text: "Paris", OutputIDs: []int{83, 100, 117, 2}, LogProbs: []float64{-0.5, -0.25, -1, -0.125},
		FinishReason: "stop", PromptTokens: 5, WeightVersion: "v7", Latency: g.Latency}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("generation = %+v\nwant %+v", g, want)
	}
	if got["text"] != nil || !reflect.DeepEqual(got["input_ids"], []any{1.0, 2.0, 3.0, 4.0, 5.0}) || got["return_logprob"] != true {
		t.Errorf("request = %v", got)
	}
	sp := got["sampling_params"].(map[string]any)
	if sp["max_new_tokens"] != 32.0 || sp["temperature"] != 0.7 || sp["top_p"] != 0.9 || sp["sampling_seed"] != nil {
		t.Errorf("sampling_params = %v", sp)
	}
}

func TestSGLangStream(t *testing.T) {
	for _, mode := range []string{"cumulative", "delta"} {
		t.Run(mode, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var in struct{ Stream bool }
				json.NewDecoder(r.Body).Decode(&in)
				if !in.Stream {
					t.Error("stream not requested")
				}
				w.Header().Set("Content-Type", "text/event-stream")
				texts := []string{"Pa", "Paris", "Paris"}
				ids := [][]int{{83, 100}, {83, 100, 117}, {83, 100, 117, 2}}
				lps := []string{`[[-0.5,83,null],[-0.25,100,null]]`, `[[-0.5,83,null],[-0.25,100,null],[-1,117,null]]`,
					`[[-0.5,83,null],[-0.25,100,null],[-1,117,null],[-0.125,2,null]]`}
				if mode == "delta" {
					texts = []string{"Pa", "ris", ""}
					ids = [][]int{{83, 100}, {117}, {2}}
				}
				for i := range texts {
					fr := "null"
					if i == len(texts)-1 {
						fr = `{"type":"stop","matched":2}`
					}
					idj, _ := json.Marshal(ids[i])
					fmt.Fprintf(w, "data: {\"text\":%q,\"output_ids\":%s,\"meta_info\":{\"finish_reason\":%s,\"prompt_tokens\":5,\"completion_tokens\":%d,\"weight_version\":\"v1\",\"output_token_logprobs\":%s}}\n\n",
						texts[i], idj, fr, strings.Count(lps[i], "null"), lps[i])
					w.(http.Flusher).Flush()
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			}))
			defer srv.Close()
			c, _ := New("sglang", srv.URL, "", nil)
			var chunks []string
			g, err := c.(Streamer).GenerateStream(context.Background(), Request{Text: "q"}, func(s string) { chunks = append(chunks, s) })
			if err != nil {
				t.Fatal(err)
			}
			if g.Text != "Paris" || !reflect.DeepEqual(g.OutputIDs, []int{83, 100, 117, 2}) || len(g.LogProbs) != 4 || g.FinishReason != "stop" {
				t.Errorf("generation = %+v", g)
			}
			if !reflect.DeepEqual(chunks, []string{"Pa", "Paris", "Paris"}) {
				t.Errorf("chunks = %q", chunks)
			}
		})
	}
}

// TestSGLangStreamText: the events' texts are cumulative or deltas as the
// stream shows, decided once for the whole stream: deltas that happen to
// begin with the text before them (SGLang's --incremental-streaming-output)
// are joined, cumulative texts with delta ids (--stream-output on servers
// before it) are not.
func TestSGLangStreamText(t *testing.T) {
	type event struct {
		text string
		ids  []int
	}
	for _, tc := range []struct {
		name   string
		events []event
		want   string
		ids    []int
	}{
		{"deltas that repeat", []event{{"\n", []int{10}}, {"\n", []int{11}}, {"Plan", []int{12}}}, "\n\nPlan", []int{10, 11, 12}},
		{"deltas that extend", []event{{"a", []int{10}}, {"ab", []int{11}}, {"", []int{2}}}, "aab", []int{10, 11, 2}},
		{"cumulative text, delta ids", []event{{"Pa", []int{83, 100}}, {"Paris", []int{117}}, {"Paris", []int{2}}}, "Paris", []int{83, 100, 117, 2}},
		{"cumulative", []event{{"\n", []int{10}}, {"\n\n", []int{10, 11}}, {"\n\nPlan", []int{10, 11, 12}}}, "\n\nPlan", []int{10, 11, 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				n := 0
				for i, ev := range tc.events {
					n += len(ev.ids)
					if tc.name == "cumulative" {
						n = len(ev.ids)
					}
					fr := "null"
					if i == len(tc.events)-1 {
						fr = `{"type":"stop"}`
					}
					idj, _ := json.Marshal(ev.ids)
					fmt.Fprintf(w, "data: {\"text\":%q,\"output_ids\":%s,\"meta_info\":{\"finish_reason\":%s,\"prompt_tokens\":1,\"completion_tokens\":%d}}\n\n",
						ev.text, idj, fr, n)
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			}))
			defer srv.Close()
			c, _ := New("sglang", srv.URL, "", nil)
			var chunks []string
			g, err := c.(Streamer).GenerateStream(context.Background(), Request{InputIDs: []int{1}}, func(s string) { chunks = append(chunks, s) })
			if err != nil {
				t.Fatal(err)
			}
			if g.Text != tc.want || !reflect.DeepEqual(g.OutputIDs, tc.ids) {
				t.Errorf("text %q, ids %v; want %q, %v", g.Text, g.OutputIDs, tc.want, tc.ids)
			}
			if len(chunks) != len(tc.events) || chunks[len(chunks)-1] != tc.want {
				t.Errorf("chunks %q: want one per event, the last %q", chunks, tc.want)
			}
		})
	}
}

func TestOpenAIGenerate(t *testing.T) {
	for _, tc := range []struct {
		name, choice string
		ids          []int
	}{
		{"token_ids", `"token_ids":[83,100],"logprobs":{"tokens":["P","a"],"token_logprobs":[-0.5,-0.25]}`, []int{83, 100}},
		{"token_id strings", `"logprobs":{"tokens":["token_id:83","token_id:100"],"token_logprobs":[-0.5,-0.25]}`, []int{83, 100}},
		// Neither: refused for good (TestCompletionsWithoutTokenIDs).
		{"no ids", `"logprobs":{"tokens":["P","a"],"token_logprobs":[-0.5,-0.25]}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got map[string]any
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/completions" {
					http.NotFound(w, r)
					return
				}
				json.NewDecoder(r.Body).Decode(&got)
				fmt.Fprintf(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"Pa","finish_reason":"length",%s}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`, tc.choice)
			}))
			defer srv.Close()
			c, _ := New("openai", srv.URL+"/v1", "m", nil)
			g, err := c.Generate(context.Background(), Request{InputIDs: []int{4, 5, 6}, Sampling: Sampling{MaxNewTokens: 2, Seed: 9}})
			if tc.ids == nil {
				if fail.KindOf(err) != fail.Permanent {
					t.Errorf("a reply without ids: %+v, %v; want refused for good", g, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.Text != "Pa" || !reflect.DeepEqual(g.OutputIDs, tc.ids) || !reflect.DeepEqual(g.LogProbs, []float64{-0.5, -0.25}) ||
				g.FinishReason != "length" || g.PromptTokens != 3 {
				t.Errorf("generation = %+v", g)
			}
			if got["model"] != "m" || !reflect.DeepEqual(got["prompt"], []any{4.0, 5.0, 6.0}) || got["max_tokens"] != 2.0 ||
				got["seed"] != 9.0 || got["logprobs"] != 1.0 || got["return_tokens_as_token_ids"] != true {
				t.Errorf("request = %v", got)
			}
		})
	}
}

func TestOpenAIStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, ev := range []string{
			`{"choices":[{"index":0,"text":"Pa","logprobs":{"tokens":["token_id:83","token_id:100"],"token_logprobs":[-0.5,-0.25]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"ris","logprobs":{"tokens":["token_id:117"],"token_logprobs":[-1]},"finish_reason":null}]}`,
			`{"choices":[{"index":0,"text":"","logprobs":{"tokens":["token_id:2"],"token_logprobs":[-0.125]},"finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4}}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	c, _ := New("openai", srv.URL, "m", nil)
	var chunks []string
	g, err := c.(Streamer).GenerateStream(context.Background(), Request{Text: "q"}, func(s string) { chunks = append(chunks, s) })
	if err != nil {
		t.Fatal(err)
	}
	if g.Text != "Paris" || !reflect.DeepEqual(g.OutputIDs, []int{83, 100, 117, 2}) || g.PromptTokens != 5 || g.FinishReason != "stop" {
		t.Errorf("generation = %+v", g)
	}
	if !reflect.DeepEqual(chunks, []string{"Pa", "Paris"}) {
		t.Errorf("chunks = %q", chunks)
	}
}

func TestTokenizeAndHealth(t *testing.T) {
	for _, proto := range []string{"sglang", "openai"} {
		t.Run(proto, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/tokenize":
					var in map[string]any
					json.NewDecoder(r.Body).Decode(&in)
					if in["prompt"] != "hi" || in["add_special_tokens"] != false {
						t.Errorf("tokenize request = %v", in)
					}
					fmt.Fprint(w, `{"tokens":[107,108],"count":2,"max_model_len":4096}`)
				case "/health":
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			c, _ := New(proto, srv.URL, "m", nil)
			ids, err := c.Tokenize(context.Background(), "hi")
			if err != nil || !reflect.DeepEqual(ids, []int{107, 108}) {
				t.Errorf("Tokenize = %v, %v", ids, err)
			}
			if err := c.Health(context.Background()); err != nil {
				t.Errorf("Health = %v", err)
			}
		})
	}
}

func TestErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    fail.Kind
	}{
		{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }, fail.Transient},
		{"503", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "busy", 503) }, fail.Transient},
		{"429", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "slow down", 429) }, fail.Transient},
		{"400", func(w http.ResponseWriter, r *http.Request) { http.Error(w, `{"error":"bad"}`, 400) }, fail.Permanent},
		{"404", http.NotFound, fail.Permanent},
		{"bad json", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"text":`) }, fail.Transient},
		{"no choices", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"choices":[]}`) }, fail.Transient},
	} {
		for _, proto := range []string{"sglang", "openai"} {
			t.Run(tc.name+"/"+proto, func(t *testing.T) {
				if tc.name == "no choices" && proto == "sglang" {
					t.Skip("openai only")
				}
				srv := httptest.NewServer(tc.handler)
				defer srv.Close()
				c, _ := NewClient(proto, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 2, Base: time.Millisecond}})
				_, err := c.Generate(context.Background(), Request{Text: "x"})
				if fail.KindOf(err) != tc.want {
					t.Errorf("error %v has kind %v, want %v", err, fail.KindOf(err), tc.want)
				}
			})
		}
	}
}

func TestTransportErrors(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, _ := New("sglang", url, "", nil)
	if _, err := c.Generate(context.Background(), Request{Text: "x"}); fail.KindOf(err) != fail.Transient {
		t.Errorf("connection refused: %v kind %v", err, fail.KindOf(err))
	}
	if _, err := c.Generate(context.Background(), Request{}); fail.KindOf(err) != fail.Invalid {
		t.Errorf("empty request: %v kind %v", err, fail.KindOf(err))
	}
	if _, err := New("grpc", url, "", nil); fail.KindOf(err) != fail.Invalid || !strings.Contains(err.Error(), "openai-chat") {
		t.Errorf("unknown protocol: %v", err)
	}

	// A hanging engine: the caller's deadline ends the call, as a transient error.
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hang.Close()
	defer close(release)
	c, _ = New("sglang", hang.URL, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Generate(ctx, Request{Text: "x"}); fail.KindOf(err) != fail.Transient {
		t.Errorf("deadline: %v kind %v", err, fail.KindOf(err))
	}
}

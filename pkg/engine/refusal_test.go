package engine

// What SGLang's /generate says when it refuses or loses a request, checked
// against replies written as its tokenizer_manager.py writes them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
)

// sglAbortEvent is the last (here the only) event of a /generate stream
// that SGLang ended with FINISH_ABORT: its to_json, with the status code
// when the scheduler refused or failed the request.
func sglAbortEvent(status, message string) string {
	return fmt.Sprintf(`{"text": "", "output_ids": [], "meta_info": {"id": "r", "finish_reason": {"type": "abort", "message": %q, "status_code": %s, "err_type": null}, `+
		`"prompt_tokens": 3, "completion_tokens": 0, "weight_version": "default", "output_token_logprobs": []}}`, message, status)
}

// TestAbortWithAStatusIsAnError: SGLang ends a request it refuses (a
// prompt longer than its context: 400) or fails (its queue full, a time-out:
// 503; an internal error: 500) with finish_reason {"type": "abort",
// "status_code"}. Not streamed, the reply is that status; streamed, the
// final event is all that says so. That event used to be taken as an
// aborted, empty generation, the engine's words lost and a 503 never
// tried again; it is now the error the status says, with the message. An
// abort without a status (an /abort_request, a pause) stays a generation
// that finished with abort.
func TestAbortWithAStatusIsAnError(t *testing.T) {
	const tooLong = "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
	for _, tc := range []struct {
		status string
		kind   fail.Kind // 0: no error, a generation finished with abort
	}{
		{"400", fail.Permanent},
		{"503", fail.Transient},
		{"500", fail.Transient},
		{"null", 0},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("status=%s/stream=%v", tc.status, stream), func(t *testing.T) {
				event := sglAbortEvent(tc.status, tooLong)
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path != "/generate" {
						return
					}
					if !stream {
						w.Header().Set("Content-Type", "application/json")
						fmt.Fprint(w, event)
						return
					}
					w.Header().Set("Content-Type", "text/event-stream")
					fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", event)
				}))
				t.Cleanup(srv.Close)
				c, _ := New(ProtocolSGLang, srv.URL, "m", nil)
				g, err := generate(c, Request{InputIDs: []int{1, 2, 3}}, stream)
				if tc.kind == 0 {
					if err != nil || g.FinishReason != FinishAbort {
						t.Fatalf("%+v, %v; want a generation that finished with abort", g, err)
					}
					return
				}
				if err == nil || fail.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tooLong) || !strings.Contains(err.Error(), tc.status) {
					t.Fatalf("%+v, %v; want a %v error with the status %s and the engine's message", g, err, tc.kind, tc.status)
				}
			})
		}
	}
}

// TestALostReplyIsAborted: a /generate whose reply never comes (the
// connection breaks, a proxy in between answers 502 or 504) fails the
// generation, which is then tried again; the engine, which may still be
// generating it for nobody, used to be told nothing, as a broken stream
// once was. It is now told to abort the request, by its rid, streamed or
// not: a stream whose first byte never came (a proxy that gave up on the
// engine before it answered) was not aborted while the same request not
// streamed was. A refusal the engine itself answered (503, 400) is not: it
// runs nothing.
func TestALostReplyIsAborted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply func(w http.ResponseWriter)
		abort bool
	}{
		{"connection cut", func(w http.ResponseWriter) {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		}, true},
		{"504 from a proxy", func(w http.ResponseWriter) { http.Error(w, "upstream timed out", http.StatusGatewayTimeout) }, true},
		{"502 from a proxy", func(w http.ResponseWriter) { http.Error(w, "bad gateway", http.StatusBadGateway) }, true},
		{"400 from the engine", func(w http.ResponseWriter) { http.Error(w, `{"error": {"message": "bad"}}`, http.StatusBadRequest) }, false},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				lostReplyAborted(t, tc.reply, tc.abort, stream)
			})
		}
	}
}

// lostReplyAborted runs one generation whose /generate is answered by
// reply, and checks whether the engine was told to abort it.
func lostReplyAborted(t *testing.T, reply func(w http.ResponseWriter), abort, stream bool) {
	aborted := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			RID string `json:"rid"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		switch r.URL.Path {
		case "/abort_request":
			aborted <- body.RID
		case "/generate":
			reply(w)
		}
	}))
	t.Cleanup(srv.Close)
	c, _ := New(ProtocolSGLang, srv.URL, "m", nil)
	_, err := generate(c, Request{InputIDs: []int{1, 2}, RoutingKey: "9-2"}, stream)
	if err == nil {
		t.Fatal("a generation without a reply returned no error")
	}
	select {
	case rid := <-aborted:
		if !abort {
			t.Errorf("the engine refused the request (%v) and was told to abort %q", err, rid)
		} else if !strings.HasPrefix(rid, "planact-9-2-") {
			t.Errorf("abort_request for rid %q, want the generation's (planact-9-2-…)", rid)
		}
	default:
		if abort {
			t.Errorf("the reply was lost (%v) and the engine was not told to abort the request", err)
		}
	}
}

// TestIDsWithoutAFinishReason: a reply not streamed that carries output
// ids but no finish reason used to be taken as a generation that finished
// neither by stop nor by length: its sample was complete, whatever the
// engine did. Whether it stopped, was cut at max_new_tokens or aborted is
// not known, so the reply is refused (an error that may be tried again),
// as a stream that ends without one is.
func TestIDsWithoutAFinishReason(t *testing.T) {
	for _, tc := range []struct{ proto, reply string }{
		{ProtocolSGLang, `{"text":"ab","output_ids":[5,6],"meta_info":{"finish_reason":null,"prompt_tokens":2,"completion_tokens":2,` +
			`"output_token_logprobs":[[-0.1,5,null],[-0.2,6,null]]}}`},
		{ProtocolOpenAI, `{"choices":[{"text":"ab","finish_reason":null,"token_ids":[5,6],"prompt_token_ids":[1,2]}],"usage":{"prompt_tokens":2,"completion_tokens":2}}`},
		{ProtocolOpenAIChat, `{"choices":[{"message":{"content":"ab"},"finish_reason":null,"token_ids":[5,6]}],"prompt_token_ids":[1,2],"usage":{"prompt_tokens":2,"completion_tokens":2}}`},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tc.reply) }))
			t.Cleanup(srv.Close)
			c, _ := NewClient(tc.proto, srv.URL, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
			g, err := c.Generate(context.Background(), Request{InputIDs: []int{1, 2}, Text: "q"})
			if err == nil || fail.KindOf(err) != fail.Transient || !strings.Contains(err.Error(), "no finish reason") {
				t.Fatalf("%+v, %v; want a transient error saying the reply has no finish reason", g, err)
			}
		})
	}
}

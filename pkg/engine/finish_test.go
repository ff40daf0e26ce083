package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/fail"
)

// finishReply is a reply (or the one event of a stream) of proto with two
// output ids and the finish reason reason.
func finishReply(proto, reason string, stream bool) string {
	switch proto {
	case ProtocolSGLang:
		return fmt.Sprintf(`{"text":"ab","output_ids":[5,6],"meta_info":{"finish_reason":{"type":%q},"prompt_tokens":2,"completion_tokens":2}}`, reason)
	case ProtocolOpenAI:
		return fmt.Sprintf(`{"choices":[{"text":"ab","finish_reason":%q,"token_ids":[5,6],"prompt_token_ids":[1,2]}],"usage":{"prompt_tokens":2,"completion_tokens":2}}`, reason)
	}
	content := `"message":{"content":"ab"}`
	if stream {
		content = `"delta":{"content":"ab"}`
	}
	return fmt.Sprintf(`{"prompt_token_ids":[1,2],"choices":[{%s,"finish_reason":%q,"token_ids":[5,6]}],"usage":{"prompt_tokens":2,"completion_tokens":2}}`, content, reason)
}

// TestFinishReasons: a finish reason is taken as the engine means it
// (SGLang's, vLLM's and OpenAI's words, TGI's for stop), and one that means
// neither stop, length nor abort is refused, naming it: it used to make
// the sample aborted, whatever the engine did (a tool call, a repetition
// vLLM cut, a reason planact does not know).
func TestFinishReasons(t *testing.T) {
	for _, tc := range []struct {
		reason string
		finish string    // what the generation says; "" for an error
		kind   fail.Kind // of the error
		says   string    // in the error
	}{
		{reason: "stop", finish: FinishStop},
		{reason: "length", finish: FinishLength},
		{reason: "abort", finish: FinishAbort},
		{reason: "eos_token", finish: FinishStop},
		{reason: "stop_sequence", finish: FinishStop},
		{reason: "error", kind: fail.Transient, says: `the engine failed the generation (finish reason "error")`},
		{reason: "tool_calls", kind: fail.Permanent, says: `finish reason "tool_calls": the server parsed a tool call`},
		{reason: "function_call", kind: fail.Permanent, says: `finish reason "function_call"`},
		{reason: "repetition", kind: fail.Permanent, says: `finish reason "repetition": the engine ended the generation on its repetition detection`},
		{reason: "content_filter", kind: fail.Permanent, says: `finish reason "content_filter"`},
		{reason: "cancelled", kind: fail.Permanent, says: `unknown finish reason "cancelled"`},
	} {
		for _, proto := range Protocols {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/stream=%v", tc.reason, proto, stream), func(t *testing.T) {
					url := replyServer(t, []string{finishReply(proto, tc.reason, stream)}, stream)
					c, _ := NewClient(proto, url, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
					g, err := generate(c, Request{InputIDs: []int{1, 2}, Text: "q"}, stream)
					if tc.finish != "" {
						if err != nil || g.FinishReason != tc.finish || len(g.OutputIDs) != 2 {
							t.Fatalf("%+v, %v; want a generation that finished with %s", g, err, tc.finish)
						}
						return
					}
					if err == nil || fail.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.says) {
						t.Fatalf("%+v, %v (kind %v); want a %v error saying %q", g, err, fail.KindOf(err), tc.kind, tc.says)
					}
				})
			}
		}
	}
}

// TestChatPromptCut: a chat server whose rendering of the conversation
// (prompt_token_ids) is a strict prefix of the conversation's ids, as
// planact holds them, cut the prompt (to its context length): ErrPromptCut,
// for good, never token drift. It was reported as drift, quarantining an
// episode the engine had only truncated. A rendering that differs is still
// drift.
func TestChatPromptCut(t *testing.T) {
	withNewest := []Message{
		{Role: RoleUser, Text: "q", IDs: []int{1, 2, 3}},
		{Role: RoleAssistant, Text: "a", IDs: []int{4, 5}},
		{Role: RoleUser, Text: "o", IDs: []int{6, 7}}, // as /tokenize rendered it
	}
	withoutNewest := []Message{withNewest[0], withNewest[1], {Role: RoleUser, Text: "o"}}
	for _, tc := range []struct {
		name     string
		msgs     []Message
		rendered string
		cut      string // "took of sent"; "" when not cut
		drift    bool
	}{
		{"newest known, cut in it", withNewest, "[1,2,3,4,5,6]", "first 6 of the 7 tokens", false},
		{"newest known, cut before it", withNewest, "[1,2,3,4]", "first 4 of the 7 tokens", false},
		{"newest unknown, cut before it", withoutNewest, "[1,2,3]", "first 3 of the 5 tokens of the conversation so far", false},
		{"newest known, whole", withNewest, "[1,2,3,4,5,6,7]", "", false},
		{"newest unknown, whole", withoutNewest, "[1,2,3,4,5,6,7,8]", "", false},
		{"newest known, rendered otherwise", withNewest, "[1,2,3,4,5,9]", "", true},
		{"history rendered otherwise and shorter", withNewest, "[1,2,9]", "", true},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				content := `"message":{"content":"b"}`
				if stream {
					content = `"delta":{"content":"b"}`
				}
				reply := fmt.Sprintf(`{"prompt_token_ids":%s,"choices":[{%s,"finish_reason":"stop","token_ids":[8]}],"usage":{"completion_tokens":1}}`,
					tc.rendered, content)
				url := replyServer(t, []string{reply}, stream)
				c, _ := NewClient(ProtocolOpenAIChat, url, Options{Model: "m", Backoff: Backoff{Attempts: 1}})
				g, err := generate(c, Request{Messages: tc.msgs}, stream)
				switch {
				case tc.cut != "":
					if !errors.Is(err, ErrPromptCut) || errors.Is(err, ErrTokenDrift) || fail.KindOf(err) != fail.Permanent || !strings.Contains(err.Error(), tc.cut) {
						t.Fatalf("%+v, %v; want ErrPromptCut, for good, saying %q", g, err, tc.cut)
					}
				case tc.drift:
					if !errors.Is(err, ErrTokenDrift) || errors.Is(err, ErrPromptCut) {
						t.Fatalf("%+v, %v; want token drift", g, err)
					}
				case err != nil:
					t.Fatalf("a prompt the server took whole: %v", err)
				}
			})
		}
	}
}

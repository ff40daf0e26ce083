// Package engine talks to inference engines: SGLang's native API and
// OpenAI-compatible servers (vLLM, SGLang, llama.cpp), completions and chat.
// It returns token-exact generations (output ids and their log-probs) so
// that trajectories are never re-tokenized from text, keeps an episode on
// one engine behind a router, waits out busy engines, aborts what its
// caller gave up on, and pauses engines for weight updates.
package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// Sampling holds the sampling parameters of one generation.
type Sampling struct {
	Temperature  float64  `msgpack:"temperature" json:"temperature"`
	TopP         float64  `msgpack:"top_p" json:"top_p"`
	MaxNewTokens int      `msgpack:"max_new_tokens" json:"max_new_tokens"`
	Stop         []string `msgpack:"stop,omitempty" json:"stop,omitempty"`
	Seed         int64    `msgpack:"seed,omitempty" json:"seed,omitempty"` // 0 = engine's choice
}

// Request is one generation request. InputIDs are preferred because they
// keep the trajectory token-exact; Text is used only when there are no ids.
// A chat engine (ProtocolOpenAIChat) takes Messages instead, or Text as one
// user message, and renders the prompt with its own chat template.
type Request struct {
	InputIDs []int    `msgpack:"input_ids,omitempty" json:"input_ids,omitempty"`
	Text     string   `msgpack:"text,omitempty" json:"text,omitempty"`
	Sampling Sampling `msgpack:"sampling" json:"sampling"`
	// Messages are the conversation so far, for chat engines; completion
	// engines ignore them. Every message but the last carries the ids the
	// trajectory holds for it: the engine's rendering of the conversation
	// must begin with them (see Generation.PromptIDs).
	Messages []Message `msgpack:"messages,omitempty" json:"messages,omitempty"`
	// RoutingKey keeps the requests of one episode on one engine behind a
	// router (its prefix cache holds the episode's context): sent as the
	// X-SMG-Routing-Key header, and as SGLang's routing_key. See EpisodeKey.
	RoutingKey string `msgpack:"routing_key,omitempty" json:"routing_key,omitempty"`
	// ID names the request on the engine (SGLang's rid), so that it can be
	// aborted when the caller gives up; empty, the client makes a unique one.
	ID string `msgpack:"id,omitempty" json:"id,omitempty"`
}

// Message is one turn of a conversation sent to a chat engine.
type Message struct {
	Role string `msgpack:"role" json:"role"` // RoleUser, RoleAssistant or "system"
	Text string `msgpack:"text" json:"text"`
	// IDs are the trajectory's ids of this message as the engine rendered
	// it before (the prompt's ids, a generation's ids, an observation with
	// the template's glue). For the newest message they are nil, or what
	// the engine's TokenizeChat rendered it as: the generation's prompt
	// must then be exactly the conversation's ids (ErrTokenDrift if not).
	IDs []int `msgpack:"ids,omitempty" json:"ids,omitempty"`
}

// Roles of chat messages.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// EpisodeKey is the routing key of an episode's requests, "<rollout>-<episode>":
// the planner's turns and the episode's acts share it.
func EpisodeKey(rollout int64, episode int) string {
	return strconv.FormatInt(rollout, 10) + "-" + strconv.Itoa(episode)
}

// Finish reasons of a Generation.
const (
	FinishStop   = "stop"   // EOS or a stop string
	FinishLength = "length" // max_new_tokens reached
	FinishAbort  = "abort"  // the engine aborted the request
)

// Generation is what an engine produced for one request.
type Generation struct {
	Text      string    `msgpack:"text" json:"text"`
	OutputIDs []int     `msgpack:"output_ids" json:"output_ids"`
	LogProbs  []float64 `msgpack:"log_probs" json:"log_probs"` // one per output id, or none
	// LogProbsMissing says why LogProbs is nil although tokens were
	// generated: the engine returned none, or not one for every token. A
	// log-prob the engine did not return is absent, never a zero.
	LogProbsMissing string        `msgpack:"log_probs_missing,omitempty" json:"log_probs_missing,omitempty"`
	FinishReason    string        `msgpack:"finish_reason" json:"finish_reason"`
	PromptTokens    int           `msgpack:"prompt_tokens" json:"prompt_tokens"`
	WeightVersion   string        `msgpack:"weight_version,omitempty" json:"weight_version,omitempty"`
	Latency         time.Duration `msgpack:"latency" json:"latency"`
	// PromptIDs are the ids the engine reports it generated from, where it
	// reports them: a chat engine renders the prompt itself, and its ids
	// begin with those of every message but the last (checked); the rest
	// is the last message as the chat template wrote it, the trajectory's
	// ids for that message. vLLM's completions return them too, and they
	// equal the ids sent (checked). Any other input is ErrTokenDrift.
	PromptIDs []int `msgpack:"prompt_ids,omitempty" json:"prompt_ids,omitempty"`
}

// PauseMode says what a paused engine does with the requests it is running.
type PauseMode string

// Pause modes. SGLang's /pause_generation knows abort, in_place and retract;
// vLLM's /pause knows abort, wait and keep (PauseInPlace).
const (
	PauseAbort   PauseMode = "abort"    // running requests end now, finish reason abort
	PauseInPlace PauseMode = "in_place" // running requests hold where they are until Resume
	PauseRetract PauseMode = "retract"  // running requests go back to the queue (their cache is freed) until Resume
	PauseWait    PauseMode = "wait"     // running requests finish; new ones wait for Resume
)

// ErrNotSupported is returned (wrapped, permanent) by an operation the
// engine's protocol or server does not have.
var ErrNotSupported = errors.New("not supported by the engine")

// Client is an inference engine.
type Client interface {
	Generate(ctx context.Context, r Request) (Generation, error)
	// Tokenize uses the engine's own tokenizer endpoint, without special tokens.
	Tokenize(ctx context.Context, text string) ([]int, error)
	Health(ctx context.Context) error
	// Pause stops the engine generating, as mode says, until Resume: for a
	// weight update. Requests sent meanwhile wait on the engine.
	Pause(ctx context.Context, mode PauseMode) error
	// Resume lets a paused engine generate again.
	Resume(ctx context.Context) error
	// WeightVersion is the version of the weights the engine serves now.
	WeightVersion(ctx context.Context) (string, error)
}

// Streamer is a Client that can report the text while it is generated.
// onChunk receives the whole text generated so far, never a delta.
type Streamer interface {
	Client
	GenerateStream(ctx context.Context, r Request, onChunk func(textSoFar string)) (Generation, error)
}

// Protocols understood by New.
const (
	ProtocolSGLang     = "sglang"      // SGLang's native /generate
	ProtocolOpenAI     = "openai"      // /v1/completions with token ids as the prompt
	ProtocolOpenAIChat = "openai-chat" // /v1/chat/completions: the server applies its chat template
)

// Protocols lists every protocol New understands.
var Protocols = []string{ProtocolSGLang, ProtocolOpenAI, ProtocolOpenAIChat}

// Options configure a client.
type Options struct {
	Model   string       // sent in OpenAI requests
	HTTP    *http.Client // nil means http.DefaultClient
	Backoff Backoff      // how a busy engine (429, 503) is waited out
}

// New returns a client for the engine at url. protocol is "sglang" (the
// default when empty), "openai" or "openai-chat"; model is sent in OpenAI
// requests. A nil hc means http.DefaultClient.
func New(protocol, url, model string, hc *http.Client) (Client, error) {
	return NewClient(protocol, url, Options{Model: model, HTTP: hc})
}

// NewClient is New with every option.
func NewClient(protocol, url string, o Options) (Client, error) {
	hc := o.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	protocol, base := endpoint(protocol, url)
	if base == "" {
		return nil, fail.Invalidf("engine: empty url")
	}
	c := conn{base: base, hc: hc, backoff: o.Backoff.withDefaults(), absent: &absentPaths{}}
	switch protocol {
	case ProtocolSGLang:
		return &SGLang{conn: c}, nil
	case ProtocolOpenAI:
		return &OpenAI{conn: c, model: o.Model}, nil
	case ProtocolOpenAIChat:
		return &Chat{conn: c, model: o.Model}, nil
	default:
		return nil, fail.Invalidf("engine: unknown protocol %q (want %s)", protocol, strings.Join(Protocols, ", "))
	}
}

// endpoint is the protocol a client speaks (the default named) and the
// base URL it builds its requests on: without trailing slashes, and
// without an OpenAI-compatible server's /v1 (its paths carry it).
func endpoint(protocol, url string) (string, string) {
	if protocol == "" {
		protocol = ProtocolSGLang
	}
	url = strings.TrimRight(url, "/")
	if protocol == ProtocolOpenAI || protocol == ProtocolOpenAIChat {
		url = strings.TrimSuffix(url, "/v1")
	}
	return protocol, url
}

// ErrPromptCut is in the chain of the error of a generation whose engine
// says it took fewer prompt tokens than it was sent: it cut the prompt
// (to its context length), so the tokens it generated from are not the
// trajectory that would be trained on.
var ErrPromptCut = errors.New("the engine cut the prompt")

// promptCut refuses, for good, a generation whose engine took only took of
// the sent prompt tokens.
func promptCut(took, sent int) error {
	return cutPrompt(fmt.Sprintf("it took %d of the %d prompt tokens it was sent", took, sent))
}

// cutPrompt refuses, for good, a generation whose engine cut its prompt,
// as took says.
func cutPrompt(took string) error {
	return fail.E(fail.Permanent, fmt.Errorf("%w: %s (it cuts prompts longer than its context length, "+
		"as SGLang's --allow-auto-truncate does): what it generated from is not the trajectory; raise the engine's context length, or lower max_context_tokens",
		ErrPromptCut, took))
}

func checkRequest(r Request) error {
	if len(r.InputIDs) == 0 && r.Text == "" && len(r.Messages) == 0 {
		return fail.Invalidf("engine: request has neither input ids nor text")
	}
	return nil
}

// readSSE calls fn with the payload of every "data:" line of a server-sent
// event stream until "data: [DONE]" or the end of the body.
func readSSE(body io.Reader, fn func(data []byte) error) error {
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				data = bytes.TrimSpace(data)
				if string(data) == "[DONE]" {
					return nil
				}
				if len(data) > 0 {
					if err := fn(data); err != nil {
						return err
					}
				}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// replyError is the error a reply (or an event of a stream) carries in its
// "error" field, or nil when it has none (absent or null): the engine
// failed the generation, and another try may not.
func replyError(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return fail.Transientf("engine error: %s", raw)
}

// errSaysNothing refuses a reply with no output ids that names no finish
// reason: an empty reply is no evidence of an empty generation, and a
// count of 0 generated tokens says how many, not that the engine finished,
// nor whether it stopped, reached max_new_tokens or aborted the request.
func errSaysNothing() error {
	return fail.Transientf("the reply has no output ids and no finish reason: nothing says that the engine finished the generation, " +
		"nor whether it stopped, reached max_new_tokens or aborted the request (a count of 0 generated tokens does not)")
}

// checkFinished refuses a generation whose reply names no finish reason:
// whether the engine stopped, was cut at max_new_tokens or aborted the
// request is what marks a sample complete, truncated or aborted, and
// nothing says which. A stream's last event names it; a reply that does
// not is cut short, or not the engine's.
func checkFinished(g Generation) error {
	switch {
	case g.FinishReason != "":
		return nil
	case len(g.OutputIDs) == 0:
		return errSaysNothing()
	}
	return fail.Transientf("the reply has %d output ids but no finish reason: whether the engine stopped, "+
		"reached max_new_tokens or aborted the request is not known", len(g.OutputIDs))
}

// checkLength refuses a generation of more tokens than r asked for at
// most (its max_new_tokens; 0 asks for no limit): the engine did not do
// what it was asked, and the sample would hold more than the trajectory
// had room for (a gateway fits max_new_tokens to max_context_tokens).
func checkLength(r Request, g Generation) error {
	if most := r.Sampling.MaxNewTokens; most > 0 && len(g.OutputIDs) > most {
		return fail.Permanentf("the engine generated %d tokens, more than the %d of max_new_tokens it was asked for: "+
			"the sample would not fit the context it was promised; see that the server (or a proxy before it) keeps the request's max_tokens",
			len(g.OutputIDs), most)
	}
	return nil
}

// finishReason is the finish reason an engine reports (s) as stop, length
// or abort, as the engine means it; "" where it names none, which the
// caller refuses. The engines' words: SGLang's finish_reason type (stop,
// length, abort: schedule_batch.py FINISH_*.to_json), vLLM's (stop,
// length, abort, error, repetition: vllm/v1/engine FINISH_REASON_STRINGS),
// OpenAI's (stop, length, tool_calls, function_call, content_filter) and
// TGI's (eos_token, stop_sequence). The reason marks the sample complete,
// truncated or aborted, so a reason that means none of the three is
// refused, naming it, never taken for one.
func finishReason(s string) (string, error) {
	switch s {
	case "", FinishStop, FinishLength, FinishAbort:
		return s, nil
	case "eos_token", "stop_sequence":
		// TGI's stop: the model wrote EOS, or a stop string.
		return FinishStop, nil
	case "error":
		// vLLM's request-level internal error (a KV load failure), which
		// it means to be tried again.
		return "", fail.Transientf("the engine failed the generation (finish reason %q)", s)
	case "tool_calls", "function_call":
		return "", fail.Permanentf("finish reason %q: the server parsed a tool call out of the generation, which planact never asks for (it sends no tools): "+
			"the text it returns is not what the model wrote; run the server without a tool-call parser", s)
	case "repetition":
		return "", fail.Permanentf("finish reason %q: the engine ended the generation on its repetition detection (vLLM's repetition_detection), "+
			"a limit planact never asks for, so the sample would be cut where nothing it knows says; turn the detection off", s)
	case "content_filter":
		return "", fail.Permanentf("finish reason %q: the server's content filter withheld or cut the generation: what it returns is not what the model generated", s)
	}
	return "", fail.Permanentf("unknown finish reason %q (want stop, length or abort): "+
		"whether the engine stopped, reached max_new_tokens or aborted the request is not known", s)
}

// Package engine talks to inference engines: SGLang's native API and
// OpenAI-compatible servers (vLLM, SGLang, llama.cpp). It returns token-exact
// generations (output ids and their log-probs) so that trajectories are
// never re-tokenized from text.
package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
type Request struct {
	InputIDs []int    `msgpack:"input_ids,omitempty" json:"input_ids,omitempty"`
	Text     string   `msgpack:"text,omitempty" json:"text,omitempty"`
	Sampling Sampling `msgpack:"sampling" json:"sampling"`
}

// Finish reasons of a Generation.
const (
	FinishStop   = "stop"   // EOS or a stop string
	FinishLength = "length" // max_new_tokens reached
	FinishAbort  = "abort"  // the engine aborted the request
)

// Generation is what an engine produced for one request.
type Generation struct {
	Text          string        `msgpack:"text" json:"text"`
	OutputIDs     []int         `msgpack:"output_ids" json:"output_ids"`
	LogProbs      []float64     `msgpack:"log_probs" json:"log_probs"` // one per output id
	FinishReason  string        `msgpack:"finish_reason" json:"finish_reason"`
	PromptTokens  int           `msgpack:"prompt_tokens" json:"prompt_tokens"`
	WeightVersion string        `msgpack:"weight_version,omitempty" json:"weight_version,omitempty"`
	Latency       time.Duration `msgpack:"latency" json:"latency"`
}

// Client is an inference engine.
type Client interface {
	Generate(ctx context.Context, r Request) (Generation, error)
	// Tokenize uses the engine's own tokenizer endpoint, without special tokens.
	Tokenize(ctx context.Context, text string) ([]int, error)
	Health(ctx context.Context) error
}

// Streamer is a Client that can report the text while it is generated.
// onChunk receives the whole text generated so far, never a delta.
type Streamer interface {
	Client
	GenerateStream(ctx context.Context, r Request, onChunk func(textSoFar string)) (Generation, error)
}

// Protocols understood by New.
const (
	ProtocolSGLang = "sglang"
	ProtocolOpenAI = "openai"
)

// New returns a client for the engine at url. protocol is "sglang" (the
// default when empty) or "openai"; model is sent in OpenAI requests. A nil
// hc means http.DefaultClient.
func New(protocol, url, model string, hc *http.Client) (Client, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	url = strings.TrimRight(url, "/")
	if url == "" {
		return nil, fail.Invalidf("engine: empty url")
	}
	switch protocol {
	case "", ProtocolSGLang:
		return &SGLang{base: url, hc: hc}, nil
	case ProtocolOpenAI:
		return &OpenAI{base: strings.TrimSuffix(url, "/v1"), model: model, hc: hc}, nil
	default:
		return nil, fail.Invalidf("engine: unknown protocol %q (want sglang or openai)", protocol)
	}
}

func checkRequest(r Request) error {
	if len(r.InputIDs) == 0 && r.Text == "" {
		return fail.Invalidf("engine: request has neither input ids nor text")
	}
	return nil
}

// do sends a JSON request and returns the response for the caller to read;
// the body is closed unless the status is 200. Errors are classified:
// transport errors, time-outs, 408, 429 and 5xx are transient, other
// statuses permanent.
func do(ctx context.Context, hc *http.Client, method, url string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, fail.E(fail.Invalid, fmt.Errorf("encode request: %w", err))
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, fail.Permanentf("%s %s: %w", method, url, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// Deadline counts as transient, cancellation as unknown (fail.KindOf).
			return nil, fmt.Errorf("%s %s: %w", method, url, ctx.Err())
		}
		return nil, fail.Transientf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	return nil, statusError(method+" "+url, resp.StatusCode, msg)
}

func statusError(op string, status int, body []byte) error {
	err := fmt.Errorf("%s: %d %s: %s", op, status, http.StatusText(status), bytes.TrimSpace(body))
	if status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500 {
		return fail.E(fail.Transient, err)
	}
	return fail.E(fail.Permanent, err)
}

// doJSON sends in and decodes a 200 reply into out.
func doJSON(ctx context.Context, hc *http.Client, method, url string, in, out any) error {
	resp, err := do(ctx, hc, method, url, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		// A cut connection shows up here too, so retrying is reasonable.
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, url, ctx.Err())
		}
		return fail.Transientf("%s %s: decode reply: %w", method, url, err)
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

// normalizeFinish maps engine-specific finish reasons to stop, length or abort.
func normalizeFinish(s string) string {
	switch s {
	case "":
		return ""
	case FinishStop, FinishLength, FinishAbort:
		return s
	default: // content_filter, error, cancelled, ...
		return FinishAbort
	}
}

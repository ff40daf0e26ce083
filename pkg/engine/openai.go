package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// OpenAI is a client for OpenAI-compatible servers (vLLM, SGLang, llama.cpp)
// through the legacy completions endpoint, which accepts token ids as prompt.
//
// Wire contract relied on:
//
//	POST /v1/completions {"model","prompt": "…" | [ids…],"max_tokens","temperature","top_p",
//	                      "stop","seed"?, "logprobs":1, "return_tokens_as_token_ids":true,
//	                      "return_token_ids":true, "stream"?, "stream_options"?:{"include_usage":true}}
//	  reply  {"choices":[{"text","finish_reason","logprobs":{"tokens":[…],"token_logprobs":[…]},
//	          "token_ids"?:[…]}], "usage":{"prompt_tokens","completion_tokens"},
//	          "metadata"?:{"weight_version"}}
//	  streaming: "data: {chunk}" with per-chunk deltas of text, logprobs and token_ids,
//	          the finish_reason in the last choice chunk, usage in a final chunk, "data: [DONE]".
//	POST /tokenize {"model","prompt","add_special_tokens":false} -> {"tokens":[…]} (vLLM, SGLang)
//	GET  /health
//
// Output ids come from choices[].token_ids (vLLM return_token_ids) or, failing
// that, from logprobs.tokens written as "token_id:<id>" (vLLM
// return_tokens_as_token_ids). A server that returns neither yields a
// Generation without OutputIDs; token-exact callers must treat that as an error.
// The two vLLM extensions are ignored by servers that do not know them.
type OpenAI struct {
	base  string
	model string
	hc    *http.Client
}

type oaiRequest struct {
	Model                  string         `json:"model"`
	Prompt                 any            `json:"prompt"`
	MaxTokens              int            `json:"max_tokens,omitempty"`
	Temperature            float64        `json:"temperature"`
	TopP                   float64        `json:"top_p,omitempty"`
	Stop                   []string       `json:"stop,omitempty"`
	Seed                   int64          `json:"seed,omitempty"`
	Logprobs               int            `json:"logprobs"`
	ReturnTokensAsTokenIDs bool           `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool           `json:"return_token_ids"`
	Stream                 bool           `json:"stream,omitempty"`
	StreamOptions          map[string]any `json:"stream_options,omitempty"`
}

type oaiChoice struct {
	Text         string `json:"text"`
	FinishReason string `json:"finish_reason"`
	Logprobs     *struct {
		Tokens        []string   `json:"tokens"`
		TokenLogprobs []*float64 `json:"token_logprobs"`
	} `json:"logprobs"`
	TokenIDs []int `json:"token_ids"`
}

type oaiReply struct {
	Choices []oaiChoice `json:"choices"`
	Usage   *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
	Metadata *struct {
		WeightVersion json.RawMessage `json:"weight_version"`
	} `json:"metadata"`
	Error json.RawMessage `json:"error"`
}

func (c *OpenAI) request(r Request, stream bool) oaiRequest {
	in := oaiRequest{
		Model:                  c.model,
		MaxTokens:              r.Sampling.MaxNewTokens,
		Temperature:            r.Sampling.Temperature,
		TopP:                   r.Sampling.TopP,
		Stop:                   r.Sampling.Stop,
		Seed:                   r.Sampling.Seed,
		Logprobs:               1,
		ReturnTokensAsTokenIDs: true,
		ReturnTokenIDs:         true,
		Stream:                 stream,
	}
	if stream {
		in.StreamOptions = map[string]any{"include_usage": true}
	}
	if len(r.InputIDs) > 0 {
		in.Prompt = r.InputIDs
	} else {
		in.Prompt = r.Text
	}
	return in
}

// Generate runs one generation with POST /v1/completions.
func (c *OpenAI) Generate(ctx context.Context, r Request) (Generation, error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	start := time.Now()
	var out oaiReply
	if err := doJSON(ctx, c.hc, http.MethodPost, c.base+"/v1/completions", c.request(r, false), &out); err != nil {
		return Generation{}, fmt.Errorf("openai completions: %w", err)
	}
	if len(out.Choices) == 0 {
		return Generation{}, fail.Transientf("openai completions: reply has no choices")
	}
	var acc oaiAccumulator
	acc.add(&out)
	g, err := acc.generation()
	if err != nil {
		return Generation{}, fmt.Errorf("openai completions: %w", err)
	}
	g.Latency = time.Since(start)
	return g, nil
}

// GenerateStream runs one streamed completion, calling onChunk with the
// cumulative text after every event.
func (c *OpenAI) GenerateStream(ctx context.Context, r Request, onChunk func(string)) (Generation, error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	start := time.Now()
	resp, err := do(ctx, c.hc, http.MethodPost, c.base+"/v1/completions", c.request(r, true))
	if err != nil {
		return Generation{}, fmt.Errorf("openai completions stream: %w", err)
	}
	defer resp.Body.Close()
	var acc oaiAccumulator
	err = readSSE(resp.Body, func(data []byte) error {
		var ev oaiReply
		if err := json.Unmarshal(data, &ev); err != nil {
			return fail.Transientf("decode event %.200q: %w", data, err)
		}
		if len(ev.Error) > 0 && string(ev.Error) != "null" {
			return fail.Transientf("engine error: %s", ev.Error)
		}
		before := acc.text.Len()
		acc.add(&ev)
		if onChunk != nil && acc.text.Len() != before {
			onChunk(acc.text.String())
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Generation{}, fmt.Errorf("openai completions stream: %w", ctx.Err())
		}
		if fail.KindOf(err) == fail.Unknown {
			err = fail.E(fail.Transient, err)
		}
		return Generation{}, fmt.Errorf("openai completions stream: %w", err)
	}
	g, err := acc.generation()
	if err != nil {
		return Generation{}, fmt.Errorf("openai completions stream: %w", err)
	}
	if g.FinishReason == "" {
		return Generation{}, fail.Transientf("openai completions stream: stream ended without a finish reason")
	}
	g.Latency = time.Since(start)
	return g, nil
}

// oaiAccumulator joins a reply, or the deltas of a stream, into a Generation.
type oaiAccumulator struct {
	text          strings.Builder
	tokens        []string
	logprobs      []float64
	tokenIDs      []int
	finish        string
	promptTokens  int
	weightVersion string
}

func (a *oaiAccumulator) add(r *oaiReply) {
	if r.Usage != nil {
		a.promptTokens = r.Usage.PromptTokens
	}
	if r.Metadata != nil {
		if v := rawString(r.Metadata.WeightVersion); v != "" {
			a.weightVersion = v
		}
	}
	if len(r.Choices) == 0 {
		return
	}
	ch := r.Choices[0]
	a.text.WriteString(ch.Text)
	if ch.Logprobs != nil {
		a.tokens = append(a.tokens, ch.Logprobs.Tokens...)
		for _, lp := range ch.Logprobs.TokenLogprobs {
			v := 0.0
			if lp != nil {
				v = *lp
			}
			a.logprobs = append(a.logprobs, v)
		}
	}
	a.tokenIDs = append(a.tokenIDs, ch.TokenIDs...)
	if ch.FinishReason != "" {
		a.finish = ch.FinishReason
	}
}

func (a *oaiAccumulator) generation() (Generation, error) {
	g := Generation{
		Text:          a.text.String(),
		LogProbs:      a.logprobs,
		FinishReason:  normalizeFinish(a.finish),
		PromptTokens:  a.promptTokens,
		WeightVersion: a.weightVersion,
	}
	switch {
	case len(a.tokenIDs) > 0:
		g.OutputIDs = a.tokenIDs
	case len(a.tokens) > 0:
		ids := make([]int, 0, len(a.tokens))
		for _, t := range a.tokens {
			s, ok := strings.CutPrefix(t, "token_id:")
			if !ok {
				ids = nil // the server does not know return_tokens_as_token_ids
				break
			}
			id, err := strconv.Atoi(s)
			if err != nil {
				return Generation{}, fail.Transientf("bad token %q", t)
			}
			ids = append(ids, id)
		}
		g.OutputIDs = ids
	}
	if g.OutputIDs != nil && len(g.LogProbs) > 0 && len(g.LogProbs) != len(g.OutputIDs) {
		return Generation{}, fail.Transientf("%d output ids but %d log-probs", len(g.OutputIDs), len(g.LogProbs))
	}
	return g, nil
}

// Tokenize calls the server's /tokenize (vLLM, SGLang) without special tokens.
func (c *OpenAI) Tokenize(ctx context.Context, text string) ([]int, error) {
	return tokenize(ctx, c.hc, c.base, c.model, text)
}

// Health calls GET /health.
func (c *OpenAI) Health(ctx context.Context) error {
	if err := doJSON(ctx, c.hc, http.MethodGet, c.base+"/health", nil, nil); err != nil {
		return fmt.Errorf("openai health: %w", err)
	}
	return nil
}

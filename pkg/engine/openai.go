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
// A routing key goes in the X-SMG-Routing-Key header. When the caller's
// context ends, closing the connection is the abort: vLLM and SGLang abort
// a request whose client disconnects.
//
// Output ids come from choices[].token_ids (vLLM return_token_ids) or, failing
// that, from logprobs.tokens written as "token_id:<id>" (vLLM
// return_tokens_as_token_ids). A server that returns neither is refused for
// good: its text cannot be turned back into the tokens the model generated.
// The two vLLM extensions are ignored by servers that do not know them.
// Log-probs the server did not return (no logprobs, a null among them) are
// absent, with the reason in Generation.LogProbsMissing.
type OpenAI struct {
	conn
	model string
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
	TokenIDs tokenIDs `json:"token_ids"`
	// PromptTokenIDs: vLLM's completions return the prompt's ids on the
	// choice (return_token_ids), in the first chunk of a stream.
	PromptTokenIDs promptTokenIDs `json:"prompt_token_ids"`
}

type oaiUsage struct {
	PromptTokens     int  `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens"`
}

// oaiMetadata is where SGLang's OpenAI-compatible server reports the
// weight version.
type oaiMetadata struct {
	WeightVersion json.RawMessage `json:"weight_version"`
}

type oaiReply struct {
	Choices  []oaiChoice     `json:"choices"`
	Usage    *oaiUsage       `json:"usage"`
	Metadata *oaiMetadata    `json:"metadata"`
	Error    json.RawMessage `json:"error"`
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
	if err := c.doJSON(ctx, http.MethodPost, "/v1/completions", c.request(r, false), &out, routingHeader(r.RoutingKey)); err != nil {
		return Generation{}, fmt.Errorf("openai completions: %w", err)
	}
	if err := replyError(out.Error); err != nil {
		return Generation{}, fmt.Errorf("openai completions: %w", err)
	}
	if len(out.Choices) == 0 {
		return Generation{}, fail.Transientf("openai completions: reply has no choices")
	}
	var acc oaiAccumulator
	acc.add(&out)
	g, err := acc.generation()
	if err == nil {
		err = acc.requireIDs(g)
	}
	if err == nil {
		err = checkFinished(g)
	}
	if err == nil {
		err = checkConsumed(r, g)
	}
	if err == nil {
		err = checkLength(r, g)
	}
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
	resp, err := c.do(ctx, http.MethodPost, "/v1/completions", c.request(r, true), routingHeader(r.RoutingKey))
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
		if err := replyError(ev.Error); err != nil {
			return err
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
	if err == nil {
		err = acc.requireIDs(g)
	}
	if err == nil {
		err = checkConsumed(r, g)
	}
	if err == nil {
		err = checkLength(r, g)
	}
	if err != nil {
		return Generation{}, fmt.Errorf("openai completions stream: %w", err)
	}
	if g.FinishReason == "" {
		return Generation{}, fail.Transientf("openai completions stream: stream ended without a finish reason")
	}
	g.Latency = time.Since(start)
	return g, nil
}

// oaiAccumulator joins a reply, or the deltas of a stream, into a
// Generation: completions and chat completions alike.
type oaiAccumulator struct {
	text          strings.Builder
	tokens        []string
	logprobs      []float64
	missing       int // log-probs that were null: 0 in logprobs, and no value
	tokenIDs      []int
	finish        string
	promptTokens  int
	completion    int  // completion_tokens, as the usage says
	completionSet bool // the usage said completion_tokens
	// idless counts the choices (a stream's chunks) that came with text
	// but without its ids: neither token_ids nor "token_id:<id>" tokens.
	idless        int
	promptIDs     []int
	weightVersion string
}

func (a *oaiAccumulator) add(r *oaiReply) {
	a.envelope(r.Usage, r.Metadata)
	if len(r.Choices) == 0 {
		return
	}
	ch := r.Choices[0]
	if ch.PromptTokenIDs != nil && a.promptIDs == nil {
		a.promptIDs = ch.PromptTokenIDs
	}
	var tokens []string
	var lps []*float64
	if ch.Logprobs != nil {
		tokens, lps = ch.Logprobs.Tokens, ch.Logprobs.TokenLogprobs
	}
	a.choice(ch.Text, tokens, lps, ch.TokenIDs, ch.FinishReason)
}

// envelope takes what a reply says besides its choices.
func (a *oaiAccumulator) envelope(usage *oaiUsage, meta *oaiMetadata) {
	if usage != nil {
		a.promptTokens = usage.PromptTokens
		if usage.CompletionTokens != nil {
			a.completion, a.completionSet = *usage.CompletionTokens, true
		}
	}
	if meta != nil {
		if v := rawString(meta.WeightVersion); v != "" {
			a.weightVersion = v
		}
	}
}

// choice adds one choice's text, tokens, log-probs and ids (deltas when
// streaming).
func (a *oaiAccumulator) choice(text string, tokens []string, lps []*float64, ids []int, finish string) {
	a.text.WriteString(text)
	if text != "" && len(ids) == 0 {
		if named, _ := logprobTokenIDs(tokens); len(named) == 0 {
			a.idless++
		}
	}
	a.tokens = append(a.tokens, tokens...)
	for _, lp := range lps {
		v := 0.0
		if lp != nil {
			v = *lp
		} else {
			a.missing++
		}
		a.logprobs = append(a.logprobs, v)
	}
	a.tokenIDs = append(a.tokenIDs, ids...)
	if finish != "" {
		a.finish = finish
	}
}

func (a *oaiAccumulator) generation() (Generation, error) {
	finish, err := finishReason(a.finish)
	if err != nil {
		return Generation{}, err
	}
	g := Generation{
		Text:          a.text.String(),
		LogProbs:      a.logprobs,
		FinishReason:  finish,
		PromptTokens:  a.promptTokens,
		WeightVersion: a.weightVersion,
		PromptIDs:     a.promptIDs,
	}
	switch {
	case len(a.tokenIDs) > 0:
		g.OutputIDs = a.tokenIDs
		// The reply names its tokens twice: where they disagree, the
		// log-probs are not those of the ids, and neither is known to be
		// the generation.
		if ids, err := logprobTokenIDs(a.tokens); err == nil && len(ids) == len(a.tokenIDs) {
			if at := firstDiff(a.tokenIDs, ids); at < len(ids) {
				return Generation{}, fail.Transientf("token_ids[%d] is %d but the log-prob token there is %q: "+
					"the reply does not say which tokens were generated", at, a.tokenIDs[at], a.tokens[at])
			}
		}
	case len(a.tokens) > 0:
		ids, err := logprobTokenIDs(a.tokens)
		if err != nil {
			return Generation{}, err
		}
		g.OutputIDs = ids
	}
	if g.OutputIDs != nil && a.completionSet && len(g.OutputIDs) != a.completion {
		// A chunk of the stream came without its ids (neither token_ids
		// nor "token_id:<id>" log-prob tokens): the ids returned are not
		// the generation, and nothing says which tokens are missing.
		return Generation{}, fail.Transientf("%d output ids but usage.completion_tokens %d: the server did not return the ids of every generated token",
			len(g.OutputIDs), a.completion)
	}
	if len(g.OutputIDs) > 0 && a.idless > 0 {
		// Text the model wrote came without its ids: the ids returned
		// are not the generation, though no usage says how many tokens
		// it had.
		return Generation{}, fail.Transientf("%d chunks of the reply came with text but no token ids (neither token_ids nor \"token_id:<id>\" log-prob tokens): "+
			"the %d output ids returned are not the generation", a.idless, len(g.OutputIDs))
	}
	if g.OutputIDs != nil && len(g.LogProbs) > len(g.OutputIDs) {
		return Generation{}, fail.Transientf("%d output ids but %d log-probs", len(g.OutputIDs), len(g.LogProbs))
	}
	switch {
	case len(g.LogProbs) > 0 && len(g.LogProbs) < len(g.OutputIDs):
		// Some chunks of a stream came without theirs: which tokens they
		// belong to is not known, so none is kept.
		g.LogProbs = nil
		g.LogProbsMissing = fmt.Sprintf("the server returned log-probs for %d of %d output tokens", len(a.logprobs), len(g.OutputIDs))
	case a.missing > 0:
		g.LogProbs = nil
		g.LogProbsMissing = fmt.Sprintf("the server returned no log-prob for %d of %d output tokens (null in logprobs)", a.missing, len(a.logprobs))
	case len(g.LogProbs) == 0 && len(g.OutputIDs) > 0:
		g.LogProbs = nil
		g.LogProbsMissing = "the server returned no log-probs, although logprobs was asked for"
	}
	return g, nil
}

// logprobTokenIDs reads the ids of log-prob tokens written "token_id:<id>"
// (vLLM's return_tokens_as_token_ids); nil when one is not so written (the
// server does not know the option).
func logprobTokenIDs(tokens []string) ([]int, error) {
	ids := make([]int, 0, len(tokens))
	for _, t := range tokens {
		s, ok := strings.CutPrefix(t, "token_id:")
		if !ok {
			return nil, nil
		}
		id, err := strconv.Atoi(s)
		if err != nil {
			return nil, fail.Transientf("bad token %q", t)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// generated reports whether the reply says that tokens were generated.
func (a *oaiAccumulator) generated(g Generation) bool {
	return g.Text != "" || len(a.tokens) > 0 || a.completion > 0
}

// requireIDs refuses a completion whose output ids the server did not
// return: its text cannot be turned back into the tokens the model
// generated. Without ids and without text, the reply must name a finish
// reason: only then did the engine generate nothing.
func (a *oaiAccumulator) requireIDs(g Generation) error {
	switch {
	case g.OutputIDs != nil:
		return nil
	case !a.generated(g):
		if g.FinishReason == "" {
			return errSaysNothing()
		}
		return nil
	}
	return fail.Permanentf("the server returned no output token ids: planact asks for them with return_token_ids (vLLM) and with " +
		"return_tokens_as_token_ids and logprobs (vLLM writes each log-prob token as \"token_id:<id>\"; `vllm serve --return-tokens-as-token-ids` does it for every request), " +
		"and this server honoured neither: the text cannot be turned back into the tokens the model generated, so the sample would not be token-exact; " +
		"use a server that returns ids (vLLM), or the sglang protocol")
}

// Tokenize calls the server's /tokenize (vLLM, SGLang) without special tokens.
func (c *OpenAI) Tokenize(ctx context.Context, text string) ([]int, error) {
	return c.tokenize(ctx, c.model, text)
}

// Health calls GET /health.
func (c *OpenAI) Health(ctx context.Context) error {
	if err := c.health(ctx); err != nil {
		return fmt.Errorf("openai health: %w", err)
	}
	return nil
}

// Pause calls vLLM's POST /pause?mode= (abort, wait, or keep for
// in_place), else SGLang's POST /pause_generation; ErrNotSupported when the
// server has neither.
func (c *OpenAI) Pause(ctx context.Context, mode PauseMode) error {
	return c.openaiPause(ctx, "openai pause", mode)
}

// Resume calls vLLM's POST /resume, else SGLang's POST /continue_generation.
func (c *OpenAI) Resume(ctx context.Context) error {
	return c.openaiResume(ctx, "openai resume")
}

// WeightVersion asks SGLang's GET /get_weight_version; vLLM has no such
// thing (ErrNotSupported).
func (c *OpenAI) WeightVersion(ctx context.Context) (string, error) {
	return c.weightVersion(ctx, "openai weight version")
}

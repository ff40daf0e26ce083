package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// Chat is a client for OpenAI-compatible chat servers: POST
// /v1/chat/completions, where the server renders the prompt with its own
// chat template. It stays token-exact only with the ids the server returns:
//
//	POST /v1/chat/completions {"model","messages":[{"role","content"}],"max_tokens","temperature",
//	                           "top_p","stop","seed"?,"logprobs":true,"return_token_ids":true,
//	                           "return_tokens_as_token_ids":true,"stream"?,"stream_options"?}
//	  reply  {"choices":[{"message":{"role","content"},"finish_reason",
//	          "logprobs":{"content":[{"token","logprob",…},…]},"token_ids":[…]}],
//	          "prompt_token_ids":[…],"usage":{"prompt_tokens",…},"metadata"?:{"weight_version"}}
//	  streaming: "data: {chunk}", prompt_token_ids in the first chunk, per chunk
//	          choices[].delta.content, logprobs.content and token_ids deltas; usage last.
//
// That is vLLM's protocol (vllm/entrypoints/openai/chat_completion/protocol.py:
// ChatCompletionRequest.return_token_ids, ChatCompletionResponse.prompt_token_ids,
// ChatCompletionResponseChoice.token_ids, ChatCompletionStreamResponse.prompt_token_ids
// "only in the first chunk"). Output ids come from token_ids, else from
// log-prob tokens written "token_id:<id>" (return_tokens_as_token_ids).
//
// A conversation is token-exact only if the server's rendering of it (its
// prompt_token_ids) begins with the ids the trajectory already holds: the
// prompt as it was rendered before, every generation's own ids (which end
// with the end-of-turn token the template writes too), and every
// observation as it was rendered. A template that re-tokenizes history
// (merges tokens across a message boundary, drops <think> from earlier
// turns, trims whitespace) breaks that, and so does a reply without ids;
// both are permanent errors that name the cause. The server must run
// without a reasoning or tool-call parser, which move text out of content.
type Chat struct {
	conn
	model string
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model                  string         `json:"model"`
	Messages               []chatMessage  `json:"messages"`
	MaxTokens              int            `json:"max_tokens,omitempty"`
	Temperature            float64        `json:"temperature"`
	TopP                   float64        `json:"top_p,omitempty"`
	Stop                   []string       `json:"stop,omitempty"`
	Seed                   int64          `json:"seed,omitempty"`
	Logprobs               bool           `json:"logprobs"`
	ReturnTokenIDs         bool           `json:"return_token_ids"`
	ReturnTokensAsTokenIDs bool           `json:"return_tokens_as_token_ids"`
	Stream                 bool           `json:"stream,omitempty"`
	StreamOptions          map[string]any `json:"stream_options,omitempty"`
}

type chatChoice struct {
	Message *struct {
		Content *string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Content *string `json:"content"`
	} `json:"delta"`
	Logprobs *struct {
		Content []struct {
			Token   string   `json:"token"`
			Logprob *float64 `json:"logprob"`
		} `json:"content"`
	} `json:"logprobs"`
	FinishReason string   `json:"finish_reason"`
	TokenIDs     tokenIDs `json:"token_ids"`
}

type chatReply struct {
	Choices        []chatChoice    `json:"choices"`
	PromptTokenIDs promptTokenIDs  `json:"prompt_token_ids"`
	Usage          *oaiUsage       `json:"usage"`
	Metadata       *oaiMetadata    `json:"metadata"`
	Error          json.RawMessage `json:"error"`
}

// messages are the request's conversation, the ids it must begin with,
// and the ids the newest message must render as, where they are known.
func (c *Chat) messages(r Request) (msgs []chatMessage, prefix, newest []int, err error) {
	if len(r.Messages) == 0 {
		if r.Text == "" {
			return nil, nil, nil, fail.Invalidf("openai-chat: a chat engine takes messages or text, not token ids alone")
		}
		return []chatMessage{{Role: RoleUser, Content: r.Text}}, nil, nil, nil
	}
	msgs = make([]chatMessage, len(r.Messages))
	for i, m := range r.Messages {
		if m.Role == "" {
			return nil, nil, nil, fail.Invalidf("openai-chat: message %d has no role", i)
		}
		msgs[i] = chatMessage{Role: m.Role, Content: m.Text}
		if i < len(r.Messages)-1 {
			if len(m.IDs) == 0 {
				return nil, nil, nil, fail.Invalidf("openai-chat: message %d (%s) has no ids: the trajectory so far must be known", i, m.Role)
			}
			prefix = append(prefix, m.IDs...)
		}
	}
	return msgs, prefix, r.Messages[len(r.Messages)-1].IDs, nil
}

func (c *Chat) request(msgs []chatMessage, r Request, stream bool) chatRequest {
	in := chatRequest{
		Model:                  c.model,
		Messages:               msgs,
		MaxTokens:              r.Sampling.MaxNewTokens,
		Temperature:            r.Sampling.Temperature,
		TopP:                   r.Sampling.TopP,
		Stop:                   r.Sampling.Stop,
		Seed:                   r.Sampling.Seed,
		Logprobs:               true,
		ReturnTokenIDs:         true,
		ReturnTokensAsTokenIDs: true,
		Stream:                 stream,
	}
	if stream {
		in.StreamOptions = map[string]any{"include_usage": true}
	}
	return in
}

// add takes one reply, or one chunk of a stream.
func (a *oaiAccumulator) addChat(r *chatReply) {
	a.envelope(r.Usage, r.Metadata)
	if r.PromptTokenIDs != nil && a.promptIDs == nil {
		a.promptIDs = r.PromptTokenIDs
	}
	if len(r.Choices) == 0 {
		return
	}
	ch := r.Choices[0]
	text := ""
	switch {
	case ch.Message != nil && ch.Message.Content != nil:
		text = *ch.Message.Content
	case ch.Delta != nil && ch.Delta.Content != nil:
		text = *ch.Delta.Content
	}
	var tokens []string
	var lps []*float64
	if ch.Logprobs != nil {
		for _, t := range ch.Logprobs.Content {
			tokens = append(tokens, t.Token)
			lps = append(lps, t.Logprob)
		}
	}
	a.choice(text, tokens, lps, ch.TokenIDs, ch.FinishReason)
}

// generation checks that the reply is token-exact: output ids and prompt
// ids returned, the prompt beginning with the trajectory so far, and, when
// the newest message's ids are known (TokenizeChat's), the prompt exactly
// those of the conversation.
func (c *Chat) generation(a *oaiAccumulator, prefix, newest []int) (Generation, error) {
	g, err := a.generation()
	if err != nil {
		return Generation{}, err
	}
	if g.OutputIDs == nil && !a.generated(g) && g.FinishReason == "" {
		return Generation{}, errSaysNothing()
	}
	if g.OutputIDs == nil && a.generated(g) {
		return Generation{}, fail.Permanentf("the server returned no output token ids (vLLM's return_token_ids, or return_tokens_as_token_ids with logprobs): " +
			"a chat reply's text cannot be turned back into the tokens the model generated, so the sample would not be token-exact")
	}
	if g.PromptIDs == nil {
		return Generation{}, fail.Permanentf("the server returned no prompt_token_ids (vLLM's return_token_ids): " +
			"the tokens its chat template rendered are unknown, so the sample would not be token-exact")
	}
	if len(g.PromptIDs) == 0 {
		// The template wrote the messages at least: an empty rendering is
		// not what the model generated from, and the sample would hold no
		// prompt.
		return Generation{}, fail.Permanentf("the server's prompt_token_ids are empty: it rendered the conversation into no tokens, " +
			"so what the model generated from is unknown")
	}
	if err := checkCut(prefix, newest, g.PromptIDs); err != nil {
		return Generation{}, err
	}
	if err := checkPrefix(prefix, g.PromptIDs, "the chat template's prompt_token_ids"); err != nil {
		return Generation{}, reRendered(err)
	}
	if newest != nil {
		if rest := g.PromptIDs[len(prefix):]; !slices.Equal(rest, newest) {
			// Counted on one rendering, generated from another: a router
			// that sent the tokenize and the generation to servers with
			// other templates or tokenizer revisions.
			return Generation{}, fmt.Errorf("the server rendered the newest message otherwise than its /tokenize did: "+
				"the prompt planact counted against max_context_tokens is not the one the model saw: %w",
				drift(len(prefix)+firstDiff(newest, rest), len(prefix)+len(newest), len(g.PromptIDs), "the chat template's prompt_token_ids"))
		}
	}
	if g.PromptTokens == 0 {
		g.PromptTokens = len(g.PromptIDs)
	}
	return g, nil
}

// checkCut refuses a prompt the server cut (to its context length): its
// rendering (prompt_token_ids) a strict prefix of the conversation's ids as
// planact holds them, the trajectory so far and the newest message's ids
// where they are known. It did not render the conversation otherwise (no
// drift); it generated from less of it.
func checkCut(prefix, newest, rendered []int) error {
	want := prefix
	if newest != nil {
		want = append(slices.Clip(prefix), newest...)
	}
	if at := firstDiff(want, rendered); at < len(rendered) || at == len(want) {
		return nil
	}
	if newest == nil {
		return cutPrompt(fmt.Sprintf("its chat template's prompt_token_ids are the first %d of the %d tokens of the conversation so far, before the newest message",
			len(rendered), len(want)))
	}
	return cutPrompt(fmt.Sprintf("its chat template's prompt_token_ids are the first %d of the %d tokens of the conversation", len(rendered), len(want)))
}

// Generate runs one generation with POST /v1/chat/completions.
func (c *Chat) Generate(ctx context.Context, r Request) (Generation, error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	msgs, prefix, newest, err := c.messages(r)
	if err != nil {
		return Generation{}, err
	}
	start := time.Now()
	var out chatReply
	if err := c.doJSON(ctx, http.MethodPost, "/v1/chat/completions", c.request(msgs, r, false), &out, routingHeader(r.RoutingKey)); err != nil {
		return Generation{}, fmt.Errorf("openai chat: %w", err)
	}
	if err := replyError(out.Error); err != nil {
		return Generation{}, fmt.Errorf("openai chat: %w", err)
	}
	if len(out.Choices) == 0 {
		return Generation{}, fail.Transientf("openai chat: reply has no choices")
	}
	var acc oaiAccumulator
	acc.addChat(&out)
	g, err := c.generation(&acc, prefix, newest)
	if err == nil {
		err = checkFinished(g)
	}
	if err == nil {
		err = checkLength(r, g)
	}
	if err != nil {
		return Generation{}, fmt.Errorf("openai chat: %w", err)
	}
	g.Latency = time.Since(start)
	return g, nil
}

// GenerateStream runs one streamed chat completion, calling onChunk with
// the cumulative text after every event.
func (c *Chat) GenerateStream(ctx context.Context, r Request, onChunk func(string)) (Generation, error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	msgs, prefix, newest, err := c.messages(r)
	if err != nil {
		return Generation{}, err
	}
	start := time.Now()
	resp, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", c.request(msgs, r, true), routingHeader(r.RoutingKey))
	if err != nil {
		return Generation{}, fmt.Errorf("openai chat stream: %w", err)
	}
	defer resp.Body.Close()
	var acc oaiAccumulator
	err = readSSE(resp.Body, func(data []byte) error {
		var ev chatReply
		if err := json.Unmarshal(data, &ev); err != nil {
			return fail.Transientf("decode event %.200q: %w", data, err)
		}
		if err := replyError(ev.Error); err != nil {
			return err
		}
		before := acc.text.Len()
		acc.addChat(&ev)
		if onChunk != nil && acc.text.Len() != before {
			onChunk(acc.text.String())
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Generation{}, fmt.Errorf("openai chat stream: %w", ctx.Err())
		}
		if fail.KindOf(err) == fail.Unknown {
			err = fail.E(fail.Transient, err)
		}
		return Generation{}, fmt.Errorf("openai chat stream: %w", err)
	}
	if acc.finish == "" {
		return Generation{}, fail.Transientf("openai chat stream: stream ended without a finish reason")
	}
	g, err := c.generation(&acc, prefix, newest)
	if err == nil {
		err = checkLength(r, g)
	}
	if err != nil {
		return Generation{}, fmt.Errorf("openai chat stream: %w", err)
	}
	g.Latency = time.Since(start)
	return g, nil
}

// Tokenize calls the server's /tokenize (vLLM, SGLang) without special tokens.
func (c *Chat) Tokenize(ctx context.Context, text string) ([]int, error) {
	return c.tokenize(ctx, c.model, text)
}

// ChatTokenizer is a chat engine that says which prompt it would generate
// from for a conversation: its chat template's tokens (BOS, role markers,
// the generation prompt) and the messages', as its chat completions render
// them. What a context limit counts.
type ChatTokenizer interface {
	TokenizeChat(ctx context.Context, msgs []Message) ([]int, error)
}

// TokenizeChat renders msgs with the server's chat template, as a
// generation would, and returns the ids: POST /tokenize {"model",
// "messages","add_generation_prompt":true,"add_special_tokens":false}
// (vLLM's TokenizeChatRequest; those are its chat completions' defaults
// too). As a generation's prompt, the ids must begin with those of every
// message but the last (else the template re-renders the conversation:
// token drift); the rest is the last message as the template wrote it.
func (c *Chat) TokenizeChat(ctx context.Context, msgs []Message) ([]int, error) {
	if len(msgs) == 0 {
		return nil, fail.Invalidf("openai-chat: tokenize a conversation: no messages")
	}
	chat, prefix, _, err := c.messages(Request{Messages: msgs})
	if err != nil {
		return nil, err
	}
	in := map[string]any{"messages": chat, "add_generation_prompt": true, "add_special_tokens": false}
	if c.model != "" {
		in["model"] = c.model
	}
	var tokens *[]int
	err = c.doRead(ctx, http.MethodPost, "/tokenize", in, nil, func(b []byte) (err error) {
		tokens, err = decodeTokens(b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("openai chat: tokenize the conversation (POST /tokenize with messages, as vLLM's): %w", err)
	}
	if tokens == nil {
		return nil, fail.Permanentf(`openai chat: tokenize the conversation: the reply has no "tokens"`)
	}
	if len(*tokens) == 0 {
		// Counted as no tokens, the conversation would pass any context
		// limit, and its prompt would be no ids.
		return nil, fail.Permanentf("openai chat: tokenize the conversation: the engine rendered %d messages into no tokens", len(msgs))
	}
	if err := checkPrefix(prefix, *tokens, "the chat template's tokens from /tokenize"); err != nil {
		return nil, fmt.Errorf("openai chat: tokenize the conversation: %w", reRendered(err))
	}
	return *tokens, nil
}

// reRendered says what a chat template that did not render the
// conversation so far as the trajectory holds it (err, its drift) means.
func reRendered(err error) error {
	return fmt.Errorf("the chat template re-rendered the conversation: the history the model saw is not the one planact trains on "+
		"(use a template that renders earlier turns unchanged: no <think> stripping, no trimming; or a completions protocol): %w", err)
}

// Health calls GET /health.
func (c *Chat) Health(ctx context.Context) error {
	if err := c.health(ctx); err != nil {
		return fmt.Errorf("openai chat health: %w", err)
	}
	return nil
}

// Pause is OpenAI.Pause.
func (c *Chat) Pause(ctx context.Context, mode PauseMode) error {
	return c.openaiPause(ctx, "openai chat pause", mode)
}

// Resume is OpenAI.Resume.
func (c *Chat) Resume(ctx context.Context) error {
	return c.openaiResume(ctx, "openai chat resume")
}

// WeightVersion is OpenAI.WeightVersion.
func (c *Chat) WeightVersion(ctx context.Context) (string, error) {
	return c.weightVersion(ctx, "openai chat weight version")
}

// TrajectoryIDs returns the ids a trajectory holds for the newest message
// of r (the prompt or an observation) once g is its generation: what a chat
// engine's template made of it (glue included), or ids, the caller's own
// tokenization, from an engine that takes token ids.
func TrajectoryIDs(r Request, g Generation, ids []int) []int {
	if g.PromptIDs == nil {
		return ids
	}
	known := 0
	if len(r.Messages) > 0 {
		for _, m := range r.Messages[:len(r.Messages)-1] {
			known += len(m.IDs)
		}
	}
	return slices.Clone(g.PromptIDs[known:])
}

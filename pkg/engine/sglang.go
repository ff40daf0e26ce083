package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/planact/planact/pkg/fail"
)

// SGLang is a client for SGLang's native HTTP API.
//
// Wire contract relied on (sglang/srt/managers/io_struct.py GenerateReqInput,
// tokenizer_manager.py):
//
//	POST /generate  {"input_ids":[…] | "text":"…", "sampling_params":{"temperature",
//	                 "top_p","max_new_tokens","stop","sampling_seed"?}, "return_logprob":true,
//	                 "stream"?:true}
//	  reply         {"text", "output_ids"?, "meta_info":{"finish_reason":{"type":"stop"|"length"|"abort",
//	                 "status_code"?,"message"?,…},
//	                 "prompt_tokens","completion_tokens","weight_version"?,
//	                 "output_token_logprobs":[[logprob, token_id, text|null], …]}}
//	  streaming     "data: {same object}\n\n" … "data: [DONE]\n\n"; text, output_ids and
//	                meta_info.output_token_logprobs are cumulative by default, all deltas
//	                with --incremental-streaming-output; older servers' --stream-output
//	                makes output_ids deltas and leaves text cumulative.
//	POST /tokenize  {"prompt":"…","add_special_tokens":false} -> {"tokens":[…],"count",…}
//	GET  /health    200 when the server is up
//
// Every /generate carries a "rid" (GenerateReqInput.rid) so that a request
// the caller gives up on can be aborted with POST /abort_request {"rid"};
// and, with a routing key, "routing_key" (GenerateReqInput.routing_key, for
// SGLang's routing-key scheduling) and the X-SMG-Routing-Key header (for
// SGLang's router). Older servers ignore fields they do not know at the top
// level of the request.
//
// Output ids come from output_token_logprobs (id of each triple) when
// present, else from output_ids. sampling_seed is sent only when Seed != 0
// because older servers reject unknown sampling parameters.
type SGLang struct {
	conn
}

type sglSampling struct {
	Temperature  float64  `json:"temperature"`
	TopP         float64  `json:"top_p,omitempty"`
	MaxNewTokens int      `json:"max_new_tokens,omitempty"`
	Stop         []string `json:"stop,omitempty"`
	SamplingSeed int64    `json:"sampling_seed,omitempty"`
}

type sglRequest struct {
	InputIDs       []int       `json:"input_ids,omitempty"`
	Text           string      `json:"text,omitempty"`
	SamplingParams sglSampling `json:"sampling_params"`
	ReturnLogprob  bool        `json:"return_logprob"`
	Stream         bool        `json:"stream,omitempty"`
	RID            string      `json:"rid,omitempty"`
	RoutingKey     string      `json:"routing_key,omitempty"`
}

type sglReply struct {
	Text      string    `json:"text"`
	OutputIDs outputIDs `json:"output_ids"`
	MetaInfo  struct {
		FinishReason        *sglFinish      `json:"finish_reason"`
		PromptTokens        int             `json:"prompt_tokens"`
		CompletionTokens    *int            `json:"completion_tokens"`
		WeightVersion       json.RawMessage `json:"weight_version"`
		OutputTokenLogprobs logprobList     `json:"output_token_logprobs"`
	} `json:"meta_info"`
	Error json.RawMessage `json:"error"`
}

// sglFinish is meta_info.finish_reason (schedule_batch.py FINISH_*.to_json):
// {"type": "stop"|"length"|"abort", "matched"?, "length"?, "message"?,
// "status_code"?}. An abort with a status code is a request the engine
// refused or failed (tokenizer_manager.py _handle_abort_finish_reason).
type sglFinish struct {
	Type       string `json:"type"`
	Message    string `json:"message"`
	StatusCode *int   `json:"status_code"`
}

func (c *SGLang) request(r Request, stream bool) sglRequest {
	rid := r.ID
	if rid == "" {
		rid = newRID(r.RoutingKey)
	}
	in := sglRequest{
		RID:        rid,
		RoutingKey: r.RoutingKey,
		SamplingParams: sglSampling{
			Temperature:  r.Sampling.Temperature,
			TopP:         r.Sampling.TopP,
			MaxNewTokens: r.Sampling.MaxNewTokens,
			Stop:         r.Sampling.Stop,
			SamplingSeed: r.Sampling.Seed,
		},
		ReturnLogprob: true,
		Stream:        stream,
	}
	if len(r.InputIDs) > 0 {
		in.InputIDs = r.InputIDs
	} else {
		in.Text = r.Text
	}
	return in
}

// Generate runs one generation with POST /generate. When ctx ends first,
// the engine is told to abort the request.
func (c *SGLang) Generate(ctx context.Context, r Request) (Generation, error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	start := time.Now()
	in := c.request(r, false)
	var out sglReply
	err := c.doRead(ctx, http.MethodPost, "/generate", in, routingHeader(r.RoutingKey), func(b []byte) error { return decodeGenerate(b, &out) })
	if err != nil {
		if ctx.Err() == nil && mayRunOn(err) {
			// No answer came from the engine (the connection broke, a
			// proxy gave up on it): it may be generating the request for
			// nobody, beside the retry that follows, so it is told to stop.
			_ = c.sglangAbort(ctx, in.RID)
		} else {
			c.abortIfGivenUp(ctx, in.RID)
		}
		return Generation{}, fmt.Errorf("sglang generate: %w", err)
	}
	if err := replyError(out.Error); err != nil {
		return Generation{}, fmt.Errorf("sglang generate: %w", err)
	}
	g, err := out.generation(out.OutputIDs)
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
		return Generation{}, fmt.Errorf("sglang generate: %w", err)
	}
	g.Latency = time.Since(start)
	return g, nil
}

// GenerateStream runs one generation with "stream": true, calling onChunk
// with the cumulative text after every event. When ctx ends first, the
// engine is told to abort the request.
func (c *SGLang) GenerateStream(ctx context.Context, r Request, onChunk func(string)) (g Generation, err error) {
	if err := checkRequest(r); err != nil {
		return Generation{}, err
	}
	start := time.Now()
	in := c.request(r, true)
	streaming := false
	defer func() {
		switch {
		case err != nil && ctx.Err() == nil && (streaming || mayRunOn(err)):
			// The stream broke (a proxy cut it, an event planact cannot
			// read), or never began (the connection broke, a proxy gave
			// up on the engine before it answered): the engine may
			// generate on for nobody, beside the retry that follows, so it
			// is told to stop.
			_ = c.sglangAbort(ctx, in.RID)
		case err != nil:
			c.abortIfGivenUp(ctx, in.RID)
		}
	}()
	resp, err := c.do(ctx, http.MethodPost, "/generate", in, routingHeader(r.RoutingKey))
	if err != nil {
		return Generation{}, fmt.Errorf("sglang generate stream: %w", err)
	}
	streaming = true
	defer resp.Body.Close()
	var (
		last    sglReply
		seen    bool
		text    streamText
		accIDs  []int // output_ids appended, for servers that stream deltas
		prefix  = true
		lastIDs []int
		accLPs  logprobList // output_token_logprobs appended, likewise
		// Once two events show the server streams cumulatively (SGLang's
		// default), every event repeats all ids and log-probs so far:
		// decoding each fully costs O(n²). Then only the text of each event
		// is read, and the last event is decoded in full at the end.
		cumulative bool
		lastRaw    []byte
		events     int
	)
	err = readSSE(resp.Body, func(data []byte) error {
		events++
		if cumulative {
			var ev struct {
				Text  string          `json:"text"`
				Error json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(data, &ev); err != nil {
				return fail.Transientf("decode event %.200q: %w", data, err)
			}
			if err := replyError(ev.Error); err != nil {
				return err
			}
			text.add(ev.Text, true)
			lastRaw = append(lastRaw[:0], data...)
			if onChunk != nil {
				onChunk(text.String())
			}
			return nil
		}
		var ev sglReply
		if err := json.Unmarshal(data, &ev); err != nil {
			return fail.Transientf("decode event %.200q: %w", data, err)
		}
		if err := replyError(ev.Error); err != nil {
			return err
		}
		if prefix && !hasPrefix(ev.OutputIDs, lastIDs) {
			prefix = false
		}
		lastIDs = ev.OutputIDs
		accIDs = append(accIDs, ev.OutputIDs...)
		accLPs.append(ev.MetaInfo.OutputTokenLogprobs)
		last, seen = ev, true
		text.add(ev.Text, false)
		// The second event tells: still a prefix of ids and text, and ids
		// as many as the server says it generated, means cumulative.
		if events >= 2 && prefix && !text.deltas && ev.Text != "" && ev.MetaInfo.CompletionTokens != nil && *ev.MetaInfo.CompletionTokens == len(ev.OutputIDs) {
			cumulative = true
		}
		if onChunk != nil {
			onChunk(text.String())
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Generation{}, fmt.Errorf("sglang generate stream: %w", ctx.Err())
		}
		if fail.KindOf(err) == fail.Unknown {
			err = fail.E(fail.Transient, err)
		}
		return Generation{}, fmt.Errorf("sglang generate stream: %w", err)
	}
	if !seen {
		return Generation{}, fail.Transientf("sglang generate stream: no events")
	}
	if lastRaw != nil {
		var ev sglReply
		if err := json.Unmarshal(lastRaw, &ev); err != nil {
			return Generation{}, fail.Transientf("sglang generate stream: decode last event: %w", err)
		}
		last, lastIDs, accIDs, accLPs = ev, ev.OutputIDs, nil, logprobList{}
	}
	ids := lastIDs
	if n := last.MetaInfo.CompletionTokens; (n != nil && len(accIDs) == *n && len(lastIDs) != *n) || (n == nil && !prefix) {
		ids = accIDs
	}
	if n := last.MetaInfo.CompletionTokens; n != nil && len(accLPs.ids) == *n && len(last.MetaInfo.OutputTokenLogprobs.ids) != *n {
		last.MetaInfo.OutputTokenLogprobs = accLPs
	}
	last.Text = text.String()
	g, err = last.generation(ids)
	if err == nil {
		err = checkConsumed(r, g)
	}
	if err == nil {
		err = checkLength(r, g)
	}
	if err != nil {
		return Generation{}, fmt.Errorf("sglang generate stream: %w", err)
	}
	if g.FinishReason == "" {
		return Generation{}, fail.Transientf("sglang generate stream: stream ended without a finish reason")
	}
	g.Latency = time.Since(start)
	return g, nil
}

// streamText joins the texts of a stream's events, which are cumulative or
// deltas for the whole stream. Cumulative ids (known) mean cumulative text.
// Delta ids do not tell: SGLang's --incremental-streaming-output streams
// text deltas with them, but older servers streamed cumulative text with
// delta ids (--stream-output). Cumulative text never gives an event a text
// that does not begin with the one before; the first such text shows
// deltas, and from then on the texts of every event, before it too, are
// joined. Until then the texts are taken as cumulative, which mistakes only
// deltas that each begin with the one before, to the end of the stream (a
// token repeated, and a last delta that is not empty, unlike an
// end-of-sequence token's).
type streamText struct {
	deltas bool            // decided: every event's text is a delta
	last   string          // the last event's text, while cumulative
	lens   []int           // while cumulative: each event's text length, each text a prefix of last
	joined strings.Builder // the deltas joined, once deltas
}

// add takes an event's text; cumulative says the stream is known to be
// cumulative.
func (s *streamText) add(t string, cumulative bool) {
	if !s.deltas && !cumulative && !strings.HasPrefix(t, s.last) {
		s.deltas = true
		for _, n := range s.lens {
			s.joined.WriteString(s.last[:n])
		}
		s.lens = nil
	}
	if s.deltas {
		s.joined.WriteString(t)
		return
	}
	s.last = t
	if !cumulative {
		s.lens = append(s.lens, len(t))
	}
}

// String is the text so far.
func (s *streamText) String() string {
	if s.deltas {
		return s.joined.String()
	}
	return s.last
}

func hasPrefix(a, p []int) bool {
	if len(p) > len(a) {
		return false
	}
	for i := range p {
		if a[i] != p[i] {
			return false
		}
	}
	return true
}

// generation is the reply as a Generation, output ids from ids when
// output_token_logprobs has none. What the engine did not return is absent
// (log-probs, with the reason) or an error (ids), never a zero: a reply
// without ids is an empty generation only when it names a finish reason.
func (out *sglReply) generation(ids []int) (Generation, error) {
	g := Generation{Text: out.Text, PromptTokens: out.MetaInfo.PromptTokens}
	if fr := out.MetaInfo.FinishReason; fr != nil {
		if fr.Type == FinishAbort && fr.StatusCode != nil && *fr.StatusCode >= 400 {
			// A request SGLang refused or failed (a prompt longer than its
			// context: 400; its queue full, a time-out: 503; an internal
			// error: 500) ends as an abort that carries the status. Not
			// streamed, it is answered with that status; streamed, this
			// event is all the client hears. Either way an error, in the
			// engine's words, never an aborted generation.
			return Generation{}, statusError("the engine ended the request (meta_info.finish_reason abort)", *fr.StatusCode, []byte(fr.Message))
		}
		finish, err := finishReason(fr.Type)
		if err != nil {
			return Generation{}, fmt.Errorf("meta_info.finish_reason: %w", err)
		}
		g.FinishReason = finish
	}
	g.WeightVersion = rawString(out.MetaInfo.WeightVersion)
	lps := out.MetaInfo.OutputTokenLogprobs
	switch {
	case len(lps.ids) > 0:
		if len(ids) > 0 && len(ids) != len(lps.ids) {
			return Generation{}, fail.Transientf("%d output ids but %d log-probs", len(ids), len(lps.ids))
		}
		// The reply names its tokens twice: where they disagree, the
		// log-probs are not those of the ids, and neither is known to be
		// the generation.
		if at := firstDiff(ids, lps.ids); len(ids) > 0 && at < len(ids) {
			return Generation{}, fail.Transientf("output_ids[%d] is %d but meta_info.output_token_logprobs[%d] is the log-prob of token %d: "+
				"the reply does not say which tokens were generated", at, ids[at], at, lps.ids[at])
		}
		g.OutputIDs = lps.ids
		if lps.missing > 0 {
			g.LogProbsMissing = fmt.Sprintf("the engine returned no log-prob for %d of %d output tokens (null in meta_info.output_token_logprobs)", lps.missing, len(lps.ids))
		} else {
			g.LogProbs = lps.logprobs
		}
	case len(ids) > 0:
		// Without log-probs (return_logprob ignored) the ids are still exact.
		g.OutputIDs = ids
		g.LogProbsMissing = "the engine returned no meta_info.output_token_logprobs, although return_logprob was asked for"
	case g.Text != "" || (out.MetaInfo.CompletionTokens != nil && *out.MetaInfo.CompletionTokens > 0):
		return Generation{}, fail.Permanentf("the engine returned text but no output ids (neither output_ids nor meta_info.output_token_logprobs): " +
			"text cannot be turned back into the tokens the model generated, so the sample would not be token-exact")
	case g.FinishReason == "":
		return Generation{}, errSaysNothing()
	}
	if n := out.MetaInfo.CompletionTokens; n != nil && len(g.OutputIDs) > 0 && len(g.OutputIDs) != *n {
		// The ids returned are not the generation: which tokens are
		// missing (or extra) is not known.
		return Generation{}, fail.Transientf("%d output ids but meta_info.completion_tokens %d: the engine did not return the ids of every generated token",
			len(g.OutputIDs), *n)
	}
	return g, nil
}

// rawString reads a JSON string or number as a string ("" for null).
func rawString(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	return string(raw)
}

// Tokenize calls POST /tokenize without special tokens.
func (c *SGLang) Tokenize(ctx context.Context, text string) ([]int, error) {
	return c.tokenize(ctx, "", text)
}

// Health calls GET /health.
func (c *SGLang) Health(ctx context.Context) error {
	if err := c.health(ctx); err != nil {
		return fmt.Errorf("sglang health: %w", err)
	}
	return nil
}

// Pause calls POST /pause_generation with the mode (abort, in_place or
// retract; SGLang has no wait).
func (c *SGLang) Pause(ctx context.Context, mode PauseMode) error {
	return c.sglangPause(ctx, "sglang pause", mode)
}

// Resume calls POST /continue_generation.
func (c *SGLang) Resume(ctx context.Context) error {
	return c.sglangResume(ctx, "sglang resume")
}

// WeightVersion calls GET /get_weight_version (GET /get_model_info on
// servers without it).
func (c *SGLang) WeightVersion(ctx context.Context) (string, error) {
	return c.weightVersion(ctx, "sglang weight version")
}

// Abort tells the engine to abort the request named rid (Request.ID).
func (c *SGLang) Abort(ctx context.Context, rid string) error {
	return c.sglangAbort(ctx, rid)
}

// mayRunOn reports whether a request that failed with err, its caller
// still waiting, may be running on the engine all the same: no reply came
// from it (the connection broke, or was cut in the reply), or what replied
// was a proxy in between that gave up waiting on it (502, 504). The engine
// ignores an abort of a request it does not have.
func mayRunOn(err error) bool {
	switch statusOf(err) {
	case 0, http.StatusBadGateway, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// abortIfGivenUp aborts request rid on the engine when the caller's context
// has ended (a cancelled rollout, a time-out, a deadline, a pause in abort
// mode), and returns once the engine answered (or abortTimeout passed). A
// generation counts as running until then: a pause says its role drained
// only when its gateways' generations have returned, and an engine still
// generating for an abort on its way is not drained.
func (c *SGLang) abortIfGivenUp(ctx context.Context, rid string) {
	if ctx.Err() != nil {
		_ = c.sglangAbort(ctx, rid)
	}
}

package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/planact/planact/pkg/reward"
)

type httpMux = *http.ServeMux

// maxModelLen is what /tokenize reports as the context length.
const maxModelLen = 32768

func (e *Engine) routes() *http.ServeMux {
	m := http.NewServeMux()
	// SGLang native API.
	m.HandleFunc("POST /generate", e.handleGenerate)
	m.HandleFunc("POST /tokenize", e.handleTokenize)
	m.HandleFunc("POST /detokenize", e.handleDetokenize)
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	m.HandleFunc("GET /health_generate", func(w http.ResponseWriter, r *http.Request) {})
	m.HandleFunc("GET /get_model_info", e.handleModelInfo)
	m.HandleFunc("GET /get_weight_version", e.handleWeightVersion)
	m.HandleFunc("POST /update_weight_version", e.handleUpdateWeightVersion)
	m.HandleFunc("POST /update_weights_from_disk", e.handleUpdateWeightsFromDisk)
	m.HandleFunc("POST /abort_request", e.handleAbortRequest)
	m.HandleFunc("POST /pause_generation", e.handlePauseGeneration)
	m.HandleFunc("POST /continue_generation", e.handleContinueGeneration)
	// vLLM's pause and resume (VLLM_SERVER_DEV_MODE).
	m.HandleFunc("POST /pause", e.handleVLLMPause)
	m.HandleFunc("POST /resume", e.handleVLLMResume)
	m.HandleFunc("GET /is_paused", e.handleIsPaused)
	// OpenAI-compatible API.
	m.HandleFunc("POST /v1/completions", e.handleCompletions)
	m.HandleFunc("POST /v1/chat/completions", e.handleChat)
	m.HandleFunc("GET /v1/models", e.handleModels)
	m.HandleFunc("POST /v1/tokenize", e.handleTokenize)
	// Reward server.
	m.HandleFunc("POST /reward", e.handleReward)
	// What the simulator saw, for tests and curious people.
	m.HandleFunc("GET /sim/stats", e.handleStats)
	// Calls per generation, taken (a harness's ledger counts them).
	m.HandleFunc("POST /sim/take_generations", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, e.TakeGenerations())
	})
	return m
}

// ServeHTTP serves the simulated engine's endpoints.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) { e.mux.ServeHTTP(w, r) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"object": "error", "error": map[string]any{"message": msg, "code": status}, "message": msg})
}

// writeGenError replies to a failed generation.
func writeGenError(w http.ResponseWriter, r *http.Request, err error) {
	var bad errBadInput
	var busy errBusy
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, bad.msg)
	case errors.As(err, &busy):
		if busy.retryAfter != "" {
			w.Header().Set("Retry-After", busy.retryAfter)
		}
		writeError(w, busy.status, err.Error())
	case errors.Is(err, errInjected):
		writeError(w, http.StatusInternalServerError, err.Error())
	case r.Context().Err() != nil:
		// The client is gone; nobody reads this.
		writeError(w, 499, "client closed request")
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	if err := dec.Decode(v); err != nil {
		return errBadInput{"invalid JSON body: " + err.Error()}
	}
	return nil
}

// stopList reads a stop parameter: a string or a list of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = many
	return nil
}

func promptFromIDs(ids []int) (genInput, error) {
	text, err := Decode(ids)
	if err != nil {
		return genInput{}, errBadInput{err.Error()}
	}
	return genInput{ids: ids, prompt: text}, nil
}

func promptFromText(text string) genInput {
	return genInput{ids: Encode(text), prompt: text}
}

// ---- SGLang native ----

type sglGenerateReq struct {
	Text           *string         `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams struct {
		MaxNewTokens *int     `json:"max_new_tokens"`
		Stop         stopList `json:"stop"`
		SamplingSeed int64    `json:"sampling_seed"`
	} `json:"sampling_params"`
	ReturnLogprob bool   `json:"return_logprob"`
	Stream        bool   `json:"stream"`
	RID           string `json:"rid"`
	RoutingKey    string `json:"routing_key"`
}

// routingKey is what a router would route by: the X-SMG-Routing-Key header
// (sgl-model-gateway), else SGLang's routing_key field.
func routingKey(r *http.Request, body string) string {
	return cmpOr(r.Header.Get("X-SMG-Routing-Key"), body)
}

func (e *Engine) handleGenerate(w http.ResponseWriter, r *http.Request) {
	var req sglGenerateReq
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	var in genInput
	switch {
	case len(req.InputIDs) > 0 && string(req.InputIDs) != "null":
		var ids []int
		if err := json.Unmarshal(req.InputIDs, &ids); err != nil {
			writeError(w, http.StatusBadRequest, "input_ids: the simulator serves one prompt per request: "+err.Error())
			return
		}
		var err error
		if in, err = promptFromIDs(ids); err != nil {
			writeGenError(w, r, err)
			return
		}
		if e.drifts(routingKey(r, req.RoutingKey)) {
			in.ids = append([]int{BOSID}, in.ids...)
		}
	case req.Text != nil:
		in = promptFromText(*req.Text)
	default:
		writeError(w, http.StatusBadRequest, "either text or input_ids should be provided")
		return
	}
	if req.SamplingParams.MaxNewTokens != nil {
		in.maxNew = *req.SamplingParams.MaxNewTokens
		if in.maxNew <= 0 {
			in.maxNew = -1 // an explicit zero
		}
	}
	in.stop = req.SamplingParams.Stop
	in.seed = req.SamplingParams.SamplingSeed
	rid := req.RID
	if rid == "" {
		rid = fmt.Sprintf("sim-%x", hash64(time.Now().UnixNano(), in.prompt))
	}
	in.rid, in.routingKey, in.generation = rid, routingKey(r, req.RoutingKey), r.Header.Get(GenerationHeader)
	if !req.Stream {
		out, err := e.generate(r.Context(), in, nil)
		if err != nil {
			writeGenError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, sglReply(rid, out, len(out.ids), true, req.ReturnLogprob, e.cfg.Omit))
		return
	}
	sse := newSSE(w)
	out, err := e.generate(r.Context(), in, func(out *genOutput, n int) error {
		return sse.send(sglReply(rid, out, n, false, req.ReturnLogprob, e.cfg.Omit))
	})
	if err != nil {
		sse.fail(r, err)
		return
	}
	_ = sse.send(sglReply(rid, out, len(out.ids), true, req.ReturnLogprob, e.cfg.Omit))
	sse.done()
}

// sglReply is SGLang's /generate reply after n output tokens; text, ids and
// log-probs are cumulative, as SGLang streams them by default. What omit
// names is left out.
func sglReply(rid string, out *genOutput, n int, final bool, logprobs bool, omit Omit) map[string]any {
	var finish any
	if final {
		fr := map[string]any{"type": out.finish}
		switch out.finish {
		case "length":
			fr["length"] = len(out.ids)
		case "abort":
			fr["message"] = out.abortMsg
		default:
			fr["matched"] = out.matched
		}
		finish = fr
	}
	meta := map[string]any{
		"id":                rid,
		"finish_reason":     finish,
		"prompt_tokens":     out.promptTokens,
		"completion_tokens": n,
		"cached_tokens":     0,
	}
	if !omit.WeightVersion {
		meta["weight_version"] = out.weightVersion
	}
	if logprobs && !omit.LogProbs {
		meta["output_token_logprobs"] = logprobTriples{out.logprobs[:n], out.ids[:n]}
		meta["input_token_logprobs"] = [][3]any{}
	}
	return map[string]any{"text": out.textAt(n), "output_ids": out.ids[:n], "meta_info": meta}
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt           *string `json:"prompt"`
		AddSpecialTokens *bool   `json:"add_special_tokens"`
		// vLLM's TokenizeChatRequest: the conversation as the chat
		// completions render it (the generation prompt by default).
		Messages            []chatMessage `json:"messages"`
		AddGenerationPrompt *bool         `json:"add_generation_prompt"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	var ids []int
	switch {
	case req.Messages != nil:
		ids = e.chatTemplate(req.Messages, false)
		if req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			ids = ids[:len(ids)-len(Encode("<|assistant|>\n"))]
		}
	case req.Prompt == nil:
		writeError(w, http.StatusBadRequest, `"prompt" or "messages" is required`)
		return
	default:
		ids = Encode(*req.Prompt)
		if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
			ids = append([]int{BOSID}, ids...)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ids, "count": len(ids), "max_model_len": maxModelLen})
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int `json:"tokens"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	text, err := Decode(req.Tokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"text": text})
}

func (e *Engine) handleModelInfo(w http.ResponseWriter, r *http.Request) {
	info := map[string]any{
		"model_path":     e.ModelPath(),
		"tokenizer_path": "sim-bytes",
		"is_generation":  true,
		"role":           e.cfg.Role,
	}
	if v, ok := e.reportedVersion(); ok {
		info["weight_version"] = v
	}
	writeJSON(w, http.StatusOK, info)
}

// handleWeightVersion is SGLang's GET /get_weight_version, or a 404 with
// Config.VersionEndpoint NoVersionEndpoint.
func (e *Engine) handleWeightVersion(w http.ResponseWriter, r *http.Request) {
	v, ok := e.reportedVersion()
	if !ok {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"weight_version": v})
}

// reportedVersion is what the engine says it serves when asked, as
// Config.VersionEndpoint says; ok is false when it cannot say.
func (e *Engine) reportedVersion() (string, bool) {
	switch e.cfg.VersionEndpoint {
	case "":
		return e.WeightVersion(), true
	case NoVersionEndpoint:
		return "", false
	default:
		return e.cfg.VersionEndpoint, true
	}
}

// metadata is the metadata of an OpenAI-compatible reply: the weights that
// generated it, unless omitted.
func (e *Engine) metadata(out *genOutput) map[string]any {
	if e.cfg.Omit.WeightVersion {
		return map[string]any{}
	}
	return map[string]any{"weight_version": out.weightVersion}
}

// handleUpdateWeightVersion is SGLang's POST /update_weight_version
// (UpdateWeightVersionReqInput: new_version, abort_all_requests).
func (e *Engine) handleUpdateWeightVersion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		NewVersion       string `json:"new_version"`
		AbortAllRequests bool   `json:"abort_all_requests"`
	}
	if err := decodeBody(r, &req); err != nil || req.NewVersion == "" {
		writeError(w, http.StatusBadRequest, `"new_version" is required`)
		return
	}
	if req.AbortAllRequests {
		e.mu.Lock()
		e.abortStarted("update")
		e.mu.Unlock()
	}
	e.SetWeightVersion(req.NewVersion)
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": "Weight version updated to " + req.NewVersion, "new_version": req.NewVersion})
}

// handleUpdateWeightsFromDisk is SGLang's POST /update_weights_from_disk
// (UpdateWeightFromDiskReqInput: model_path, load_format, abort_all_requests,
// weight_version): the simulator has no weights to load, but it waits for
// running generations (or aborts them) and takes the new version, as SGLang does.
func (e *Engine) handleUpdateWeightsFromDisk(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ModelPath        string  `json:"model_path"`
		WeightVersion    *string `json:"weight_version"`
		AbortAllRequests bool    `json:"abort_all_requests"`
	}
	if err := decodeBody(r, &req); err != nil || req.ModelPath == "" {
		writeError(w, http.StatusBadRequest, `"model_path" is required`)
		return
	}
	version := ""
	if req.WeightVersion != nil {
		version = *req.WeightVersion
	}
	if err := e.UpdateWeights(r.Context(), version, req.ModelPath, req.AbortAllRequests); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"success": false, "message": err.Error(), "num_paused_requests": 0})
		return
	}
	msg := "Succeeded to update model weights."
	if version != "" {
		msg += " Weight version updated to " + version + "."
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "message": msg, "num_paused_requests": 0})
}

// handleAbortRequest is SGLang's POST /abort_request (AbortReq: rid,
// abort_all). It answers 200 whether or not the request was running.
func (e *Engine) handleAbortRequest(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RID      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	e.AbortRequest(req.RID, req.AbortAll)
	w.WriteHeader(http.StatusOK)
}

// handlePauseGeneration is SGLang's POST /pause_generation
// (PauseGenerationReqInput: mode abort | retract | in_place, default abort).
func (e *Engine) handlePauseGeneration(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Mode string `json:"mode"`
	}
	if r.ContentLength != 0 {
		if err := decodeBody(r, &req); err != nil {
			writeGenError(w, r, err)
			return
		}
	}
	switch req.Mode {
	case "", "abort", "retract", "in_place":
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("Invalid mode: %q. Expected one of ['abort', 'retract', 'in_place'].", req.Mode))
		return
	}
	if err := e.Pause(r.Context(), req.Mode); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"message": "Generation paused successfully.", "status": "ok"})
}

// handleContinueGeneration is SGLang's POST /continue_generation.
func (e *Engine) handleContinueGeneration(w http.ResponseWriter, r *http.Request) {
	e.Continue()
	writeJSON(w, http.StatusOK, map[string]any{"message": "Generation continued successfully.", "status": "ok"})
}

// handleVLLMPause is vLLM's POST /pause?mode=abort|wait|keep (default abort).
func (e *Engine) handleVLLMPause(w http.ResponseWriter, r *http.Request) {
	mode := cmpOr(r.URL.Query().Get("mode"), "abort")
	switch mode {
	case "abort", "wait", "keep":
	default:
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("invalid pause mode %q", mode)})
		return
	}
	if err := e.Pause(r.Context(), mode); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "paused"})
}

// handleVLLMResume is vLLM's POST /resume.
func (e *Engine) handleVLLMResume(w http.ResponseWriter, r *http.Request) {
	e.Continue()
	writeJSON(w, http.StatusOK, map[string]any{"status": "resumed"})
}

// handleIsPaused is vLLM's GET /is_paused.
func (e *Engine) handleIsPaused(w http.ResponseWriter, r *http.Request) {
	paused, _ := e.Paused()
	writeJSON(w, http.StatusOK, map[string]any{"is_paused": paused})
}

// Stats is what GET /sim/stats reports.
type Stats struct {
	Requests      int64          `json:"requests"`
	Tokens        int64          `json:"tokens"`
	InFlight      int            `json:"in_flight"`
	WeightVersion string         `json:"weight_version"`
	Paused        bool           `json:"paused"`
	PauseMode     string         `json:"pause_mode,omitempty"`
	RoutingKeys   map[string]int `json:"routing_keys"`
	Aborts        []Abort        `json:"aborts"`
}

func (e *Engine) handleStats(w http.ResponseWriter, r *http.Request) {
	requests, tokens := e.Stats()
	paused, mode := e.Paused()
	writeJSON(w, http.StatusOK, Stats{Requests: requests, Tokens: tokens, InFlight: e.InFlight(), WeightVersion: e.WeightVersion(),
		Paused: paused, PauseMode: mode, RoutingKeys: e.RoutingKeys(), Aborts: e.Aborts()})
}

// ---- OpenAI-compatible ----

type oaiCommon struct {
	Model               string   `json:"model"`
	MaxTokens           *int     `json:"max_tokens"`
	MaxCompletionTokens *int     `json:"max_completion_tokens"`
	Stop                stopList `json:"stop"`
	Stream              bool     `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	ReturnTokensAsTokenIDs bool   `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool   `json:"return_token_ids"`
	Seed                   int64  `json:"seed"`
	RequestID              string `json:"request_id"` // vLLM's
}

func (c *oaiCommon) apply(in *genInput, r *http.Request, id string) {
	in.rid = cmpOr(c.RequestID, id)
	in.routingKey, in.generation = routingKey(r, ""), r.Header.Get(GenerationHeader)
	switch {
	case c.MaxCompletionTokens != nil:
		in.maxNew = *c.MaxCompletionTokens
	case c.MaxTokens != nil:
		in.maxNew = *c.MaxTokens
	}
	if in.maxNew <= 0 && (c.MaxTokens != nil || c.MaxCompletionTokens != nil) {
		in.maxNew = -1 // an explicit zero
	}
	in.stop = c.Stop
	in.seed = c.Seed
}

func (e *Engine) tokenString(id int, asIDs bool) string {
	if asIDs {
		return fmt.Sprintf("token_id:%d", id)
	}
	return tokenText(id)
}

func usage(out *genOutput) map[string]any {
	return map[string]any{"prompt_tokens": out.promptTokens, "completion_tokens": len(out.ids),
		"total_tokens": out.promptTokens + len(out.ids)}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req struct {
		oaiCommon
		Prompt   json.RawMessage `json:"prompt"`
		Logprobs *int            `json:"logprobs"`
		Echo     bool            `json:"echo"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	in, err := completionPrompt(req.Prompt)
	if err != nil {
		writeGenError(w, r, err)
		return
	}
	if byIDs := !strings.HasPrefix(strings.TrimSpace(string(req.Prompt)), `"`); byIDs && e.drifts(routingKey(r, "")) {
		in.ids = append([]int{BOSID}, in.ids...)
	}
	id := fmt.Sprintf("cmpl-%x", hash64(time.Now().UnixNano(), in.prompt))
	req.apply(&in, r, id)
	model := cmpOr(req.Model, e.cfg.Model)
	// choice renders tokens [from, to) of the output.
	choice := func(out *genOutput, from, to int, finish string) map[string]any {
		ch := map[string]any{"index": 0, "text": out.textAt(to)[len(out.textAt(from)):], "finish_reason": nullable(finish)}
		if req.Logprobs != nil && !e.cfg.Omit.LogProbs {
			toks := make([]string, 0, to-from)
			top := make([]map[string]float64, 0, to-from)
			for i := from; i < to; i++ {
				t := e.tokenString(out.ids[i], req.ReturnTokensAsTokenIDs && !e.cfg.Omit.TokenIDs)
				toks = append(toks, t)
				top = append(top, map[string]float64{t: out.logprobs[i]})
			}
			offsets := make([]int, len(toks))
			ch["logprobs"] = map[string]any{"tokens": toks, "token_logprobs": out.logprobs[from:to],
				"top_logprobs": top, "text_offset": offsets}
		} else {
			ch["logprobs"] = nil
		}
		if req.ReturnTokenIDs && !e.cfg.Omit.TokenIDs {
			ch["token_ids"] = out.ids[from:to]
			if from == 0 {
				ch["prompt_token_ids"] = in.ids
			}
		}
		return ch
	}
	envelope := func(out *genOutput, choices []any) map[string]any {
		return map[string]any{"id": id, "object": "text_completion", "created": time.Now().Unix(), "model": model,
			"choices": choices, "metadata": e.metadata(out)}
	}
	if !req.Stream {
		out, err := e.generate(r.Context(), in, nil)
		if err != nil {
			writeGenError(w, r, err)
			return
		}
		body := envelope(out, []any{choice(out, 0, len(out.ids), out.finish)})
		body["usage"] = usage(out)
		writeJSON(w, http.StatusOK, body)
		return
	}
	sse := newSSE(w)
	sent := 0
	out, err := e.generate(r.Context(), in, func(out *genOutput, n int) error {
		ch := choice(out, sent, n, "")
		sent = n
		return sse.send(envelope(out, []any{ch}))
	})
	if err != nil {
		sse.fail(r, err)
		return
	}
	_ = sse.send(envelope(out, []any{choice(out, sent, len(out.ids), out.finish)}))
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		body := envelope(out, []any{})
		body["usage"] = usage(out)
		_ = sse.send(body)
	}
	sse.done()
}

// completionPrompt reads a completions prompt: a string, token ids, or a
// batch of one of either.
func completionPrompt(raw json.RawMessage) (genInput, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return promptFromText(s), nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return promptFromIDs(ids)
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) == 1 {
		return promptFromText(ss[0]), nil
	}
	var idss [][]int
	if err := json.Unmarshal(raw, &idss); err == nil && len(idss) == 1 {
		return promptFromIDs(idss[0])
	}
	return genInput{}, errBadInput{"prompt must be a string, a list of token ids, or a batch of one"}
}

// chatTemplate is the simulator's chat template, rendered straight to ids
// as a real template's special tokens are: per message "<|role|>\n" and
// the content, then EOS, the token the model ends its turns with; then
// "<|assistant|>\n" for the reply. A generation that ends with EOS is thus
// rendered back, in the next turn's conversation, as exactly the ids it
// was; with ChatStripThink, earlier assistant turns lose their <think>
// blocks first, as Qwen3's template does, and the conversation no longer
// extends its trajectory.
func (e *Engine) chatTemplate(msgs []chatMessage, drift bool) []int {
	var ids []int
	for i, m := range msgs {
		text := m.text()
		if e.cfg.ChatStripThink && m.Role == "assistant" {
			text = thinkRe.ReplaceAllString(text, "")
		}
		ids = append(ids, Encode("<|"+m.Role+"|>\n"+text)...)
		if drift && m.Role == "user" && i < len(msgs)-1 {
			ids = append(ids, Encode("\n")...) // the other revision's end of a user turn
			continue
		}
		ids = append(ids, EOSID)
	}
	return append(ids, Encode("<|assistant|>\n")...)
}

var thinkRe = regexp.MustCompile(`(?s)<think>.*?</think>\s*`)

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (m chatMessage) text() string {
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		oaiCommon
		Messages []chatMessage `json:"messages"`
		Logprobs bool          `json:"logprobs"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages must not be empty")
		return
	}
	in, err := promptFromIDs(e.chatTemplate(req.Messages, e.drifts(routingKey(r, ""))))
	if err != nil {
		writeGenError(w, r, err)
		return
	}
	id := fmt.Sprintf("chatcmpl-%x", hash64(time.Now().UnixNano(), in.prompt))
	req.apply(&in, r, id)
	model := cmpOr(req.Model, e.cfg.Model)
	logprobs := func(out *genOutput, from, to int) any {
		if !req.Logprobs || e.cfg.Omit.LogProbs {
			return nil
		}
		content := make([]map[string]any, 0, to-from)
		for i := from; i < to; i++ {
			t := e.tokenString(out.ids[i], req.ReturnTokensAsTokenIDs && !e.cfg.Omit.TokenIDs)
			content = append(content, map[string]any{"token": t, "logprob": out.logprobs[i],
				"bytes": []byte(tokenText(out.ids[i])), "top_logprobs": []any{}})
		}
		return map[string]any{"content": content}
	}
	envelope := func(out *genOutput, object string, choices []any) map[string]any {
		return map[string]any{"id": id, "object": object, "created": time.Now().Unix(), "model": model,
			"choices": choices, "metadata": e.metadata(out)}
	}
	if !req.Stream {
		out, err := e.generate(r.Context(), in, nil)
		if err != nil {
			writeGenError(w, r, err)
			return
		}
		ch := map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": out.text},
			"logprobs": logprobs(out, 0, len(out.ids)), "finish_reason": out.finish}
		body := envelope(out, "chat.completion", []any{ch})
		if req.ReturnTokenIDs && !e.cfg.Omit.TokenIDs {
			// vLLM: choices[].token_ids, and prompt_token_ids beside the choices.
			ch["token_ids"] = out.ids
			body["prompt_token_ids"] = in.ids
		}
		body["usage"] = usage(out)
		writeJSON(w, http.StatusOK, body)
		return
	}
	sse := newSSE(w)
	sent := 0
	delta := func(out *genOutput, to int, finish string) map[string]any {
		d := map[string]any{"content": out.textAt(to)[len(out.textAt(sent)):]}
		if sent == 0 {
			d["role"] = "assistant"
		}
		ch := map[string]any{"index": 0, "delta": d, "logprobs": logprobs(out, sent, to), "finish_reason": nullable(finish)}
		chunk := envelope(out, "chat.completion.chunk", []any{ch})
		if req.ReturnTokenIDs && !e.cfg.Omit.TokenIDs {
			ch["token_ids"] = out.ids[sent:to]
			if sent == 0 {
				chunk["prompt_token_ids"] = in.ids // vLLM: only in the first chunk
			}
		}
		sent = to
		return chunk
	}
	out, err := e.generate(r.Context(), in, func(out *genOutput, n int) error {
		return sse.send(delta(out, n, ""))
	})
	if err != nil {
		sse.fail(r, err)
		return
	}
	_ = sse.send(delta(out, len(out.ids), out.finish))
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		body := envelope(out, "chat.completion.chunk", []any{})
		body["usage"] = usage(out)
		_ = sse.send(body)
	}
	sse.done()
}

func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": e.cfg.Model, "object": "model", "owned_by": "planact-sim", "max_model_len": maxModelLen},
	}})
}

// ---- reward ----

var answerTagRe = regexp.MustCompile(`(?s)<answer>(.*?)</answer>`)

// handleReward scores {prompt, response, label}: the F1 of the response's
// <answer> (or the whole response) against the label.
func (e *Engine) handleReward(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt   string `json:"prompt"`
		Response string `json:"response"`
		Label    string `json:"label"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeGenError(w, r, err)
		return
	}
	resp := req.Response
	if m := answerTagRe.FindAllStringSubmatch(resp, -1); m != nil {
		resp = m[len(m)-1][1]
	}
	writeJSON(w, http.StatusOK, reward.F1(resp, req.Label))
}

// ---- server-sent events ----

type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newSSE(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// fail reports a generation error: as an HTTP error while nothing was
// streamed yet, else as a last event, the way the real servers do.
func (s *sseWriter) fail(r *http.Request, err error) {
	if !s.started {
		writeGenError(s.w, r, err)
		return
	}
	_ = s.send(map[string]any{"error": map[string]any{"message": err.Error()}})
	s.done()
}

func (s *sseWriter) start() {
	if !s.started {
		s.w.Header().Set("Content-Type", "text/event-stream")
		s.w.Header().Set("Cache-Control", "no-cache")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
}

func (s *sseWriter) send(v any) error {
	s.start()
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", data); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseWriter) done() {
	s.start()
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	_ = s.rc.Flush()
}

// Serve listens on addr ("127.0.0.1:0" picks a port) and serves a simulated
// engine until ctx ends; it returns the engine's base URL. Requests still
// running when ctx ends (hangs included) are cancelled.
func Serve(ctx context.Context, addr string, cfg Config) (string, error) {
	url, _, err := ServeEngine(ctx, addr, New(cfg))
	return url, err
}

// logprobTriples is SGLang's output_token_logprobs, [[logprob, id, null], …],
// written in one pass: a long plan has thousands.
type logprobTriples struct {
	logprobs []float64
	ids      []int
}

func (l logprobTriples) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2+len(l.ids)*32)
	b = append(b, '[')
	for i, id := range l.ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendFloat(b, l.logprobs[i], 'g', -1, 64)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(id), 10)
		b = append(b, ",null]"...)
	}
	return append(b, ']'), nil
}

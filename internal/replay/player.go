package replay

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/planact/planact/pkg/schema"
	actdispatcher "github.com/planact/planact/services/act-dispatcher"
)

// player plays the engines (and the HTTP tools and the reward server) of a
// recording: it speaks SGLang's protocol, whatever the recording's engines
// spoke, and answers every request with what the recorded engine answered
// to it. A request it cannot find in the recording is answered with an
// error that says so, and noted.
//
//	/planner/generate, /actor/generate  by the episode (its routing key) and
//	                                    the input ids: the recorded output ids,
//	                                    log-probs, text, finish reason, weights
//	/planner/tokenize, /actor/tokenize  the ids the recording holds for the text
//	/tool/<name>                        the recorded output of the call
//	/reward                             the recorded reward of the answer
type player struct {
	rec *Recording
	// episodes maps the replay's episodes to the recording's.
	episodes map[int]int
	srv      *http.Server
	url      string

	mu      sync.Mutex
	tokens  map[string][]int       // text -> the ids the recording holds for it
	turns   map[int][]recordedTurn // recorded episode -> its planner turns
	scripts map[string][]*script   // what an act or tool call was answered, by what it was asked
	rewards map[string]float64     // label + answer -> reward
	notes   []string               // what the recording could not answer as asked
	unused  map[*script]string     // recorded calls not asked for yet, and what they were
}

// recordedTurn is one planner turn of the recording: the ids it was given
// and what it generated (nil when no generation was recorded: the turn
// failed before or at the engine, as err says).
type recordedTurn struct {
	turn   int
	input  []int
	output *schema.Segment
	finish string
	err    *PlanError
}

// script is what one recorded act's engine or tool calls answered,
// attempt by attempt: its failed attempts, then its outcome.
type script struct {
	act      *schema.ActDone
	failures int // attempts that failed before the last
	next     int // attempts answered so far
}

func newEngine(rec *Recording, episodes map[int]int) (*player, error) {
	e := &player{rec: rec, episodes: episodes, tokens: map[string][]int{}, turns: map[int][]recordedTurn{},
		scripts: map[string][]*script{}, rewards: map[string]float64{}, unused: map[*script]string{}}
	for _, ep := range rec.Episodes {
		e.learnEpisode(ep)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e.url = "http://" + ln.Addr().String()
	e.srv = &http.Server{Handler: e}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

func (e *player) close() { _ = e.srv.Close() }

// learnEpisode indexes what episode ep's engines were asked and answered.
func (e *player) learnEpisode(ep *Episode) {
	for _, seg := range ep.Trajectory {
		if seg.Kind != schema.SegGenerated {
			e.tokens[seg.Text] = seg.IDs
		}
	}
	for _, t := range ep.Turns {
		rt := recordedTurn{turn: t.Turn, finish: t.FinishReason, err: t.Error}
		for i := range ep.Trajectory {
			seg := &ep.Trajectory[i]
			if seg.Kind == schema.SegGenerated && seg.Turn == t.Turn {
				rt.output = seg
				break
			}
			if seg.Turn <= t.Turn {
				rt.input = append(rt.input, seg.IDs...)
			}
		}
		e.turns[ep.Episode] = append(e.turns[ep.Episode], rt)
	}
	cfg := e.rec.config()
	for i := range ep.Acts {
		d := &ep.Acts[i]
		if d.Status != schema.ActDoneOK && d.Status != schema.ActFailed || d.ErrorKind == schema.ActErrDuplicate {
			continue // no engine or tool was asked
		}
		s := &script{act: d, failures: max(d.Attempts-1, 0)}
		tool, _ := cfg.Tool(d.Tool)
		var key string
		switch {
		case tool.Kind == schema.ToolHTTP:
			key = toolKey(d.Tool, d.Input)
		case d.Generation != nil:
			e.tokens[d.Generation.Prompt] = d.Generation.PromptIDs
			key = actKey(ep.Episode, d.Generation.PromptIDs)
		default:
			// Failed without a generation: its prompt's ids were never
			// recorded. Today's prompt for the act gets ids of its own
			// (negative: no tokenizer's), the same for the same text,
			// which the engine answers as the act was answered.
			// A drift says how many ids were sent: as many, so that the
			// replay says the same.
			prompt := actdispatcher.ActorPrompt(tool, d.Input)
			ids, ok := e.tokens[prompt]
			if !ok {
				h := fnv.New32a()
				h.Write([]byte(prompt))
				n := 2
				if m := driftCounts.FindStringSubmatch(d.Error); m != nil {
					n, _ = strconv.Atoi(m[2])
				}
				ids = slices.Repeat([]int{-1 - int(h.Sum32()>>1)}, max(n, 1))
				e.tokens[prompt] = ids
			}
			key = actKey(ep.Episode, ids)
		}
		e.scripts[key] = append(e.scripts[key], s)
		e.unused[s] = fmt.Sprintf("episode %d act %s (%s %q)", ep.Episode, d.Key, d.Tool, d.Input)
	}
	if ep.End != nil && ep.End.Status == schema.EpisodeCompleted && ep.Episode < len(e.rec.Tasks) {
		// The reward of the episode's answer, from its samples.
		id := fmt.Sprintf("%d-%d", e.rec.Rollout, ep.Episode)
		for _, res := range e.rec.Results {
			for _, s := range res.Samples {
				if s.RolloutID == id {
					e.rewards[e.rec.Tasks[ep.Episode].Label+"\x00"+strings.Join(ep.End.Answers, " | ")] = s.Reward
				}
			}
		}
	}
}

// config is the recording's rollout config, as the session-store took it:
// the planner's, else the actor's.
func (r *Recording) config() schema.Config {
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		if a := r.Arrivals[role]; a != nil && a.Config != nil {
			return a.Config.WithDefaults()
		}
	}
	return schema.DefaultConfig()
}

// driftCounts reads the counts of a drift that only counts told
// (engine.DriftError's words): consumed, then sent.
var driftCounts = regexp.MustCompile(`reports (\d+) prompt tokens \(prompt_tokens\) for the (\d+) planact sent`)

// drifted is how many prompt tokens the engine of a recorded act that
// drifted said it took, for sent ids: as recorded when it said, else one more.
func drifted(d *schema.ActDone, sent int) int {
	if m := driftCounts.FindStringSubmatch(d.Error); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return n
		}
	}
	return sent + 1
}

func actKey(episode int, ids []int) string {
	return "act:" + strconv.Itoa(episode) + ":" + digestInts(ids)
}

func toolKey(tool, input string) string { return "tool:" + tool + "\x00" + input }

// note records something the recording could not answer as asked; e.mu is held.
func (e *player) note(format string, args ...any) {
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// Notes are what the engine could not answer from the recording as it
// was asked, and the recorded calls never asked for.
func (e *player) Notes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := slices.Clone(e.notes)
	var unused []string
	for _, what := range e.unused {
		unused = append(unused, what+": recorded, never asked for in the replay")
	}
	slices.Sort(unused)
	return append(out, unused...)
}

// take returns the recorded call that answers the next request with key,
// and which of its attempts this request is.
func (e *player) take(key string) (*script, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	list := e.scripts[key]
	if len(list) == 0 {
		return nil, 0
	}
	s := list[len(list)-1] // asked more often than recorded: answered as its last attempt
	for _, c := range list {
		if c.next <= c.failures {
			s = c
			break
		}
	}
	delete(e.unused, s)
	attempt := s.next
	s.next++
	return s, attempt
}

func (e *player) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/planner/generate":
		e.generate(w, r, true)
	case r.URL.Path == "/actor/generate":
		e.generate(w, r, false)
	case strings.HasSuffix(r.URL.Path, "/tokenize"):
		e.tokenize(w, r)
	case strings.HasSuffix(r.URL.Path, "/health"):
		writeJSON(w, http.StatusOK, map[string]any{})
	case strings.HasSuffix(r.URL.Path, "/get_weight_version"):
		role := schema.RoleActor
		if strings.HasPrefix(r.URL.Path, "/planner/") {
			role = schema.RolePlanner
		}
		writeJSON(w, http.StatusOK, map[string]any{"weight_version": e.rec.Arrivals[role].WeightVersion})
	case strings.HasPrefix(r.URL.Path, "/tool/"):
		e.tool(w, r, strings.TrimPrefix(r.URL.Path, "/tool/"))
	case r.URL.Path == "/reward":
		e.reward(w, r)
	case strings.HasSuffix(r.URL.Path, "/abort_request"):
		writeJSON(w, http.StatusOK, map[string]any{})
	default:
		http.Error(w, "replay: the recorded engine has no "+r.URL.Path, http.StatusNotFound)
	}
}

func (e *player) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	ids, ok := e.tokens[req.Prompt]
	if !ok {
		e.note("tokenize: today's planact asked for a text the recording never tokenized: %.120q", req.Prompt)
	}
	e.mu.Unlock()
	if !ok {
		http.Error(w, fmt.Sprintf("replay: the recording never tokenized this text (%d bytes): today's planact wrote another prompt or observation", len(req.Prompt)), http.StatusBadRequest)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ids, "count": len(ids)})
}

type generateRequest struct {
	InputIDs   []int  `json:"input_ids"`
	Text       string `json:"text"`
	Stream     bool   `json:"stream"`
	RoutingKey string `json:"routing_key"`
}

// episodeOf is the recorded episode the routing key of a request names.
func (e *player) episodeOf(r *http.Request, body string) (int, bool) {
	key := r.Header.Get("X-SMG-Routing-Key")
	if key == "" {
		key = body
	}
	_, ep, ok := strings.Cut(key, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(ep)
	if err != nil {
		return 0, false
	}
	rec, ok := e.episodes[n]
	return rec, ok
}

func (e *player) generate(w http.ResponseWriter, r *http.Request, planner bool) {
	var req generateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ep, ok := e.episodeOf(r, req.RoutingKey)
	if !ok {
		http.Error(w, "replay: the request names no episode of the replay (routing key)", http.StatusBadRequest)
		return
	}
	if planner {
		e.plannerTurn(w, r, ep, req)
		return
	}
	e.act(w, r, ep, req)
}

// plannerTurn answers a planner turn of recorded episode ep: the turn whose
// recorded input the request's ids are; when none is, the turn whose input
// they share the longest prefix with, noting where they differ.
func (e *player) plannerTurn(w http.ResponseWriter, r *http.Request, ep int, req generateRequest) {
	e.mu.Lock()
	turns := e.turns[ep]
	best, at := -1, -1
	for i, t := range turns {
		if slices.Equal(t.input, req.InputIDs) {
			best, at = i, len(t.input)
			break
		}
		if p := commonPrefix(t.input, req.InputIDs); p > at {
			best, at = i, p
		}
	}
	if best < 0 {
		e.mu.Unlock()
		http.Error(w, fmt.Sprintf("replay: episode %d has no recorded planner turn", ep), http.StatusBadRequest)
		return
	}
	t := turns[best]
	if !slices.Equal(t.input, req.InputIDs) {
		e.note("episode %d: the planner was asked with %d ids that are no recorded turn's input; answered as turn %d (%d ids), the first difference at id %d",
			ep, len(req.InputIDs), t.turn, len(t.input), at)
	}
	e.mu.Unlock()
	switch {
	case t.output != nil:
	case t.err != nil && t.err.Kind == schema.PlanErrPlannerRejected:
		http.Error(w, "replay: the recorded planner refused this turn: "+t.err.Message, http.StatusBadRequest)
		return
	case t.err != nil && t.err.Kind == schema.PlanErrTokenDrift:
		// The recorded engine's input drifted: it says so again.
		writeGeneration(w, req, len(req.InputIDs)+1, &schema.Segment{}, "stop", "")
		return
	default:
		http.Error(w, fmt.Sprintf("replay: the recording has no generation of episode %d turn %d", ep, t.turn), http.StatusServiceUnavailable)
		return
	}
	writeGeneration(w, req, len(req.InputIDs), t.output, t.finish, t.output.Version)
}

// act answers an act of recorded episode ep: the recorded act of the same
// episode asked with the same ids, attempt by attempt.
func (e *player) act(w http.ResponseWriter, r *http.Request, ep int, req generateRequest) {
	s, attempt := e.take(actKey(ep, req.InputIDs))
	if s == nil {
		e.mu.Lock()
		e.note("episode %d: an act was asked with %d ids that no recorded act of the episode was", ep, len(req.InputIDs))
		e.mu.Unlock()
		http.Error(w, "replay: no recorded act of this episode was asked with these ids", http.StatusBadRequest)
		return
	}
	d := s.act
	if attempt < s.failures || d.Status != schema.ActDoneOK {
		if attempt >= s.failures && d.ErrorKind == schema.ActErrTokenDrift {
			// The recorded engine's input drifted: it says so again.
			writeGeneration(w, req, drifted(d, len(req.InputIDs)), &schema.Segment{}, "stop", "")
			return
		}
		failAttempt(w, r, d, attempt >= s.failures)
		return
	}
	g := d.Generation
	seg := &schema.Segment{Text: g.Text, IDs: g.OutputIDs, LogProbs: g.LogProbs, Version: g.WeightVersion}
	writeGeneration(w, req, len(req.InputIDs), seg, g.FinishReason, g.WeightVersion)
}

// failAttempt answers an attempt that failed when recorded as it failed:
// the act's last attempt by its error kind (a time-out runs until the
// caller's deadline again, a refusal is a 4xx), an earlier one, which was
// tried again, as an engine error.
func failAttempt(w http.ResponseWriter, r *http.Request, d *schema.ActDone, last bool) {
	switch {
	case last && d.ErrorKind == schema.ActErrTimeout:
		<-r.Context().Done()
	case last && d.ErrorKind == schema.ActErrInvalid:
		http.Error(w, "replay: refused when recorded: "+d.Error, http.StatusBadRequest)
	default:
		http.Error(w, "replay: this attempt failed when recorded: "+d.Error, http.StatusInternalServerError)
	}
}

// writeGeneration answers /generate as SGLang does, with seg's text, ids
// and log-probs, streamed when asked (the text growing at every line or
// closing tag, as a plan's nodes complete; ids and log-probs at the end).
func writeGeneration(w http.ResponseWriter, req generateRequest, promptTokens int, seg *schema.Segment, finish, version string) {
	reply := func(text string, final bool) map[string]any {
		meta := map[string]any{"prompt_tokens": promptTokens, "cached_tokens": 0}
		body := map[string]any{"text": text, "meta_info": meta}
		if version != "" {
			meta["weight_version"] = version
		}
		if !final {
			meta["finish_reason"] = nil
			return body
		}
		fr := map[string]any{"type": cmpOr(finish, "stop")}
		meta["finish_reason"] = fr
		meta["completion_tokens"] = len(seg.IDs)
		body["output_ids"] = seg.IDs
		if len(seg.LogProbs) == len(seg.IDs) && len(seg.IDs) > 0 {
			lps := make([][]any, len(seg.IDs))
			for i, id := range seg.IDs {
				lps[i] = []any{seg.LogProbs[i], id, nil}
			}
			meta["output_token_logprobs"] = lps
		}
		return body
	}
	if !req.Stream {
		writeJSON(w, http.StatusOK, reply(seg.Text, true))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	send := func(v any) {
		data, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", data)
		if fl != nil {
			fl.Flush()
		}
	}
	for i, c := range seg.Text {
		if c == '\n' || c == '>' || c == '}' {
			send(reply(seg.Text[:i+1], false))
		}
	}
	send(reply(seg.Text, true))
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (e *player) tool(w http.ResponseWriter, r *http.Request, name string) {
	var req struct {
		Queries []string `json:"queries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Queries) != 1 {
		http.Error(w, "replay: want {\"queries\": [one input]}", http.StatusBadRequest)
		return
	}
	s, attempt := e.take(toolKey(name, req.Queries[0]))
	if s == nil {
		e.mu.Lock()
		e.note("tool %s: today's planact called it with an input the recording never did: %.120q", name, req.Queries[0])
		e.mu.Unlock()
		http.Error(w, "replay: no recorded call of this tool with this input", http.StatusBadRequest)
		return
	}
	if attempt < s.failures || s.act.Status != schema.ActDoneOK {
		failAttempt(w, r, s.act, attempt >= s.failures)
		return
	}
	fmt.Fprint(w, s.act.Output)
}

func (e *player) reward(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Response string `json:"response"`
		Label    string `json:"label"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	v, ok := e.rewards[req.Label+"\x00"+req.Response]
	if !ok {
		e.note("reward: an answer the recording never scored: %.120q (label %q)", req.Response, req.Label)
	}
	e.mu.Unlock()
	if !ok {
		http.Error(w, "replay: the recording never scored this answer", http.StatusBadRequest)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func commonPrefix(a, b []int) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func cmpOr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

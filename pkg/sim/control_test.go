package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// sglGen is the part of a /generate reply these tests read.
type sglGen struct {
	Text      string `json:"text"`
	OutputIDs []int  `json:"output_ids"`
	MetaInfo  struct {
		ID           string `json:"id"`
		FinishReason *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"finish_reason"`
		WeightVersion string `json:"weight_version"`
	} `json:"meta_info"`
}

// generateAsync posts a /generate and returns the last reply (or event) it
// got; a streamed reply is read to its end.
func generateAsync(t *testing.T, url string, body map[string]any) <-chan sglGen {
	return generateAsyncStream(t, url, body, nil)
}

// generateAsyncStream is generateAsync that closes first at the first
// event of a stream.
func generateAsyncStream(t *testing.T, url string, body map[string]any, first chan struct{}) <-chan sglGen {
	t.Helper()
	out := make(chan sglGen, 1)
	go func() {
		data, _ := json.Marshal(body)
		resp, err := http.Post(url+"/generate", "application/json", bytes.NewReader(data))
		if err != nil {
			t.Error(err)
			out <- sglGen{}
			return
		}
		defer resp.Body.Close()
		var last sglGen
		if stream, _ := body["stream"].(bool); stream {
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok && line != "[DONE]" {
					last = sglGen{}
					json.Unmarshal([]byte(line), &last)
					if first != nil {
						close(first)
						first = nil
					}
				}
			}
		} else {
			json.NewDecoder(resp.Body).Decode(&last)
		}
		out <- last
	}()
	return out
}

// TestAbortRequestEndpoint: POST /abort_request {"rid"} ends the running
// generation of that rid with what it generated and finish reason abort
// (SGLang's {"type": "abort", "message"}), and the engine records it.
func TestAbortRequestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   map[string]any
		tokens bool // some were generated before the abort
	}{
		{"hang", map[string]any{"text": "Input: x " + FaultHang}, false},
		{"streaming", map[string]any{"text": plannerPromptText("What is the capital of France?", FormatGraph), "stream": true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{PerToken: 10 * time.Millisecond})
			srv := httptest.NewServer(e)
			defer srv.Close()
			tc.body["rid"] = "req-1"
			first := make(chan struct{})
			done := generateAsyncStream(t, srv.URL, tc.body, first)
			waitFor(t, func() bool { return e.InFlight() == 1 })
			if tc.tokens {
				<-first // it has written a little
			}
			if code := post(t, srv.URL+"/abort_request", map[string]any{"rid": "req-1"}, nil); code != 200 {
				t.Fatalf("abort_request: %d", code)
			}
			got := <-done
			if fr := got.MetaInfo.FinishReason; fr == nil || fr.Type != "abort" || !strings.Contains(fr.Message, "req-1") || got.MetaInfo.ID != "req-1" {
				t.Errorf("aborted reply = %+v", got)
			}
			if tc.tokens && (len(got.OutputIDs) == 0 || len(got.Text) >= 100) {
				t.Errorf("aborted stream: %d tokens, %q", len(got.OutputIDs), got.Text)
			}
			// Unknown rids are fine, as in SGLang.
			if code := post(t, srv.URL+"/abort_request", map[string]any{"rid": "nobody"}, nil); code != 200 {
				t.Errorf("abort of an unknown rid: %d", code)
			}
			want := []Abort{{RID: "req-1", By: "abort_request", Running: true}, {RID: "nobody", By: "abort_request"}}
			if got := e.Aborts(); !reflect.DeepEqual(got, want) {
				t.Errorf("aborts %+v, want %+v", got, want)
			}
		})
	}
}

// TestPauseEndpoints: SGLang's /pause_generation {"mode"} and
// /continue_generation, vLLM's /pause?mode=, /resume and /is_paused.
func TestPauseEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		body       any
		code       int
		mode       string
		aborts     bool // the running generation ends, aborted
	}{
		{"sglang default", "/pause_generation", nil, 200, "abort", true},
		{"sglang abort", "/pause_generation", map[string]any{"mode": "abort"}, 200, "abort", true},
		{"sglang in_place", "/pause_generation", map[string]any{"mode": "in_place"}, 200, "in_place", false},
		{"sglang retract", "/pause_generation", map[string]any{"mode": "retract"}, 200, "retract", false},
		{"sglang bad mode", "/pause_generation", map[string]any{"mode": "keep"}, 400, "", false},
		{"vllm default", "/pause", nil, 200, "abort", true},
		{"vllm keep", "/pause?mode=keep", nil, 200, "keep", false},
		{"vllm bad mode", "/pause?mode=in_place", nil, 400, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{Role: RoleActor})
			srv := httptest.NewServer(e)
			defer srv.Close()
			running := generateAsync(t, srv.URL, map[string]any{"text": "Input: capital of Peru " + FaultHang, "rid": "h"})
			// Past the gate: a pause that lands before it holds it instead.
			waitFor(t, func() bool { return e.Started() == 1 })
			var reply map[string]any
			if code := post(t, srv.URL+tc.path, tc.body, &reply); code != tc.code {
				t.Fatalf("%s: %d %v", tc.path, code, reply)
			}
			var is struct {
				IsPaused bool `json:"is_paused"`
			}
			get(t, srv.URL+"/is_paused", &is)
			if paused, mode := e.Paused(); paused != (tc.code == 200) || mode != tc.mode || is.IsPaused != paused {
				t.Fatalf("paused %v (%v) mode %q, want mode %q", paused, is.IsPaused, mode, tc.mode)
			}
			if tc.code != 200 {
				e.AbortRequest("h", false)
				<-running
				return
			}
			if tc.aborts {
				if g := <-running; g.MetaInfo.FinishReason == nil || g.MetaInfo.FinishReason.Type != "abort" {
					t.Errorf("running generation after pause: %+v", g)
				}
			}
			queued := generateAsync(t, srv.URL, map[string]any{"text": actorPrompt})
			busy := 1
			if tc.aborts {
				busy = 0
			}
			waitFor(t, func() bool { return e.InFlight() == busy+1 })
			select {
			case g := <-queued:
				t.Fatalf("a request ran while paused: %+v", g)
			default:
			}
			resume := "/continue_generation"
			if strings.HasPrefix(tc.path, "/pause?") || tc.path == "/pause" {
				resume = "/resume"
			}
			if code := post(t, srv.URL+resume, nil, &reply); code != 200 {
				t.Fatalf("%s: %d %v", resume, code, reply)
			}
			if g := <-queued; g.Text != "Paris" {
				t.Errorf("queued request = %+v", g)
			}
			if !tc.aborts {
				e.AbortRequest("h", false)
				<-running
			}
		})
	}
}

// TestVLLMPauseWait: vLLM's mode wait answers once the running generations
// have finished; new requests wait for /resume.
func TestVLLMPauseWait(t *testing.T) {
	e := New(Config{Role: RoleActor})
	srv := httptest.NewServer(e)
	defer srv.Close()
	running := generateAsync(t, srv.URL, map[string]any{"text": "Input: capital of Peru " + FaultHang, "rid": "h"})
	// Past the gate: a pause that lands before it holds it instead.
	waitFor(t, func() bool { return e.Started() == 1 })
	paused := make(chan int, 1)
	go func() { paused <- post(t, srv.URL+"/pause?mode=wait", nil, nil) }()
	waitFor(t, func() bool { p, _ := e.Paused(); return p })
	select {
	case code := <-paused:
		t.Fatalf("pause in mode wait answered %d while a generation ran", code)
	default:
	}
	e.AbortRequest("h", false)
	<-running
	if code := <-paused; code != 200 {
		t.Errorf("pause: %d", code)
	}
	e.Continue()
}

// TestWeightEndpoints: SGLang's /get_weight_version, /update_weight_version
// and /update_weights_from_disk, which waits for the running generations
// (holding new ones) unless told to abort them.
func TestWeightEndpoints(t *testing.T) {
	e := New(Config{Role: RoleActor, WeightVersion: "v1", Model: "m0"})
	srv := httptest.NewServer(e)
	defer srv.Close()
	var wv struct {
		WeightVersion string `json:"weight_version"`
	}
	get(t, srv.URL+"/get_weight_version", &wv)
	if wv.WeightVersion != "v1" {
		t.Errorf("get_weight_version = %+v", wv)
	}
	var upd map[string]any
	post(t, srv.URL+"/update_weight_version", map[string]any{"new_version": "v2"}, &upd)
	if upd["success"] != true || upd["new_version"] != "v2" || e.WeightVersion() != "v2" {
		t.Errorf("update_weight_version = %v", upd)
	}
	if code := post(t, srv.URL+"/update_weights_from_disk", map[string]any{"weight_version": "v3"}, nil); code != 400 {
		t.Errorf("update without model_path: %d", code)
	}

	running := generateAsync(t, srv.URL, map[string]any{"text": "Input: capital of Peru " + FaultHang, "rid": "h"})
	// Past the gate: a pause that lands before it holds it instead.
	waitFor(t, func() bool { return e.Started() == 1 })
	updated := make(chan map[string]any, 1)
	go func() {
		var out map[string]any
		post(t, srv.URL+"/update_weights_from_disk", map[string]any{"model_path": "/ckpt/3", "weight_version": "v3"}, &out)
		updated <- out
	}()
	waitFor(t, e.Holding)
	queued := generateAsync(t, srv.URL, map[string]any{"text": actorPrompt})
	waitFor(t, func() bool { return e.InFlight() == 2 })
	select {
	case out := <-updated:
		t.Fatalf("weights updated while a generation ran: %v", out)
	case g := <-queued:
		t.Fatalf("a request ran during a weight update: %+v", g)
	default:
	}
	e.AbortRequest("h", false)
	<-running
	if out := <-updated; out["success"] != true || e.WeightVersion() != "v3" || e.ModelPath() != "/ckpt/3" {
		t.Errorf("update_weights_from_disk = %v; version %q, model %q", out, e.WeightVersion(), e.ModelPath())
	}
	if g := <-queued; g.MetaInfo.WeightVersion != "v3" {
		t.Errorf("request held through the update ran on %q", g.MetaInfo.WeightVersion)
	}

	// abort_all_requests: the running generation ends, aborted.
	running = generateAsync(t, srv.URL, map[string]any{"text": "Input: capital of Peru " + FaultHang, "rid": "h2"})
	// Past the gate: a pause that lands before it holds it instead.
	waitFor(t, func() bool { return e.Started() == 1 })
	post(t, srv.URL+"/update_weights_from_disk", map[string]any{"model_path": "/ckpt/4", "weight_version": "v4", "abort_all_requests": true}, nil)
	if g := <-running; g.MetaInfo.FinishReason == nil || g.MetaInfo.FinishReason.Type != "abort" || e.WeightVersion() != "v4" {
		t.Errorf("after an update that aborts: %+v, version %q", g, e.WeightVersion())
	}
	var info map[string]any
	get(t, srv.URL+"/get_model_info", &info)
	if info["model_path"] != "/ckpt/4" || info["weight_version"] != "v4" {
		t.Errorf("model info %v", info)
	}
}

// TestBusyFaults: FaultBusy answers 429 with Retry-After, FaultUnavailable
// 503 without, a counted marker only so many times; BusyRate at random.
func TestBusyFaults(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        Config
		text       string
		codes      []int
		retryAfter string
	}{
		{"busy twice", Config{RetryAfter: "7"}, actorPrompt + FaultTimes(FaultBusy, 2), []int{429, 429, 200}, "7"},
		{"busy, default Retry-After", Config{}, actorPrompt + FaultBusy, []int{429, 429}, "1"},
		{"unavailable once", Config{}, actorPrompt + FaultTimes(FaultUnavailable, 1), []int{503, 200}, ""},
		{"busy rate", Config{Faults: Faults{BusyRate: 1}, RetryAfter: "Wed, 21 Oct 2037 07:28:00 GMT"}, actorPrompt, []int{429}, "Wed, 21 Oct 2037 07:28:00 GMT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Role = RoleActor
			srv := httptest.NewServer(New(tc.cfg))
			defer srv.Close()
			for i, want := range tc.codes {
				data, _ := json.Marshal(map[string]any{"text": tc.text})
				resp, err := http.Post(srv.URL+"/generate", "application/json", bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
				}
				if got := resp.Header.Get("Retry-After"); want != 200 && got != tc.retryAfter {
					t.Errorf("request %d: Retry-After %q, want %q", i, got, tc.retryAfter)
				}
			}
		})
	}
}

// TestRoutingKeysAndStats: the engine counts routing keys, from the
// X-SMG-Routing-Key header or SGLang's routing_key, and reports them with
// its state at GET /sim/stats.
func TestRoutingKeysAndStats(t *testing.T) {
	e := New(Config{Role: RoleActor, WeightVersion: "v5"})
	srv := httptest.NewServer(e)
	defer srv.Close()
	send := func(path string, body map[string]any, key string) {
		data, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(data))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("X-SMG-Routing-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("/generate", map[string]any{"text": actorPrompt, "routing_key": "1-0"}, "")
	send("/generate", map[string]any{"text": actorPrompt, "routing_key": "ignored"}, "1-0")
	send("/v1/completions", map[string]any{"prompt": actorPrompt}, "1-1")
	send("/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": actorPrompt}}}, "1-1")
	send("/generate", map[string]any{"text": actorPrompt}, "")
	var st Stats
	get(t, srv.URL+"/sim/stats", &st)
	want := map[string]int{"1-0": 2, "1-1": 2}
	if !reflect.DeepEqual(st.RoutingKeys, want) || !reflect.DeepEqual(e.RoutingKeys(), want) || st.Requests != 5 || st.WeightVersion != "v5" || st.InFlight != 0 || st.Paused {
		t.Errorf("stats = %+v", st)
	}
}

// TestChatTemplateIDs: the chat endpoint renders a conversation to ids with
// EOS ending every message, returns them as vLLM does (prompt_token_ids
// beside the choices; in a stream, in the first chunk only), and renders a
// generation that ended with EOS back as exactly its ids.
func TestChatTemplateIDs(t *testing.T) {
	for _, strip := range []bool{false, true} {
		e := New(Config{Role: RoleActor, ChatStripThink: strip})
		srv := httptest.NewServer(e)
		msgs := []map[string]string{{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>hm</think>\nyes"}, {"role": "user", "content": actorPrompt}}
		var reply struct {
			PromptTokenIDs []int `json:"prompt_token_ids"`
			Choices        []struct {
				TokenIDs       []int `json:"token_ids"`
				PromptTokenIDs []int `json:"prompt_token_ids"`
			}
		}
		post(t, srv.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "return_token_ids": true}, &reply)
		assistant := "<think>hm</think>\nyes"
		if strip {
			assistant = "yes"
		}
		want := slices.Concat(Encode("<|user|>\nhi"), []int{EOSID}, Encode("<|assistant|>\n"+assistant), []int{EOSID},
			Encode("<|user|>\n"+actorPrompt), []int{EOSID}, Encode("<|assistant|>\n"))
		if !slices.Equal(reply.PromptTokenIDs, want) || reply.Choices[0].PromptTokenIDs != nil ||
			!slices.Equal(reply.Choices[0].TokenIDs, append(Encode("Paris"), EOSID)) {
			t.Errorf("strip=%v: reply %+v\nwant prompt %v", strip, reply, want)
		}

		data, _ := json.Marshal(map[string]any{"messages": msgs[:1], "return_token_ids": true, "stream": true})
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		var firsts []int
		sc := bufio.NewScanner(resp.Body)
		for i := 0; sc.Scan(); {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ev struct {
				PromptTokenIDs []int `json:"prompt_token_ids"`
			}
			json.Unmarshal([]byte(line), &ev)
			if ev.PromptTokenIDs != nil {
				firsts = append(firsts, i)
			}
			i++
		}
		resp.Body.Close()
		srv.Close()
		if !slices.Equal(firsts, []int{0}) {
			t.Errorf("prompt_token_ids in chunks %v, want the first only", firsts)
		}
	}
}

func get(t *testing.T, url string, out any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
}

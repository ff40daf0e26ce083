package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
)

func post(t *testing.T, url string, in any, out any) int {
	t.Helper()
	data, _ := json.Marshal(in)
	resp, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("decode %s: %v", url, err)
		}
	}
	return resp.StatusCode
}

const actorPrompt = "Tool: search\nInput: capital of France\nAnswer:"

func TestSGLangGenerateEndpoint(t *testing.T) {
	e := New(Config{Role: RoleActor, Seed: 1, WeightVersion: "v1"})
	srv := httptest.NewServer(e)
	defer srv.Close()
	c, _ := engine.New("sglang", srv.URL, "", nil)
	ctx := context.Background()

	ids := append([]int{BOSID}, Encode(actorPrompt)...)
	g, err := c.Generate(ctx, engine.Request{InputIDs: ids, Sampling: engine.Sampling{MaxNewTokens: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Text != "Paris" || !reflect.DeepEqual(g.OutputIDs, append(Encode("Paris"), EOSID)) || len(g.LogProbs) != 6 ||
		g.FinishReason != "stop" || g.PromptTokens != len(ids) || g.WeightVersion != "v1" {
		t.Errorf("generation = %+v", g)
	}

	// max_new_tokens truncates; text stays the decoding of the ids.
	g, _ = c.Generate(ctx, engine.Request{Text: actorPrompt, Sampling: engine.Sampling{MaxNewTokens: 3}})
	if g.Text != "Par" || len(g.OutputIDs) != 3 || g.FinishReason != "length" {
		t.Errorf("truncated generation = %+v", g)
	}
	// A stop string is trimmed from the text, its tokens stay.
	g, _ = c.Generate(ctx, engine.Request{Text: actorPrompt, Sampling: engine.Sampling{Stop: []string{"ri"}}})
	if g.Text != "Pa" || !reflect.DeepEqual(g.OutputIDs, Encode("Pari")) || g.FinishReason != "stop" {
		t.Errorf("stopped generation = %+v", g)
	}

	e.SetWeightVersion("v2")
	g, _ = c.Generate(ctx, engine.Request{Text: actorPrompt})
	if g.WeightVersion != "v2" {
		t.Errorf("weight version %q after SetWeightVersion", g.WeightVersion)
	}
	if n, toks := e.Stats(); n != 4 || toks != 6+3+4+6 {
		t.Errorf("Stats = %d, %d", n, toks)
	}

	var raw map[string]any
	if code := post(t, srv.URL+"/generate", map[string]any{"input_ids": []int{999}}, &raw); code != 400 {
		t.Errorf("bad token id: status %d", code)
	}
	if code := post(t, srv.URL+"/generate", map[string]any{}, &raw); code != 400 {
		t.Errorf("empty request: status %d", code)
	}
}

func TestSGLangStreamEndpoint(t *testing.T) {
	e := New(Config{Role: RolePlanner, Seed: 1, PerToken: 50 * time.Microsecond}) // 20 tokens a chunk
	srv := httptest.NewServer(e)
	defer srv.Close()
	c, _ := engine.New("sglang", srv.URL, "", nil)
	prompt := plannerPromptText("What is the population of the capital of France?", FormatGraph)
	var chunks []string
	g, err := c.(engine.Streamer).GenerateStream(context.Background(), engine.Request{InputIDs: Encode(prompt)},
		func(s string) { chunks = append(chunks, s) })
	if err != nil {
		t.Fatal(err)
	}
	want, _ := New(Config{Role: RolePlanner, Seed: 1}).generate(context.Background(), promptFromText(prompt), nil)
	if g.Text != want.text || !reflect.DeepEqual(g.OutputIDs, want.ids) || !reflect.DeepEqual(g.LogProbs, want.logprobs) {
		t.Errorf("streamed generation differs:\n%+v\n%q", g, want.text)
	}
	if len(chunks) < 10 {
		t.Fatalf("only %d chunks", len(chunks))
	}
	for i := 1; i < len(chunks); i++ {
		if !strings.HasPrefix(chunks[i], chunks[i-1]) {
			t.Fatalf("chunk %d %q does not extend %q", i, chunks[i], chunks[i-1])
		}
	}
}

func TestOpenAIEndpoints(t *testing.T) {
	e := New(Config{Role: RoleActor, Seed: 1, WeightVersion: "w3"})
	srv := httptest.NewServer(e)
	defer srv.Close()
	ctx := context.Background()
	c, _ := engine.New("openai", srv.URL+"/v1", "sim-actor", nil)
	g, err := c.Generate(ctx, engine.Request{InputIDs: Encode(actorPrompt)})
	if err != nil {
		t.Fatal(err)
	}
	if g.Text != "Paris" || !reflect.DeepEqual(g.OutputIDs, append(Encode("Paris"), EOSID)) || len(g.LogProbs) != 6 ||
		g.FinishReason != "stop" || g.WeightVersion != "w3" || g.PromptTokens != len(actorPrompt) {
		t.Errorf("completion = %+v", g)
	}
	var chunks []string
	gs, err := c.(engine.Streamer).GenerateStream(ctx, engine.Request{Text: actorPrompt}, func(s string) { chunks = append(chunks, s) })
	if err != nil || gs.Text != g.Text || !reflect.DeepEqual(gs.OutputIDs, g.OutputIDs) || !reflect.DeepEqual(gs.LogProbs, g.LogProbs) {
		t.Errorf("streamed completion = %+v, %v", gs, err)
	}

	// Token ids as "token_id:<id>" strings, without return_token_ids.
	var cmpl struct {
		Choices []struct {
			Text     string
			Logprobs struct{ Tokens []string }
			TokenIDs []int `json:"token_ids"`
		}
	}
	post(t, srv.URL+"/v1/completions", map[string]any{"prompt": actorPrompt, "logprobs": 1, "return_tokens_as_token_ids": true, "max_tokens": 2}, &cmpl)
	if got := cmpl.Choices[0].Logprobs.Tokens; !reflect.DeepEqual(got, []string{"token_id:83", "token_id:100"}) || cmpl.Choices[0].TokenIDs != nil {
		t.Errorf("completion choice = %+v", cmpl.Choices[0])
	}

	var chat struct {
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
			Logprobs     struct {
				Content []struct {
					Token   string
					Logprob float64
				}
			}
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	post(t, srv.URL+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": actorPrompt}}, "logprobs": true}, &chat)
	if ch := chat.Choices[0]; ch.Message.Content != "Paris" || ch.Message.Role != "assistant" || len(ch.Logprobs.Content) != 6 ||
		ch.FinishReason != "stop" || chat.Usage.CompletionTokens != 6 {
		t.Errorf("chat = %+v", chat)
	}

	// Streamed chat: deltas join to the whole answer.
	data, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": actorPrompt}}, "stream": true})
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var text strings.Builder
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct{ Delta struct{ Content string } }
		}
		json.Unmarshal([]byte(line), &ev)
		for _, ch := range ev.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if !done || text.String() != "Paris" {
		t.Errorf("streamed chat %q, done %v", text.String(), done)
	}

	var models struct{ Data []struct{ ID string } }
	if resp, err := http.Get(srv.URL + "/v1/models"); err == nil {
		json.NewDecoder(resp.Body).Decode(&models)
		resp.Body.Close()
	}
	if len(models.Data) != 1 || models.Data[0].ID != "sim-actor" {
		t.Errorf("models = %+v", models)
	}
}

func TestTokenizerEndpointsAndInfo(t *testing.T) {
	e := New(Config{Role: RolePlanner, WeightVersion: "v9"})
	srv := httptest.NewServer(e)
	defer srv.Close()
	for _, proto := range []string{"sglang", "openai"} {
		c, _ := engine.New(proto, srv.URL, "m", nil)
		ids, err := c.Tokenize(context.Background(), "\n<observation>")
		if err != nil || !reflect.DeepEqual(ids, Encode("\n<observation>")) {
			t.Errorf("%s Tokenize = %v, %v", proto, ids, err)
		}
		if err := c.Health(context.Background()); err != nil {
			t.Errorf("%s Health = %v", proto, err)
		}
	}
	var tok struct {
		Tokens []int
		Count  int
	}
	post(t, srv.URL+"/tokenize", map[string]any{"prompt": "ab"}, &tok)
	if !reflect.DeepEqual(tok.Tokens, []int{BOSID, 'a' + ByteOffset, 'b' + ByteOffset}) || tok.Count != 3 {
		t.Errorf("tokenize with special tokens = %+v", tok)
	}
	var detok struct{ Text string }
	post(t, srv.URL+"/detokenize", map[string]any{"tokens": tok.Tokens}, &detok)
	if detok.Text != "ab" {
		t.Errorf("detokenize = %q", detok.Text)
	}
	var info map[string]any
	resp, err := http.Get(srv.URL + "/get_model_info")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if info["weight_version"] != "v9" || info["is_generation"] != true {
		t.Errorf("model info = %v", info)
	}
	post(t, srv.URL+"/update_weight_version", map[string]any{"new_version": "v10"}, nil)
	if e.WeightVersion() != "v10" {
		t.Errorf("weight version %q after /update_weight_version", e.WeightVersion())
	}
}

func TestRewardEndpoint(t *testing.T) {
	srv := httptest.NewServer(New(Config{}))
	defer srv.Close()
	for _, tc := range []struct {
		response, label string
		want            float64
	}{
		{"<think>x</think><answer>Paris</answer>", "Paris", 1},
		{"Paris", "Lyon|Paris", 1},
		{"<answer>Lyon</answer>", "Paris", 0},
		{"<answer>2.1 million</answer>", "3.1 million", 0.5},
	} {
		var got float64
		post(t, srv.URL+"/reward", map[string]string{"prompt": "q", "response": tc.response, "label": tc.label}, &got)
		if got != tc.want {
			t.Errorf("reward(%q, %q) = %v, want %v", tc.response, tc.label, got, tc.want)
		}
	}
}

func TestFaultEndpoints(t *testing.T) {
	e := New(Config{Role: RoleActor})
	srv := httptest.NewServer(e)
	defer srv.Close()
	c, _ := engine.New("sglang", srv.URL, "", nil)
	_, err := c.Generate(context.Background(), engine.Request{Text: "Tool: search\nInput: capital of France " + FaultActorError})
	if fail.KindOf(err) != fail.Transient {
		t.Errorf("actor-error: %v (kind %v), want transient", err, fail.KindOf(err))
	}
	_, err = c.Generate(context.Background(), engine.Request{Text: "Tool: search\nInput: capital of France " + FaultError})
	if fail.KindOf(err) != fail.Transient {
		t.Errorf("error: %v (kind %v), want transient", err, fail.KindOf(err))
	}
	// A hang holds until the caller gives up.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, engine.Request{Text: "Tool: search\nInput: capital of France " + FaultActorHang})
		errc <- err
	}()
	waitFor(t, func() bool { n, _ := e.Stats(); return n == 3 })
	select {
	case err := <-errc:
		t.Fatalf("hang returned early: %v", err)
	default:
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("hang returned a generation")
	}
}

func TestConcurrencyQueues(t *testing.T) {
	e := New(Config{Role: RoleActor, Concurrency: 1})
	srv := httptest.NewServer(e)
	defer srv.Close()
	c, _ := engine.New("sglang", srv.URL, "", nil)
	hangCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hung := make(chan error, 1)
	go func() {
		_, err := c.Generate(hangCtx, engine.Request{Text: "Tool: search\nInput: capital of Peru " + FaultActorHang})
		hung <- err
	}()
	// Holding the slot, not only received: a request counted by Stats
	// may still wait for the slot, and the second could take it first.
	waitFor(t, func() bool { return e.Running() == 1 })
	queued := make(chan engine.Generation, 1)
	go func() {
		g, err := c.Generate(context.Background(), engine.Request{Text: actorPrompt})
		if err != nil {
			t.Error(err)
		}
		queued <- g
	}()
	waitFor(t, func() bool { n, _ := e.Stats(); return n == 2 })
	select {
	case g := <-queued:
		t.Fatalf("second request ran while the only slot was taken: %+v", g)
	default:
	}
	cancel()
	<-hung
	if g := <-queued; g.Text != "Paris" {
		t.Errorf("queued request = %+v", g)
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	url, err := Serve(ctx, "127.0.0.1:0", Config{Role: RoleActor})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := engine.New("sglang", url, "", nil)
	if err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A hanging request is released when the server's context ends.
	errc := make(chan error, 1)
	go func() {
		_, err := c.Generate(context.Background(), engine.Request{Text: "Input: x " + FaultHang})
		errc <- err
	}()
	cancel()
	if err := <-errc; err == nil {
		t.Error("hanging request succeeded")
	}
	waitFor(t, func() bool { return c.Health(context.Background()) != nil })
}

// waitFor polls cond until it holds, failing the test after a generous deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestActorMistakesVaryPerSample: the copies of one prompt (a group) do not
// all get the same answer, as they would not from a sampling model: with an
// error rate of one half, some copies are right and some wrong (they were
// all right or all wrong, so a group's rewards had no spread and a
// group-relative trainer learnt nothing from the demo). The same seed and
// order gives the same answers.
func TestActorMistakesVaryPerSample(t *testing.T) {
	answers := func() []string {
		e := New(Config{Role: RoleActor, Seed: 3, ActorErrorRate: 0.5})
		srv := httptest.NewServer(e)
		defer srv.Close()
		c, _ := engine.New("sglang", srv.URL, "", nil)
		var out []string
		for range 16 {
			g, err := c.Generate(context.Background(), engine.Request{Text: actorPrompt, Sampling: engine.Sampling{MaxNewTokens: 64}})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, g.Text)
		}
		return out
	}
	first := answers()
	right := 0
	for _, a := range first {
		if a == "Paris" {
			right++
		}
	}
	if right == 0 || right == len(first) {
		t.Errorf("16 copies of one prompt: %d right: no spread (%v)", right, first)
	}
	if again := answers(); !reflect.DeepEqual(first, again) {
		t.Errorf("the same seed and order answered differently:\n%v\n%v", first, again)
	}
}

// TestOmit: an engine told to leave fields out of its replies does, on
// every protocol, and says what it is asked about its weights as told.
func TestOmit(t *testing.T) {
	get := func(t *testing.T, url string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	prompt := Encode(actorPrompt)
	for _, tc := range []struct {
		name     string
		omit     Omit
		endpoint string
	}{
		{"nothing", Omit{}, ""},
		{"token ids", Omit{TokenIDs: true}, ""},
		{"log-probs", Omit{LogProbs: true}, NoVersionEndpoint},
		{"weight version", Omit{WeightVersion: true}, "step-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(New(Config{Role: RoleActor, Seed: 1, WeightVersion: "step-7", Omit: tc.omit, VersionEndpoint: tc.endpoint}))
			defer srv.Close()

			var sgl struct {
				OutputIDs []int          `json:"output_ids"`
				Meta      map[string]any `json:"meta_info"`
			}
			post(t, srv.URL+"/generate", map[string]any{"input_ids": prompt, "return_logprob": true}, &sgl)
			if _, ok := sgl.Meta["output_token_logprobs"]; ok == tc.omit.LogProbs {
				t.Errorf("sglang: output_token_logprobs present %v, omitted %v", ok, tc.omit.LogProbs)
			}
			if _, ok := sgl.Meta["weight_version"]; ok == tc.omit.WeightVersion {
				t.Errorf("sglang: weight_version present %v, omitted %v", ok, tc.omit.WeightVersion)
			}
			if len(sgl.OutputIDs) == 0 {
				t.Errorf("sglang: no output_ids")
			}

			var cmpl struct {
				Choices []struct {
					TokenIDs []int `json:"token_ids"`
					Logprobs *struct {
						Tokens []string `json:"tokens"`
					} `json:"logprobs"`
				} `json:"choices"`
				Metadata map[string]any `json:"metadata"`
			}
			post(t, srv.URL+"/v1/completions", map[string]any{"prompt": prompt, "logprobs": 1,
				"return_token_ids": true, "return_tokens_as_token_ids": true}, &cmpl)
			ch := cmpl.Choices[0]
			if (ch.TokenIDs == nil) != tc.omit.TokenIDs {
				t.Errorf("completions: token_ids %v, omitted %v", ch.TokenIDs, tc.omit.TokenIDs)
			}
			if (ch.Logprobs == nil) != tc.omit.LogProbs {
				t.Errorf("completions: logprobs %v, omitted %v", ch.Logprobs, tc.omit.LogProbs)
			}
			if ch.Logprobs != nil && strings.HasPrefix(ch.Logprobs.Tokens[0], "token_id:") == tc.omit.TokenIDs {
				t.Errorf("completions: tokens %q, ids omitted %v", ch.Logprobs.Tokens, tc.omit.TokenIDs)
			}
			if _, ok := cmpl.Metadata["weight_version"]; ok == tc.omit.WeightVersion {
				t.Errorf("completions: weight_version present %v, omitted %v", ok, tc.omit.WeightVersion)
			}

			var chat struct {
				PromptTokenIDs []int `json:"prompt_token_ids"`
				Choices        []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
			}
			post(t, srv.URL+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": actorPrompt}},
				"logprobs": true, "return_token_ids": true}, &chat)
			if (chat.PromptTokenIDs == nil || chat.Choices[0].TokenIDs == nil) != tc.omit.TokenIDs {
				t.Errorf("chat: prompt_token_ids %v, token_ids %v, omitted %v", chat.PromptTokenIDs, chat.Choices[0].TokenIDs, tc.omit.TokenIDs)
			}

			code, v := get(t, srv.URL+"/get_weight_version")
			_, info := get(t, srv.URL+"/get_model_info")
			switch tc.endpoint {
			case NoVersionEndpoint:
				if code != http.StatusNotFound || info["weight_version"] != nil {
					t.Errorf("/get_weight_version %d %v, /get_model_info %v: want 404 and no version", code, v, info)
				}
			default:
				want := cmpOr(tc.endpoint, "step-7")
				if code != http.StatusOK || v["weight_version"] != want || info["weight_version"] != want {
					t.Errorf("/get_weight_version %d %v, /get_model_info %v: want %s", code, v, info, want)
				}
			}
		})
	}
}

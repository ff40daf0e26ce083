package chaos_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/internal/chaos"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

const testSeed = 11

// generate asks a simulated engine, as the gateways do (SGLang's
// /generate with input_ids), for a generation from ids, at most max tokens.
func generate(t *testing.T, url string, ids []int, max int) (out []int, logprobs []float64) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"input_ids": ids, "return_logprob": true,
		"sampling_params": map[string]any{"max_new_tokens": max},
	})
	resp, err := http.Post(url+"/generate", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		OutputIDs []int `json:"output_ids"`
		Meta      struct {
			LogProbs [][3]any `json:"output_token_logprobs"`
		} `json:"meta_info"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if len(r.OutputIDs) == 0 || len(r.Meta.LogProbs) != len(r.OutputIDs) {
		t.Fatalf("engine gave %d tokens, %d log-probs", len(r.OutputIDs), len(r.Meta.LogProbs))
	}
	for _, lp := range r.Meta.LogProbs {
		logprobs = append(logprobs, lp[0].(float64))
	}
	return r.OutputIDs, logprobs
}

// trajectory builds a sample from segments of the response: generated
// (mask 1, with the engine's log-probs) or observed (mask 0).
type trajectory struct {
	prompt string
	tokens []int
	mask   []int
	lps    []float64
}

func newTrajectory(prompt string) *trajectory {
	return &trajectory{prompt: prompt, tokens: sim.Encode(prompt)}
}

func (tr *trajectory) generated(ids []int, lps []float64) {
	tr.tokens = append(tr.tokens, ids...)
	tr.lps = append(tr.lps, lps...)
	for range ids {
		tr.mask = append(tr.mask, 1)
	}
}

func (tr *trajectory) observed(text string) {
	ids := sim.Encode(text)
	tr.tokens = append(tr.tokens, ids...)
	for range ids {
		tr.mask = append(tr.mask, 0)
		tr.lps = append(tr.lps, 0)
	}
}

func (tr *trajectory) sample(t *testing.T) schema.Sample {
	t.Helper()
	resp, err := sim.Decode(tr.tokens[len(tr.tokens)-len(tr.mask):])
	if err != nil {
		t.Fatal(err)
	}
	return schema.Sample{
		RolloutID: "7-0", Prompt: tr.prompt, Tokens: slices.Clone(tr.tokens), Response: resp, ResponseLength: len(tr.mask),
		LossMask: slices.Clone(tr.mask), RolloutLogProbs: slices.Clone(tr.lps), Reward: 1, Status: "completed",
		Metadata: map[string]any{"episode": 0},
	}
}

// TestSampleProblems holds samples built from a real simulated engine's
// generations against the ledger's check, then the same samples doctored
// as a broken planact would doctor them.
func TestSampleProblems(t *testing.T) {
	srv := httptest.NewServer(sim.New(sim.Config{Role: sim.RolePlanner, Seed: testSeed}))
	defer srv.Close()

	// Two turns: a generation, an observation, a generation from
	// everything before it.
	tr := newTrajectory("Question: what is the population of France?\n")
	ids, lps := generate(t, srv.URL, tr.tokens, 40)
	tr.generated(ids, lps)
	tr.observed("\nObservation: 68 million\n")
	ids, lps = generate(t, srv.URL, tr.tokens, 40)
	tr.generated(ids, lps)
	good := tr.sample(t)
	if p := chaos.SampleProblems(good, testSeed); len(p) > 0 {
		t.Fatalf("a sample as the engine generated it: %q", p)
	}

	// A generation cut short and resumed (an aborted request asked again
	// with what it had produced) is what the engine generated too.
	tr = newTrajectory("Question: who wrote Hamlet?\n")
	ids, lps = generate(t, srv.URL, tr.tokens, 5)
	tr.generated(ids, lps)
	ids, lps = generate(t, srv.URL, tr.tokens, 40)
	tr.generated(ids, lps)
	if p := chaos.SampleProblems(tr.sample(t), testSeed); len(p) > 0 {
		t.Fatalf("a resumed generation: %q", p)
	}

	second := len(good.LossMask) - 1 // the last generated token
	for second > 0 && good.LossMask[second-1] == 1 {
		second--
	}
	tests := []struct {
		name   string
		doctor func(s *schema.Sample)
		seed   int64
		want   string
	}{
		{"another engine's seed", func(*schema.Sample) {}, testSeed + 1, "never gave it"},
		{"a log-prob changed", func(s *schema.Sample) { s.RolloutLogProbs[3] -= 0.5 }, testSeed, "never gave it"},
		{"a generated token changed", func(s *schema.Sample) {
			s.Tokens[len(s.Tokens)-1]++
			s.Response, _ = sim.Decode(s.Tokens[len(s.Tokens)-s.ResponseLength:])
		}, testSeed, "never gave it"},
		{"the second generation doubled", func(s *schema.Sample) {
			gen := s.Tokens[len(s.Tokens)-s.ResponseLength+second:]
			s.Tokens = append(s.Tokens, gen...)
			s.RolloutLogProbs = append(s.RolloutLogProbs, s.RolloutLogProbs[second:]...)
			s.LossMask = append(s.LossMask, s.LossMask[second:]...)
			s.ResponseLength = len(s.LossMask)
			s.Response, _ = sim.Decode(s.Tokens[len(s.Tokens)-s.ResponseLength:])
		}, testSeed, "never gave it"},
		{"the observation dropped from the tokens", func(s *schema.Sample) {
			base := len(s.Tokens) - s.ResponseLength
			var tokens, mask []int
			var lps []float64
			for k, m := range s.LossMask {
				if m == 1 {
					tokens, mask, lps = append(tokens, s.Tokens[base+k]), append(mask, 1), append(lps, s.RolloutLogProbs[k])
				}
			}
			s.Tokens, s.LossMask, s.RolloutLogProbs, s.ResponseLength = append(s.Tokens[:base:base], tokens...), mask, lps, len(mask)
		}, testSeed, "spell"},
		{"an observation token with a log-prob", func(s *schema.Sample) { s.RolloutLogProbs[second-1] = -0.3 }, testSeed, "observation token"},
		{"a log-prob short", func(s *schema.Sample) { s.RolloutLogProbs = s.RolloutLogProbs[1:] }, testSeed, "log-probs"},
		{"nothing generated", func(s *schema.Sample) {
			for k := range s.LossMask {
				s.LossMask[k], s.RolloutLogProbs[k] = 0, 0
			}
		}, testSeed, "no generated token"},
		{"a token out of the vocabulary", func(s *schema.Sample) { s.Tokens[0] = sim.VocabSize }, testSeed, "decode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			s.Tokens, s.LossMask, s.RolloutLogProbs = slices.Clone(s.Tokens), slices.Clone(s.LossMask), slices.Clone(s.RolloutLogProbs)
			tc.doctor(&s)
			p := chaos.SampleProblems(s, tc.seed)
			if len(p) == 0 || !strings.Contains(strings.Join(p, "; "), tc.want) {
				t.Errorf("problems %q, want one saying %q", p, tc.want)
			}
		})
	}
}

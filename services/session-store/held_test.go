package sessionstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/schema"
)

// randomSamples are samples as assembly builds them: token ids, loss
// masks, log-probs (or none), weight versions and metadata of every kind.
func randomSamples(r *rand.Rand, n, maxTokens int) []schema.Sample {
	out := make([]schema.Sample, n)
	for i := range out {
		toks := make([]int, r.IntN(maxTokens))
		for k := range toks {
			toks[k] = r.IntN(1 << 20)
		}
		s := schema.Sample{GroupIndex: r.IntN(5), Index: r.IntN(9), RolloutID: fmt.Sprintf("7-%d", r.IntN(50)), Prompt: strings.Repeat("p", r.IntN(30)),
			Tokens: toks, Response: "r", ResponseLength: len(toks), LossMask: make([]int, len(toks)), Reward: r.Float64(), Status: schema.EpisodeCompleted,
			Metadata: map[string]any{"rollout": int64(7), "turns": r.IntN(4), "answers": []string{"a", "b"}, "stale": r.IntN(2) == 0}}
		if r.IntN(3) > 0 {
			s.RolloutLogProbs = make([]float64, len(toks))
			s.WeightVersions = []string{"v3"}
		}
		if r.IntN(4) == 0 {
			s.Tokens, s.LossMask = nil, nil // a sample with no tokens at all
		}
		if r.IntN(3) == 0 {
			s.Metadata = map[string]any{"turns": 2} // one key: its encoding is one byte string
		}
		out[i] = s
	}
	return out
}

// TestDeliveredSamplesPassThrough: a delivered group's samples, split as
// assembly reads them back, keep their group_index, index, rollout_id and
// token count, and each one's encoding byte for byte; an array of them,
// mixed with samples built anew, encodes to what a trainer decodes as
// those samples, in that order.
func TestDeliveredSamplesPassThrough(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 3))
	for _, n := range []int{0, 1, 15, 16, 300} {
		samples := randomSamples(r, n, max(2, 12000/max(n, 1)))
		data, err := schema.Marshal(samples)
		if err != nil {
			t.Fatal(err)
		}
		held, err := splitSamples(data)
		if err != nil {
			t.Fatalf("seed %d, %d samples: %v", seed, n, err)
		}
		if len(held) != n {
			t.Fatalf("seed %d: %d samples split into %d", seed, n, len(held))
		}
		same := 0
		var want []schema.Sample
		if err := schema.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			want = nil // no samples encode as none, as schema.Marshal encodes a result's nil samples
		}
		for i, h := range held {
			s := samples[i]
			if h.sample.GroupIndex != s.GroupIndex || h.sample.Index != s.Index || h.sample.RolloutID != s.RolloutID || h.tokens != len(s.Tokens) {
				t.Fatalf("seed %d, sample %d of %d: read group %d, index %d, rollout_id %q, %d tokens; want %d, %d, %q, %d",
					seed, i, n, h.sample.GroupIndex, h.sample.Index, h.sample.RolloutID, h.tokens, s.GroupIndex, s.Index, s.RolloutID, len(s.Tokens))
			}
			one, err := schema.Marshal(&s)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Metadata) <= 1 && !bytes.Equal(h.raw, one) { // maps of more keys encode in any order
				t.Fatalf("seed %d, sample %d: its encoding changed", seed, i)
			}
			if len(s.Metadata) <= 1 {
				same++
			}
		}
		if n > 100 && same == 0 {
			t.Fatalf("seed %d: no sample's encoding compared byte for byte", seed)
		}
		if all, err := encodeSamples(held); err != nil || n > 0 && !bytes.Equal(all, data) {
			t.Fatalf("seed %d, %d samples: encoded again as delivered, they are not the bytes delivered (%v)", seed, n, err)
		}
		// Every other sample built anew (decoded, as assembly builds
		// them), the rest as delivered.
		mixed := make([]heldSample, len(held))
		for i := range held {
			mixed[i] = held[i]
			if i%2 == 1 {
				mixed[i] = built(want[i])
			}
		}
		out, err := encodeSamples(mixed)
		if err != nil {
			t.Fatal(err)
		}
		var got []schema.Sample
		if err := schema.Unmarshal(out, &got); err != nil {
			t.Fatalf("seed %d, %d samples: the array encoded does not decode: %v", seed, n, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d, %d samples: decoded from the array encoded, they differ from those delivered", seed, n)
		}
		decoded, err := samplesOf(mixed)
		if err != nil || !reflect.DeepEqual(decoded, want) {
			t.Fatalf("seed %d, %d samples: decoded one by one: %v, or they differ", seed, n, err)
		}
	}
}

// TestManyDeliveredSamples: more samples than a 16-bit array length holds
// pass through as they were delivered, under the header msgpack writes.
func TestManyDeliveredSamples(t *testing.T) {
	const n = 70000
	header, err := msgpack.Marshal(make([]bool, n))
	if err != nil {
		t.Fatal(err)
	}
	header = header[:5] // array32
	one, err := schema.Marshal(&schema.Sample{GroupIndex: 3, Index: 1, RolloutID: "1-25", Tokens: []int{7, 8}})
	if err != nil {
		t.Fatal(err)
	}
	data := append(bytes.Clone(header), bytes.Repeat(one, n)...)
	held, err := splitSamples(data)
	if err != nil || len(held) != n || held[n-1].sample.RolloutID != "1-25" || held[n-1].tokens != 2 || !bytes.Equal(held[n-1].raw, one) {
		t.Fatalf("split: %v, %d samples", err, len(held))
	}
	if all, err := encodeSamples(held); err != nil || !bytes.Equal(all, data) {
		t.Fatalf("encoded again as delivered, they are not the bytes delivered (%v)", err)
	}
}

// TestDeliveredSamplesThatDoNotReadSaySo: samples that are not an array
// of samples are refused, naming where.
func TestDeliveredSamplesThatDoNotReadSaySo(t *testing.T) {
	good, err := schema.Marshal(randomSamples(rand.New(rand.NewPCG(1, 1)), 3, 40))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"not an array":   {[]byte{0x81, 0xa1, 'a', 0x01}, "samples:"},
		"cut short":      {good[:len(good)-3], "samples[2]"},
		"trailing bytes": {append(bytes.Clone(good), 0x01), "after the array"},
		"a nil sample":   {[]byte{0x91, 0xc0}, "samples[0]: a sample is nil"},
	} {
		if _, err := splitSamples(tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", name, err, tc.want)
		}
	}
}

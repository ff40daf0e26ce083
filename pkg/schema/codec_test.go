package schema

import (
	"bytes"
	"math"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestFastSlicesWriteWhatTheLibraryWrites: the fast paths for []int and
// []float64 write the very bytes msgpack.Encoder writes element by element,
// and read back every value, at every integer width and sign.
func TestFastSlicesWriteWhatTheLibraryWrites(t *testing.T) {
	ints := []int{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	for n := range 20 { // array headers: fixarray, array16
		ints = append(ints, n*1000)
	}
	floats := []float64{0, -0.5, 1e-300, math.MaxFloat64, -3.25}
	for _, v := range []any{ints, floats, []int{}, []float64{}, ints[:3]} {
		var want bytes.Buffer
		enc := msgpack.NewEncoder(&want)
		switch s := v.(type) {
		case []int:
			enc.EncodeArrayLen(len(s))
			for _, x := range s {
				enc.EncodeInt(int64(x))
			}
		case []float64:
			enc.EncodeArrayLen(len(s))
			for _, x := range s {
				enc.EncodeFloat64(x)
			}
		}
		got, err := Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%T of %d: wrote % x, the library writes % x", v, 0, got, want.Bytes())
		}
		switch s := v.(type) {
		case []int:
			var back []int
			if err := Unmarshal(got, &back); err != nil || len(back) != len(s) {
				t.Fatalf("decode: %v %v", back, err)
			}
			for i := range s {
				if back[i] != s[i] {
					t.Errorf("ints[%d]: %d, want %d", i, back[i], s[i])
				}
			}
		case []float64:
			var back []float64
			if err := Unmarshal(got, &back); err != nil || len(back) != len(s) {
				t.Fatalf("decode: %v %v", back, err)
			}
			for i := range s {
				if back[i] != s[i] {
					t.Errorf("floats[%d]: %v, want %v", i, back[i], s[i])
				}
			}
		}
	}
	// nil stays nil; a length the body cannot back fails without allocating it.
	var back []int
	if data, _ := Marshal([]int(nil)); Unmarshal(data, &back) != nil || back != nil {
		t.Errorf("nil slice decoded as %v", back)
	}
	if err := Unmarshal([]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2}, &back); err == nil {
		t.Error("an array of 4 billion ints backed by 2 bytes decodes")
	}
}

// TestUnmarshalPart: a reader of a few fields gets them, and the schema is
// checked as Unmarshal checks it.
func TestUnmarshalPart(t *testing.T) {
	body, err := Marshal(&PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: "<answer>x</answer>",
		Segments: []Segment{{Kind: SegPrompt, IDs: []int{1, 2, 3}}}})
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Envelope
		Rollout int64  `json:"rollout"`
		Turn    int    `json:"turn"`
		Text    string `json:"text"`
	}
	if err := UnmarshalPart(body, &PlanOutput{}, &head); err != nil || head.Rollout != 7 || head.Turn != 3 || head.Text != "<answer>x</answer>" {
		t.Fatalf("head %+v, %v", head, err)
	}
	if err := UnmarshalPart(body, &PlanDAG{}, &head); err == nil || !bytes.Contains([]byte(err.Error()), []byte("plan.out/1")) {
		t.Errorf("a plan.out body read as a plan.dag: %v", err)
	}
}

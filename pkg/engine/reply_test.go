package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// longReply is a /generate reply the way SGLang writes it, n tokens long.
func longReply(r *rand.Rand, n int) string {
	var ids, lps []string
	for i := range n {
		id := r.IntN(150000)
		ids = append(ids, fmt.Sprint(id))
		text := []string{`"tok"`, `" the"`, `"\n"`, `"\"]"`, `null`, `"é"`}[i%6]
		lps = append(lps, fmt.Sprintf("[%v,%d,%s]", -r.Float64()*5, id, text))
	}
	return `{"text":"Plan:\n1. look \"here\" \u00e9","output_ids":[` + strings.Join(ids, ",") + `],` +
		`"meta_info":{"id":"abc","finish_reason":{"type":"stop","matched":151645},"prompt_tokens":412,` +
		`"weight_version":"v3","completion_tokens":` + fmt.Sprint(n) + `,"cached_tokens":0,"e2e_latency":1.25,` +
		`"output_token_logprobs":[` + strings.Join(lps, ",") + `]}}`
}

// replyCases are replies of every shape: usual, unusual (left to
// encoding/json), and broken.
func replyCases() []string {
	r := rand.New(rand.NewPCG(7, 8))
	cases := []string{
		longReply(r, 0), longReply(r, 1), longReply(r, 300),
		`{}`, `null`, ``, ` `, `[]`, `"x"`, `{"text":null,"output_ids":null,"meta_info":null,"error":null}`,
		`{"meta_info":{"finish_reason":null,"completion_tokens":null,"prompt_tokens":null,"weight_version":null,"output_token_logprobs":null}}`,
		`{"meta_info":{"weight_version":7,"finish_reason":{"type":"length","length":16,"message":null}}}`,
		`{"meta_info":{"weight_version":{"a":[1,2,{"b":null}]}}}`,
		`{"error":{"message":"boom","code":500}}`, `{"error":"boom"}`,
		`{"text":"a\u0000b\ud83d\ude00 \/ \b\f\r\t"}`, "{\"text\":\"caf\xe9\"}", "{\"text\":\"\xff\xfe\"}",
		`{"text":"a","text":"b","output_ids":[1],"output_ids":[2,3]}`,
		`{"meta_info":{"finish_reason":{"type":"stop"},"finish_reason":{"message":"m"}}}`,
		`{"meta_info":{"finish_reason":{"type":"stop"},"finish_reason":{"type":null}}}`,
		`{"Text":"case","OUTPUT_IDS":[1]}`, `{"meta_info":{"Prompt_Tokens":3}}`, "{\"te\\u0078t\":\"escaped key\"}",
		"{\"\u212aey\":1}", // a Kelvin sign: no known key folds to it
		`{"text":5}`, `{"output_ids":["a"]}`, `{"output_ids":[1.5]}`, `{"output_ids":[1e3]}`, `{"output_ids":[-0,-7]}`,
		`{"output_ids":[99999999999999999999]}`, `{"output_ids":[9223372036854775807,-9223372036854775808]}`,
		`{"meta_info":{"prompt_tokens":1.5}}`, `{"meta_info":{"completion_tokens":"3"}}`, `{"meta_info":{"finish_reason":"stop"}}`,
		`{"meta_info":{"output_token_logprobs":[[null,1,null],[-0.5,2,"x"]]}}`,
		`{"meta_info":{"output_token_logprobs":[[-0.5,2,{"t":1}]]}}`, `{"meta_info":{"output_token_logprobs":[[-0.5,"x","a"]]}}`,
		`{"meta_info":{"output_token_logprobs":{"a":1}}}`,
		`{"x":[1,{"y":[true,false,null,-1.5e-3,"s"]}],"text":"after"}`, `{"x":tru}`, `{"x":01}`, `{"x":1.}`, `{"x":-}`, `{"x":1e}`,
		`{"text":"a"} trailing`, `{"text":"a"}{"text":"b"}`, `{"text":"a"`, `{"text":"a",}`, `{"text" "a"}`, `{text:"a"}`,
		`{"text":"a\x"}`, `{"text":"a\u12"}`, "{\"text\":\"a\nb\"}", `{"output_ids":[1,]}`, `{"output_ids":[1 2]}`,
		`{"meta_info":{"output_token_logprobs":[[-0.5,2,"x"],]}}`,
		// A null token id is an error, never token 0.
		`{"output_ids":[5,null,7]}`, `{"output_ids":[null]}`, `{"output_ids":[ 5 , null ]}`, `{"output_ids":[5],"output_ids":[null]}`,
		`{"text":"null","output_ids":[5]}`, `{"meta_info":{"output_token_logprobs":[[-0.2,5,"a"],[-0.2,null,"b"]]}}`,
		`{"meta_info":{"output_token_logprobs":[[null,null,null]]}}`, `{"tokens":[1,null,3]}`, `{"tokens":[null]}`,
		strings.Repeat(`{"x":`, 2000) + `1` + strings.Repeat(`}`, 2000),
		" \n\t{ \"text\" : \"ws\" , \"output_ids\" : [ 1 , 2 ] , \"meta_info\" : { \"completion_tokens\" : 2 } } \n",
	}
	return cases
}

// The reader gives what encoding/json's Decoder gives, value and error,
// except that a null token id is an error on both sides (not 0).
func TestDecodeGenerateAsEncodingJSON(t *testing.T) {
	for _, c := range replyCases() {
		checkGenerate(t, []byte(c))
	}
}

func checkGenerate(t *testing.T, b []byte) {
	t.Helper()
	var want sglReply
	wantErr := json.NewDecoder(bytes.NewReader(b)).Decode(&want)
	var got sglReply
	gotErr := decodeGenerate(b, &got)
	if (gotErr == nil) != (wantErr == nil) || (wantErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("%.300q: error %v, encoding/json: %v", b, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%.300q:\n got %+v\nwant %+v", b, got, want)
	}
	var wantTok struct {
		Tokens *tokenizeIDs `json:"tokens"`
	}
	wantErr = json.NewDecoder(bytes.NewReader(b)).Decode(&wantTok)
	gotTok, gotErr := decodeTokens(b)
	if (gotErr == nil) != (wantErr == nil) || (wantErr == nil && !reflect.DeepEqual(gotTok, (*[]int)(wantTok.Tokens))) {
		t.Fatalf("%.300q as /tokenize: %v, %v; encoding/json: %v, %v", b, gotTok, gotErr, wantTok.Tokens, wantErr)
	}
	checkNoNullID(t, b, got, gotTok, decodeGenerate(b, new(sglReply)) == nil, gotErr == nil)
}

// checkNoNullID: what decoded without an error held no null token id, as
// encoding/json alone reads it (ids as pointers, nil for null): a null is
// never read as 0.
func checkNoNullID(t *testing.T, b []byte, got sglReply, tokens *[]int, generateOK, tokensOK bool) {
	t.Helper()
	var ptrs struct {
		OutputIDs []*int `json:"output_ids"`
		MetaInfo  *struct {
			OutputTokenLogprobs [][]*json.RawMessage `json:"output_token_logprobs"`
		} `json:"meta_info"`
		Tokens []*int `json:"tokens"`
	}
	if json.NewDecoder(bytes.NewReader(b)).Decode(&ptrs) != nil {
		return
	}
	nullLogprobID := false
	if ptrs.MetaInfo != nil {
		for _, triple := range ptrs.MetaInfo.OutputTokenLogprobs {
			nullLogprobID = nullLogprobID || len(triple) > 1 && triple[1] == nil
		}
	}
	if generateOK && (slices.Contains(ptrs.OutputIDs, nil) || nullLogprobID) {
		t.Fatalf("%.300q: a null token id was read as %v, %v", b, got.OutputIDs, got.MetaInfo.OutputTokenLogprobs.ids)
	}
	if tokensOK && slices.Contains(ptrs.Tokens, nil) {
		t.Fatalf("%.300q as /tokenize: a null token id was read as %v", b, *tokens)
	}
}

func TestDecodeTokensAsEncodingJSON(t *testing.T) {
	for _, c := range []string{`{"tokens":[1,2,3],"count":3,"max_model_len":32768}`, `{"tokens":[]}`, `{"tokens":null}`, `{"count":0}`,
		`{"Tokens":[1]}`, `{"tokens":[1,"a"]}`, `{"tokens":[1],"tokens":[2]}`, `{"tokens":[1]`, `{"tokens":{}}`} {
		checkGenerate(t, []byte(c))
	}
}

// The usual reply is read by the reader itself, not handed to encoding/json.
func TestDecodeGenerateUsualShapeIsFast(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	var out sglReply
	if !readGenerate([]byte(longReply(r, 50)), &out) || len(out.MetaInfo.OutputTokenLogprobs.ids) != 50 {
		t.Fatal("the reader did not read SGLang's usual reply")
	}
	if _, ok := readTokens([]byte(`{"tokens":[1,2,3],"count":3}`)); !ok {
		t.Fatal("the reader did not read /tokenize's usual reply")
	}
}

func FuzzDecodeGenerate(f *testing.F) {
	for _, c := range replyCases() {
		if len(c) < 4096 {
			f.Add([]byte(c))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkGenerate(t, b) })
}

func BenchmarkDecodeGenerate(b *testing.B) {
	reply := []byte(longReply(rand.New(rand.NewPCG(3, 4)), 300))
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(reply)))
		for b.Loop() {
			var out sglReply
			if err := json.NewDecoder(bytes.NewReader(reply)).Decode(&out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reader", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(reply)))
		for b.Loop() {
			var out sglReply
			if err := decodeGenerate(reply, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

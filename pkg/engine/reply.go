package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The engines' replies carry large arrays of token ids and log-probs
// (thousands for a planner turn). encoding/json reads them three times (the
// decoder's scan for the value's end, the unmarshal's scan, and reflection
// per element); the readers below read /generate's and /tokenize's replies
// in one pass, with no reflection. They check the JSON as they read it,
// skipping what they do not need, and answer ok false for anything but the
// usual shapes — a field of another type, a key in other case, invalid
// JSON — which the caller then decodes with encoding/json's Decoder: the
// same result, and the same errors, as before. Like the Decoder, they read
// the first value and leave what follows it.

// decodeGenerate reads a /generate reply (sglReply) from b.
func decodeGenerate(b []byte, out *sglReply) error {
	var r sglReply
	if readGenerate(b, &r) {
		*out = r
		return nil
	}
	return json.NewDecoder(bytes.NewReader(b)).Decode(out)
}

// decodeTokens reads a /tokenize reply's "tokens" from b: nil when absent
// or null.
func decodeTokens(b []byte) (*[]int, error) {
	if toks, ok := readTokens(b); ok {
		return toks, nil
	}
	var out struct {
		Tokens *tokenizeIDs `json:"tokens"`
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&out); err != nil {
		return nil, err
	}
	return (*[]int)(out.Tokens), nil
}

// Arrays of token ids, as the replies name them. encoding/json would read
// a null among them as 0, a token the engine never named: these refuse it,
// saying where it is. The readers below leave such an array to them.
type (
	outputIDs      []int // SGLang's output_ids
	tokenIDs       []int // OpenAI-compatible choices[].token_ids
	promptTokenIDs []int // OpenAI-compatible prompt_token_ids
	tokenizeIDs    []int // /tokenize's tokens
)

func (l *outputIDs) UnmarshalJSON(b []byte) error { return unmarshalIDs(b, (*[]int)(l), "output_ids") }

func (l *tokenIDs) UnmarshalJSON(b []byte) error { return unmarshalIDs(b, (*[]int)(l), "token_ids") }

func (l *promptTokenIDs) UnmarshalJSON(b []byte) error {
	return unmarshalIDs(b, (*[]int)(l), "prompt_token_ids")
}

func (l *tokenizeIDs) UnmarshalJSON(b []byte) error { return unmarshalIDs(b, (*[]int)(l), "tokens") }

// unmarshalIDs reads the array of token ids named field into ids (nil for
// null, as encoding/json leaves a slice), refusing a null id.
func unmarshalIDs(b []byte, ids *[]int, field string) error {
	var v []int
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	// In an array that encoding/json read as integers, null can only be an
	// element.
	if v != nil && bytes.Contains(b, []byte("null")) {
		var elems []json.RawMessage
		if err := json.Unmarshal(b, &elems); err != nil {
			return err
		}
		for i, e := range elems {
			if string(e) == "null" {
				return fmt.Errorf("%s[%d] is null: the engine did not say which token it is", field, i)
			}
		}
	}
	*ids = v
	return nil
}

func readGenerate(b []byte, r *sglReply) bool {
	p := &reader{b: b}
	ok := p.object(func(key string) bool {
		switch key {
		case "text":
			return p.setString(&r.Text)
		case "output_ids":
			ids, ok := p.ints()
			r.OutputIDs = ids
			return ok
		case "meta_info":
			return p.metaInfo(r)
		case "error":
			raw, ok := p.raw()
			r.Error = raw
			return ok
		}
		return p.unknown(key, "text", "output_ids", "meta_info", "error")
	})
	return ok
}

func (p *reader) metaInfo(r *sglReply) bool {
	if p.null() {
		return true
	}
	m := &r.MetaInfo
	return p.object(func(key string) bool {
		switch key {
		case "finish_reason":
			if p.null() {
				m.FinishReason = nil
				return true
			}
			if m.FinishReason == nil {
				m.FinishReason = &sglFinish{}
			}
			fr := m.FinishReason
			return p.object(func(key string) bool {
				switch key {
				case "type":
					return p.setString(&fr.Type)
				case "message":
					return p.setString(&fr.Message)
				case "status_code":
					if p.null() {
						fr.StatusCode = nil
						return true
					}
					n, ok := p.int()
					fr.StatusCode = &n
					return ok
				}
				return p.unknown(key, "type", "message", "status_code")
			})
		case "prompt_tokens":
			if p.null() {
				return true
			}
			n, ok := p.int()
			m.PromptTokens = n
			return ok
		case "completion_tokens":
			if p.null() {
				m.CompletionTokens = nil
				return true
			}
			n, ok := p.int()
			m.CompletionTokens = &n
			return ok
		case "weight_version":
			raw, ok := p.raw()
			m.WeightVersion = raw
			return ok
		case "output_token_logprobs":
			start := p.i
			if !p.skipValue() {
				return false
			}
			var l logprobList
			if l.UnmarshalJSON(p.b[start:p.i]) != nil {
				return false
			}
			m.OutputTokenLogprobs = l
			return true
		}
		return p.unknown(key, "finish_reason", "prompt_tokens", "completion_tokens", "weight_version", "output_token_logprobs")
	})
}

func readTokens(b []byte) (*[]int, bool) {
	p := &reader{b: b}
	var toks *[]int
	ok := p.object(func(key string) bool {
		if key == "tokens" {
			if p.null() {
				toks = nil
				return true
			}
			ids, ok := p.ints()
			toks = &ids
			return ok
		}
		return p.unknown(key, "tokens")
	})
	return toks, ok
}

// reader reads JSON from b, strictly: what it accepts encoding/json
// accepts.
type reader struct {
	b []byte
	i int
}

func (p *reader) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *reader) peek() byte {
	p.ws()
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *reader) eat(c byte) bool {
	if p.peek() != c {
		return false
	}
	p.i++
	return true
}

// unknown skips the value of a key the reader does not need; a key that
// encoding/json would take for a known one (its case-insensitive match) is
// left to encoding/json.
func (p *reader) unknown(key string, known ...string) bool {
	for _, k := range known {
		if strings.EqualFold(key, k) {
			return false
		}
	}
	return p.skipValue()
}

// object reads an object, calling field with each key, the reader at its
// value, which field must read.
func (p *reader) object(field func(key string) bool) bool {
	if !p.eat('{') {
		return false
	}
	if p.eat('}') {
		return true
	}
	for {
		if p.peek() != '"' {
			return false
		}
		key, ok := p.str()
		if !ok || !p.eat(':') || !field(key) {
			return false
		}
		if p.eat('}') {
			return true
		}
		if !p.eat(',') {
			return false
		}
	}
}

func (p *reader) null() bool {
	if p.peek() == 'n' && bytes.HasPrefix(p.b[p.i:], []byte("null")) {
		p.i += 4
		return true
	}
	return false
}

// setString reads a string into *s; null leaves *s as it is, as
// encoding/json does.
func (p *reader) setString(s *string) bool {
	if p.null() {
		return true
	}
	if p.peek() != '"' {
		return false
	}
	v, ok := p.str()
	*s = v
	return ok
}

// str reads the string at p.i (its opening quote).
func (p *reader) str() (string, bool) {
	start := p.i
	plain, ok := p.skipStr()
	if !ok {
		return "", false
	}
	if plain {
		return string(p.b[start+1 : p.i-1]), true
	}
	// Escapes, or bytes that are not UTF-8: encoding/json's reading.
	var s string
	if json.Unmarshal(p.b[start:p.i], &s) != nil {
		return "", false
	}
	return s, true
}

// skipStr reads past the string at p.i (its opening quote), checking it;
// plain is true when it holds neither escapes nor bytes that are not UTF-8.
func (p *reader) skipStr() (plain, ok bool) {
	p.i++
	plain = true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return plain, true
		case c == '\\':
			plain = false
			if p.i+1 >= len(p.b) {
				return false, false
			}
			switch p.b[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if p.i+6 > len(p.b) {
					return false, false
				}
				for _, h := range p.b[p.i+2 : p.i+6] {
					if !isHex(h) {
						return false, false
					}
				}
				p.i += 6
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(p.b[p.i:])
			if r == utf8.RuneError && size == 1 {
				plain = false
			}
			p.i += size
		default:
			p.i++
		}
	}
	return false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number reads a JSON number and returns its text.
func (p *reader) number() ([]byte, bool) {
	p.ws()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.i < len(p.b) && p.b[p.i] >= '1' && p.b[p.i] <= '9':
		p.digits()
	default:
		return nil, false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if !p.digits() {
			return nil, false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if !p.digits() {
			return nil, false
		}
	}
	return p.b[start:p.i], true
}

func (p *reader) digits() bool {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}

// int reads an integer that fits an int (a fraction or an exponent is left
// to encoding/json, which refuses it).
func (p *reader) int() (int, bool) {
	num, ok := p.number()
	if !ok {
		return 0, false
	}
	neg := num[0] == '-'
	digits := num
	if neg {
		digits = num[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false // not an integer, or long enough to overflow: encoding/json decides
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// ints reads an array of integers (nil for null, as encoding/json leaves a
// slice); a null among them is left to encoding/json (unmarshalIDs).
func (p *reader) ints() ([]int, bool) {
	if p.null() {
		return nil, true
	}
	if !p.eat('[') {
		return nil, false
	}
	// A comma per element after the first: room for all of them at once.
	n := 0
	if end := bytes.IndexByte(p.b[p.i:], ']'); end >= 0 {
		n = bytes.Count(p.b[p.i:p.i+end], []byte{','}) + 1
	}
	out := make([]int, 0, n)
	if p.eat(']') {
		return out, true
	}
	for {
		v, ok := p.int()
		if !ok {
			return nil, false
		}
		out = append(out, v)
		if p.eat(']') {
			return out, true
		}
		if !p.eat(',') {
			return nil, false
		}
	}
}

// raw reads any value and returns a copy of its text (json.RawMessage).
func (p *reader) raw() (json.RawMessage, bool) {
	p.ws()
	start := p.i
	if !p.skipValue() {
		return nil, false
	}
	return bytes.Clone(p.b[start:p.i]), true
}

// skipValue reads past any value, checking it.
func (p *reader) skipValue() bool {
	return p.skipDepth(0)
}

// maxDepth bounds the nesting of skipped values (encoding/json allows
// 10000).
const maxDepth = 1000

func (p *reader) skipDepth(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := p.peek(); {
	case c == '{':
		return p.object(func(string) bool { return p.skipDepth(depth + 1) })
	case c == '[':
		p.i++
		if p.eat(']') {
			return true
		}
		for {
			if !p.skipDepth(depth + 1) {
				return false
			}
			if p.eat(']') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == '"':
		_, ok := p.skipStr()
		return ok
	case c == 'n':
		return p.null()
	case c == 't':
		return p.word("true")
	case c == 'f':
		return p.word("false")
	case c == '-' || c >= '0' && c <= '9':
		_, ok := p.number()
		return ok
	}
	return false
}

func (p *reader) word(w string) bool {
	if bytes.HasPrefix(p.b[p.i:], []byte(w)) {
		p.i += len(w)
		return true
	}
	return false
}

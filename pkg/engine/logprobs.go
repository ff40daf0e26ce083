package engine

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/planact/planact/pkg/fail"
)

// logprobList is SGLang's meta_info.output_token_logprobs: one
// [logprob, token_id, token_text] per generated token (the logprob may be
// null, the text null or a string). A planner turn has thousands of them,
// so they are read in one pass rather than as a JSON value each: the
// common shape by hand, anything else through encoding/json.
type logprobList struct {
	logprobs []float64
	ids      []int
	// missing counts the tokens whose log-prob is null: their place in
	// logprobs holds 0, which is no log-prob and must never be used as one.
	missing int
}

func (l *logprobList) append(o logprobList) {
	l.logprobs = append(l.logprobs, o.logprobs...)
	l.ids = append(l.ids, o.ids...)
	l.missing += o.missing
}

// UnmarshalJSON reads the list.
func (l *logprobList) UnmarshalJSON(b []byte) error {
	if lps, ids, missing, ok := scanLogprobs(b); ok {
		l.logprobs, l.ids, l.missing = lps, ids, missing
		return nil
	}
	var triples []json.RawMessage
	if err := json.Unmarshal(b, &triples); err != nil {
		return err
	}
	if triples == nil {
		*l = logprobList{}
		return nil
	}
	l.logprobs, l.ids, l.missing = make([]float64, len(triples)), make([]int, len(triples)), 0
	for i, raw := range triples {
		var triple []json.RawMessage
		if err := json.Unmarshal(raw, &triple); err != nil || len(triple) < 2 {
			return fail.Transientf("output_token_logprobs[%d] = %s: not [logprob, id, text]", i, raw)
		}
		// A log-prob that is null (or not a number) is missing: counted,
		// never taken for 0.
		if json.Unmarshal(triple[0], &l.logprobs[i]) != nil || string(bytes.TrimSpace(triple[0])) == "null" {
			l.logprobs[i] = 0
			l.missing++
		}
		if string(bytes.TrimSpace(triple[1])) == "null" {
			return fail.Transientf("output_token_logprobs[%d] = %s: its token id is null: the engine did not say which token it is", i, raw)
		}
		if err := json.Unmarshal(triple[1], &l.ids[i]); err != nil {
			return fail.Transientf("output_token_logprobs[%d] = %s: bad token id", i, raw)
		}
	}
	return nil
}

// scanLogprobs reads [[lp, id, …], …] where lp is a number or null and id
// an integer; missing counts the nulls (0 in lps). ok is false for any
// other shape (the caller falls back). encoding/json has checked that b is
// valid JSON.
func scanLogprobs(b []byte) (lps []float64, ids []int, missing int, ok bool) {
	p := &scanner{b: b}
	if p.skip(); p.peek() == 'n' {
		return nil, nil, 0, p.word("null")
	}
	if !p.eat('[') {
		return nil, nil, 0, false
	}
	n := bytes.Count(b, []byte{'['}) // an upper bound on the entries
	lps, ids = make([]float64, 0, n), make([]int, 0, n)
	if p.eat(']') {
		return lps, ids, 0, true
	}
	for {
		if !p.eat('[') {
			return nil, nil, 0, false
		}
		lp := 0.0
		if p.peek() == 'n' {
			if !p.word("null") {
				return nil, nil, 0, false
			}
			missing++ // no log-prob: a place holder, never a value
		} else {
			v, err := strconv.ParseFloat(string(p.number()), 64)
			if err != nil {
				return nil, nil, 0, false
			}
			lp = v
		}
		if !p.eat(',') {
			return nil, nil, 0, false
		}
		id, err := strconv.Atoi(string(p.number()))
		if err != nil {
			return nil, nil, 0, false
		}
		// The rest of the entry (the token's text) is not needed.
		if !p.closeArray() {
			return nil, nil, 0, false
		}
		lps, ids = append(lps, lp), append(ids, id)
		if p.eat(']') {
			return lps, ids, missing, true
		}
		if !p.eat(',') {
			return nil, nil, 0, false
		}
	}
}

type scanner struct {
	b []byte
	i int
}

func (p *scanner) skip() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\n' || p.b[p.i] == '\t' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *scanner) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

// eat consumes c (after white space) if it comes next.
func (p *scanner) eat(c byte) bool {
	p.skip()
	if p.peek() != c {
		return false
	}
	p.i++
	p.skip()
	return true
}

func (p *scanner) word(w string) bool {
	if !bytes.HasPrefix(p.b[p.i:], []byte(w)) {
		return false
	}
	p.i += len(w)
	p.skip()
	return true
}

// number returns the JSON number that comes next (its bytes: converted
// where they are read, a string that does not escape, so that no number
// costs an allocation).
func (p *scanner) number() []byte {
	p.skip()
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			p.i++
			continue
		}
		break
	}
	s := p.b[start:p.i]
	p.skip()
	return s
}

// closeArray skips to the end of the array being read (its remaining
// values: strings, numbers, null) and past its ']'.
func (p *scanner) closeArray() bool {
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case ']':
			p.i++
			p.skip()
			return true
		case '"':
			p.i++
			for p.i < len(p.b) && p.b[p.i] != '"' {
				if p.b[p.i] == '\\' {
					p.i++
				}
				p.i++
			}
			p.i++
		case '[', '{':
			return false // nested values: not the usual shape
		default:
			p.i++
		}
	}
	return false
}

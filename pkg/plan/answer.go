package plan

import (
	"strings"
	"unicode"
)

// The rules for what is an answer are in the package documentation; here
// they are applied, except the one about the plan's own text, which needs
// the plan (parseDoc applies it).

// answerElem is an answer element that may end the episode.
type answerElem struct {
	start, end int      // the element, tags included
	answers    []string // split on "|", trimmed, empty ones dropped
}

// answerScan is what findAnswers saw.
type answerScan struct {
	elems []answerElem // answers with text, in order
	empty int          // offset of the last closed <answer> without text, or -1
	open  int          // offset of the last <answer> never closed, or -1
}

// templateAnswers are answers that only repeat how the prompt says to
// answer ("reply with <answer>your answer</answer>").
var templateAnswers = map[string]bool{
	"your answer": true, "your final answer": true, "your answer here": true,
	"answer here": true, "final answer here": true,
}

// mentionWords follow an <answer> that a sentence talks about.
var mentionWords = map[string]bool{
	"tag": true, "tags": true, "element": true, "elements": true, "block": true, "blocks": true, "format": true,
}

// findAnswers lists the answer elements of d, by the rules above except
// the one about the plan's own text, which needs the plan (see parseDoc).
func (d *doc) findAnswers(o *Options) answerScan {
	s := d.lower
	sc := answerScan{empty: -1, open: -1}
	blocks := []string{"graph", "plan", "node"}
	blockEnd := map[string]*finder{}
	for _, name := range blocks {
		blockEnd[name] = d.finder("</" + name + ">")
	}
	open := -1
	for i := 0; i < len(s); {
		k := strings.IndexAny(s[i:], "<`")
		if k < 0 {
			d.m.add(len(s) - i)
			break
		}
		d.m.add(k + 1)
		i += k
		if s[i] == '`' {
			run := backticks(s, i)
			d.m.add(run)
			if run >= 3 {
				// A fenced block runs to the next fence, or to the end.
				c := d.index("```", i+run)
				if c < 0 {
					i = len(s)
					break
				}
				open = -1
				i = c + 3 + backticks(s, c+3)
				continue
			}
			// A code span closes at the next run of as many backticks on
			// its line; a run of another length may open one of its own.
			// A backtick that closes nothing is text ("he is 6` tall"),
			// and so is what follows it.
			e := strings.IndexAny(s[i+run:], "`\n")
			if e < 0 {
				d.m.add(len(s) - i - run)
				i += run
				continue
			}
			d.m.add(e)
			e += i + run
			switch {
			case s[e] == '\n':
				i += run
			case backticks(s, e) == run:
				i = e + run
			default:
				i = e
			}
			continue
		}
		switch {
		case strings.HasPrefix(s[i:], "<answer>"):
			open = i
			i += len("<answer>")
			continue
		case strings.HasPrefix(s[i:], "</answer>"):
			end := i + len("</answer>")
			if open >= 0 {
				d.addAnswer(&sc, open, i, end)
			}
			open = -1
			i = end
			continue
		}
		name := ""
		for _, n := range blocks {
			if isTagAt(s, i, n) {
				name = n
			}
		}
		if name == "" {
			i++
			continue
		}
		if c := blockEnd[name].next(i); c >= 0 {
			open = -1
			i = c + len(name) + 3
			continue
		}
		i += 1 + len(name)
	}
	if open >= 0 {
		sc.open = open
		if o.stripsAnswerClose() {
			d.addStripped(&sc, open)
		}
	}
	return sc
}

// addAnswer considers the element from open to end whose closing tag is at
// close.
func (d *doc) addAnswer(sc *answerScan, open, close, end int) {
	if quoted(d.text, open, end) {
		return
	}
	body := d.text[open+len("<answer>") : close]
	d.m.add(2 * len(body))
	if templateAnswers[strings.ToLower(strings.Join(strings.Fields(body), " "))] {
		return
	}
	a := splitAnswers(body)
	if a == nil {
		sc.empty = open
		return
	}
	sc.elems = append(sc.elems, answerElem{start: open, end: end, answers: a})
}

// addStripped considers the <answer> at open, never closed, as an answer
// whose "</answer>" the engine stripped: only if it ends the output, holds
// no other tag and is not the subject of a sentence.
func (d *doc) addStripped(sc *answerScan, open int) {
	body := d.text[open+len("<answer>"):]
	d.m.add(2 * len(body))
	for i := strings.IndexByte(body, '<'); i >= 0; {
		if i+1 < len(body) && (body[i+1] == '/' || isIdentStart(body[i+1])) {
			return
		}
		j := strings.IndexByte(body[i+1:], '<')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	if f := strings.Fields(body); len(f) > 0 && mentionWords[strings.ToLower(strings.Trim(f[0], ".,;:!?"))] {
		return
	}
	if a := splitAnswers(body); a != nil {
		sc.elems = append(sc.elems, answerElem{start: open, end: len(d.text), answers: a})
	}
}

// splitAnswers splits an answer on "|"; nil if no part has a letter or a
// digit ("", "…").
func splitAnswers(body string) []string {
	var out []string
	text := false
	for _, a := range strings.Split(body, "|") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
			text = text || strings.IndexFunc(a, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) >= 0
		}
	}
	if !text {
		return nil
	}
	return out
}

// quoted reports whether the element s[start:end] is written between
// quotes: "<answer>…</answer>" is spoken of, not given.
func quoted(s string, start, end int) bool {
	if start == 0 || end >= len(s) {
		return false
	}
	if q := s[start-1]; (q == '"' || q == '\'') && s[end] == q {
		return true
	}
	for _, p := range [][2]string{{"“", "”"}, {"‘", "’"}, {"«", "»"}} {
		if strings.HasSuffix(s[:start], p[0]) && strings.HasPrefix(s[end:], p[1]) {
			return true
		}
	}
	return false
}

func backticks(s string, i int) int {
	n := 0
	for i+n < len(s) && s[i+n] == '`' {
		n++
	}
	return n
}

// isTagAt reports whether the lower-case s holds an opening tag <name> or
// <name attr…> at i.
func isTagAt(s string, i int, name string) bool {
	if !strings.HasPrefix(s[i+1:], name) {
		return false
	}
	j := i + 1 + len(name)
	if j >= len(s) {
		return true
	}
	switch s[j] {
	case '>', ' ', '\t', '\n', '\r', '/':
		return true
	}
	return false
}

// stripsAnswerClose reports whether one of o.Stop is "</answer>", which an
// engine strips from the output it stops on.
func (o *Options) stripsAnswerClose() bool {
	for _, s := range o.Stop {
		if strings.EqualFold(strings.TrimSpace(s), "</answer>") {
			return true
		}
	}
	return false
}

package plan

import (
	"slices"
	"strings"
)

// doc is a planner output prepared for scanning. Think blocks are blanked
// out byte for byte (newlines kept), so every offset and line number in
// text is also one in the original output.
type doc struct {
	text  string
	lower string // text with ASCII letters lowered; same offsets
	nl    []int  // offsets of the newlines, for line numbers
	// thinkCut is set when a <think> block is never closed: everything
	// after it was blanked, and the output most likely hit the length limit.
	thinkCut bool
}

func newDoc(s string) *doc {
	lower := asciiLower(s)
	b := []byte(s)
	blank := func(from, to int) {
		for i := from; i < to; i++ {
			if b[i] != '\n' {
				b[i] = ' '
			}
		}
	}
	d := &doc{}
	// A lone </think> before any <think> closes a block that the chat
	// template opened in the prompt: everything before it is thinking.
	if c, o := strings.Index(lower, "</think>"), strings.Index(lower, "<think>"); c >= 0 && (o < 0 || c < o) {
		blank(0, c+len("</think>"))
	}
	for from := 0; ; {
		o := strings.Index(lower[from:], "<think>")
		if o < 0 {
			break
		}
		o += from
		c := strings.Index(lower[o:], "</think>")
		if c < 0 {
			blank(o, len(b))
			d.thinkCut = true
			break
		}
		c += o + len("</think>")
		blank(o, c)
		from = c
	}
	d.text = string(b)
	d.lower = asciiLower(d.text)
	for i := 0; i < len(b); i++ {
		if b[i] == '\n' {
			d.nl = append(d.nl, i)
		}
	}
	return d
}

func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// line returns the 1-based line number of offset off.
func (d *doc) line(off int) int {
	if off > len(d.text) {
		off = len(d.text)
	}
	if off < 0 {
		return 0
	}
	n, _ := slices.BinarySearch(d.nl, off) // newlines before off
	return n + 1
}

// index returns the offset of the first case-insensitive match of the
// lower-case sub at or after from, or -1.
func (d *doc) index(sub string, from int) int {
	if from > len(d.lower) {
		return -1
	}
	i := strings.Index(d.lower[from:], sub)
	if i < 0 {
		return -1
	}
	return i + from
}

// answers returns the text of the first non-empty <answer> block, split on
// "|". An unclosed <answer> runs to the end of the output: engines often
// strip a stop string such as </answer>.
func (d *doc) answers() []string {
	for from := 0; ; {
		o := d.index("<answer>", from)
		if o < 0 {
			return nil
		}
		start := o + len("<answer>")
		end := d.index("</answer>", start)
		next := end + len("</answer>")
		if end < 0 {
			end, next = len(d.text), len(d.text)
		}
		var out []string
		for _, a := range strings.Split(d.text[start:end], "|") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
		if len(out) > 0 {
			return out
		}
		from = next
	}
}

package plan

import (
	"slices"
	"strings"
)

// doc is a planner output prepared for scanning. Think blocks and echo
// blocks (observations the planner wrote itself) are blanked out byte for
// byte (newlines kept), so every offset and line number in text is also
// one in the original output.
type doc struct {
	text  string
	lower string // text with ASCII letters lowered; same offsets
	nl    []int  // offsets of the newlines, for line numbers
	// thinkCut is set when a <think> block is never closed: everything
	// after it was blanked, and the output most likely hit the length limit.
	thinkCut bool
	m        *meter
}

// echoTags name the blocks in which a planner imitates what planact (or a
// chat template) shows it: the <observation> blocks that the act-dispatcher
// appends after every turn, and their look-alikes. A planner that writes
// one is echoing, not planning or answering, so nothing inside counts.
var echoTags = []string{"observation", "observations", "tool_response", "tool_result", "result"}

// newDoc prepares s. partial says that s is the beginning of an output
// still being written (Options.Partial): an echo block opened in it may
// still be closed, and what it holds blanked, so everything after an echo
// tag not yet closed is blanked now, lest a streamed plan release the
// nodes of an echo.
func newDoc(s string, m *meter, partial bool) *doc {
	m.add(len(s))
	lower := asciiLower(s)
	b := []byte(s)
	blank := func(from, to int) {
		m.add(to - from)
		for i := from; i < to; i++ {
			if b[i] != '\n' {
				b[i] = ' '
			}
		}
	}
	d := &doc{m: m}
	// A lone </think> before any <think> closes a block that the chat
	// template opened in the prompt: everything before it is thinking.
	m.add(2 * len(s))
	if c, o := strings.Index(lower, "</think>"), strings.Index(lower, "<think>"); c >= 0 && (o < 0 || c < o) {
		blank(0, c+len("</think>"))
	}
	for from := 0; ; {
		o := strings.Index(lower[from:], "<think>")
		if o < 0 {
			m.add(len(s) - from)
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
		m.add(c - from)
		blank(o, c)
		from = c
	}
	blankEcho(string(b), blank, m, partial)
	d.text = string(b)
	m.add(2 * len(s))
	d.lower = asciiLower(d.text)
	for i := 0; i < len(b); i++ {
		if b[i] == '\n' {
			d.nl = append(d.nl, i)
		}
	}
	return d
}

// blankEcho blanks every closed echo block of text (think blocks already
// blanked). An echo tag pairs with the nearest opening tag of its name
// before it: prose that mentions "<observation>" before a real block does
// not swallow the plan in between, and an opening tag that is never closed
// is a mention, not a block, so it blanks nothing; unless open, when the
// text is only the beginning of the output and any tag still open may be
// closed later: then everything from the first of them is blanked.
func blankEcho(text string, blank func(from, to int), m *meter, open bool) {
	unclosed := map[string]int{}
	defer func() {
		if !open || len(unclosed) == 0 {
			return
		}
		first := len(text)
		for _, o := range unclosed {
			first = min(first, o)
		}
		blank(first, len(text))
	}()
	for i := 0; i < len(text); {
		k := strings.IndexByte(text[i:], '<')
		if k < 0 {
			m.add(len(text) - i)
			return
		}
		m.add(k + 1)
		i += k
		closing := i+1 < len(text) && text[i+1] == '/'
		at := i + 1
		if closing {
			at++
		}
		j := identAt(text, at)
		if j == at || j >= len(text) || text[j] != '>' {
			i = max(j, i+1)
			continue
		}
		name := asciiLower(text[at:j])
		m.add(j - at)
		if !slices.Contains(echoTags, name) {
			i = j
			continue
		}
		switch o, ok := unclosed[name]; {
		case !closing:
			unclosed[name] = i
		case ok:
			blank(o, j+1)
			// A block ends every block opened inside it.
			for n, p := range unclosed {
				if p >= o {
					delete(unclosed, n)
				}
			}
		}
		i = j + 1
	}
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
		d.m.add(len(d.lower) - from)
		return -1
	}
	d.m.add(i + len(sub))
	return i + from
}

// A finder answers "where is the next sub at or after from" for queries
// whose from never decreases, in one scan of the text for all of them: a
// parser that asks once per node or per tag would otherwise rescan the
// rest of the output each time the answer is far away or missing.
type finder struct {
	d   *doc
	sub string
	lo  int // the answer below is the first match at or after lo
	at  int // -1: none at or after lo
}

func (d *doc) finder(sub string) *finder { return &finder{d: d, sub: sub, lo: -1} }

func (f *finder) next(from int) int {
	if f.lo >= 0 && f.lo <= from && (f.at < 0 || f.at >= from) {
		return f.at
	}
	f.lo, f.at = from, f.d.index(f.sub, from)
	return f.at
}

// tagFinder is a finder for opening tags (see tagIndex).
type tagFinder struct {
	d    *doc
	name string
	lo   int
	at   int
}

func (d *doc) tagFinder(name string) *tagFinder { return &tagFinder{d: d, name: name, lo: -1} }

func (f *tagFinder) next(from int) int {
	if f.lo >= 0 && f.lo <= from && (f.at < 0 || f.at >= from) {
		return f.at
	}
	f.lo, f.at = from, tagIndex(f.d, f.name, from)
	return f.at
}

package plan

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A call is a tool invocation written tool("arg", ["$1"], key="v").
type call struct {
	tool string
	args map[string]any
	end  int // offset just after the closing parenthesis
}

var (
	errEOF    = errors.New("unexpected end of text")
	errSyntax = errors.New("syntax error")
)

// maxNesting bounds list/object nesting inside call arguments so that no
// input can exhaust the stack.
const maxNesting = 32

// isIdentStart and isIdent accept tool names such as wiki_search,
// web.search or llm-call.
func isIdentStart(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isIdent(c byte) bool {
	return isIdentStart(c) || '0' <= c && c <= '9' || c == '.' || c == '-'
}

// identAt returns the end of the identifier starting at s[i], or i.
func identAt(s string, i int) int {
	if i >= len(s) || !isIdentStart(s[i]) {
		return i
	}
	j := i + 1
	for j < len(s) && isIdent(s[j]) {
		j++
	}
	// A trailing '.' or '-' belongs to the sentence, not the name.
	for j > i+1 && (s[j-1] == '.' || s[j-1] == '-') {
		j--
	}
	return j
}

// parseCall parses a call that starts at s[i] (no leading space). It
// returns errEOF if the text ends inside the call and errSyntax if the text
// at i is not a well-formed call. m is charged for what it reads.
func parseCall(m *meter, s string, i int) (call, error) {
	j := identAt(s, i)
	m.add(j - i + 1)
	if j == i || j >= len(s) || s[j] != '(' {
		if j == len(s) && j > i {
			return call{}, errEOF
		}
		return call{}, errSyntax
	}
	c := call{tool: s[i:j], args: map[string]any{}}
	p := &argParser{s: s, i: j + 1}
	defer func() { m.add(p.i - j + p.extra) }()
	var positional []any
	p.space()
	if p.peek() == ')' {
		c.end = p.i + 1
		return c, nil
	}
	for {
		p.space()
		if p.i >= len(s) {
			return call{}, errEOF
		}
		if name, ok := p.keyword(); ok {
			v, err := p.value(0)
			if err != nil {
				return call{}, err
			}
			c.args[name] = v
		} else {
			v, err := p.value(0)
			if err != nil {
				return call{}, err
			}
			positional = append(positional, v)
		}
		p.space()
		switch p.peek() {
		case ',':
			p.i++
			p.space()
			if p.peek() == ')' { // trailing comma
				p.i++
				c.end = p.i
				assignPositional(c.args, positional)
				return c, nil
			}
		case ')':
			p.i++
			c.end = p.i
			assignPositional(c.args, positional)
			return c, nil
		case 0:
			if p.i >= len(s) {
				return call{}, errEOF
			}
			return call{}, errSyntax
		default:
			return call{}, errSyntax
		}
	}
}

// assignPositional names positional arguments: the first list is the
// context (references to earlier results), the first other value is the
// input, and the rest are arg<position>.
func assignPositional(args map[string]any, pos []any) {
	for n, v := range pos {
		_, isList := v.([]any)
		switch {
		case isList && args["context"] == nil:
			args["context"] = v
		case !isList && args["input"] == nil:
			args["input"] = v
		default:
			args["arg"+strconv.Itoa(n+1)] = v
		}
	}
}

type argParser struct {
	s     string
	i     int
	extra int // bytes read more than once (a keyword that was not one, a token trimmed)
}

// keyword consumes "name=" or "name:" at p.i and returns the name.
func (p *argParser) keyword() (string, bool) {
	k := identAt(p.s, p.i)
	if k == p.i {
		return "", false
	}
	q := k
	for q < len(p.s) && (p.s[q] == ' ' || p.s[q] == '\t') {
		q++
	}
	if q >= len(p.s) || p.s[q] != ':' && (p.s[q] != '=' || q+1 < len(p.s) && p.s[q+1] == '=') {
		p.extra += q - p.i
		return "", false
	}
	p.extra += q - p.i
	name := p.s[p.i:k]
	p.i = q + 1
	return name, true
}

func (p *argParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *argParser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses a string, number, list, object, boolean, null, or a bare
// token such as $1 (kept as a string).
func (p *argParser) value(depth int) (any, error) {
	if depth > maxNesting {
		return nil, errSyntax
	}
	p.space()
	if p.i >= len(p.s) {
		return nil, errEOF
	}
	switch c := p.s[p.i]; {
	case c == '"' || c == '\'':
		return p.str()
	case c == '[':
		p.i++
		list := []any{}
		for {
			p.space()
			switch p.peek() {
			case ']':
				p.i++
				return list, nil
			case 0:
				return nil, errEOF
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
			p.space()
			switch p.peek() {
			case ',':
				p.i++
			case ']':
			case 0:
				return nil, errEOF
			default:
				return nil, errSyntax
			}
		}
	case c == '{' && !p.isPlaceholder():
		p.i++
		obj := map[string]any{}
		for {
			p.space()
			switch p.peek() {
			case '}':
				p.i++
				return obj, nil
			case 0:
				return nil, errEOF
			}
			var key string
			if q := p.peek(); q == '"' || q == '\'' {
				k, err := p.str()
				if err != nil {
					return nil, err
				}
				key = k
			} else if e := identAt(p.s, p.i); e > p.i {
				key, p.i = p.s[p.i:e], e
			} else {
				return nil, errSyntax
			}
			p.space()
			if p.peek() != ':' {
				if p.i >= len(p.s) {
					return nil, errEOF
				}
				return nil, errSyntax
			}
			p.i++
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			obj[key] = v
			p.space()
			switch p.peek() {
			case ',':
				p.i++
			case '}':
			case 0:
				return nil, errEOF
			default:
				return nil, errSyntax
			}
		}
	default:
		return p.bare()
	}
}

// isPlaceholder reports whether a '{' at p.i opens a placeholder such as
// {s1} rather than an object.
func (p *argParser) isPlaceholder() bool {
	_, n := placeholderAt(p.s, p.i)
	return n > 0
}

// bare reads an unquoted token up to the next delimiter: numbers,
// true/false/null, and references such as $1 or {s1}.
func (p *argParser) bare() (any, error) {
	start := p.i
	// A '}' ends the token unless a '{' came before it in the token: it
	// closes a placeholder ({s1}) then.
	braced := false
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == ',' || c == ')' || c == ']' || c == '}' && !braced || c == '\n' {
			break
		}
		if c == '(' || c == '[' || c == '"' {
			return nil, errSyntax
		}
		braced = braced || c == '{'
		p.i++
	}
	p.extra += 2 * (p.i - start)
	tok := strings.TrimSpace(p.s[start:p.i])
	if p.i >= len(p.s) {
		return nil, errEOF
	}
	if tok == "" || strings.ContainsAny(tok, " \t") {
		return nil, errSyntax // unquoted text: see callRegion
	}
	switch tok {
	case "true", "True":
		return true, nil
	case "false", "False":
		return false, nil
	case "null", "None", "nil":
		return nil, nil
	}
	if f, err := strconv.ParseFloat(tok, 64); err == nil && (tok[0] == '-' || tok[0] == '.' || '0' <= tok[0] && tok[0] <= '9') {
		return f, nil
	}
	return tok, nil
}

// str parses a single- or double-quoted string with backslash escapes.
func (p *argParser) str() (string, error) {
	q := p.s[p.i]
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return b.String(), nil
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", errEOF
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'u':
				if p.i+4 <= len(p.s) {
					if r, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32); err == nil {
						b.WriteRune(rune(r))
						p.i += 4
						continue
					}
				}
				b.WriteString(`\u`)
			case '"', '\'', '\\', '/':
				b.WriteByte(e)
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			_, n := utf8.DecodeRuneInString(p.s[p.i:])
			b.WriteString(p.s[p.i : p.i+n])
			p.i += n
		}
	}
	return "", errEOF
}

// callRegion parses region as one call that fills it, allowing a trailing
// ';' and a trailing comment ("# …", "// …") which becomes the note. A call
// whose arguments are not literals (search(capital of France)) is accepted
// with its raw argument text as input. ok is false if region is not a call;
// then err is errEOF if region ends inside a call, errSyntax if it is a
// malformed call, nil if it is not a call at all.
func callRegion(m *meter, region string) (c call, note string, ok bool, err error) {
	m.add(2 * len(region))
	region = strings.TrimSpace(region)
	c, err = parseCall(m, region, 0)
	if err == nil {
		rest := strings.TrimSpace(strings.TrimLeft(region[c.end:], " \t;"))
		switch {
		case rest == "":
			return c, "", true, nil
		case strings.HasPrefix(rest, "#") || strings.HasPrefix(rest, "//"):
			return c, strings.TrimSpace(strings.TrimLeft(rest, "#/")), true, nil
		}
	}
	j := identAt(region, 0)
	if j == 0 || j >= len(region) || region[j] != '(' {
		return call{}, "", false, nil
	}
	body := strings.TrimRight(region, " \t\r\n;")
	if !strings.HasSuffix(body, ")") {
		if errors.Is(err, errEOF) {
			return call{}, "", false, errEOF
		}
		return call{}, "", false, nil
	}
	inner := strings.TrimSpace(body[j+1 : len(body)-1])
	if inner != "" && strings.IndexByte("\"'[{", inner[0]) >= 0 {
		if _, n := placeholderAt(inner, 0); n == 0 {
			return call{}, "", false, errSyntax // meant as literals, but malformed
		}
	}
	c = call{tool: region[:j], args: map[string]any{}, end: len(body)}
	if inner != "" {
		c.args["input"] = inner
	}
	return c, "", true, nil
}

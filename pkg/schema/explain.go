package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// A decoder of a typed value stops at the first byte it cannot use and
// says so in its own terms ("invalid code=cb decoding int64"), naming no
// field. When a decode fails, explainMsgpack reads the body again as plain
// values and walks them along the type (culprit) to find where the culprit
// is, what it is, and what is wanted there. Only a failed decode pays for
// that walk. A JSON body is read as plain values anyway, and walked first.

// explainMsgpack turns err, from decoding msgpack data into v, into an
// error that names the culprit. strict: a field v does not have is a
// culprit too. When nothing in the body explains err, err is returned as
// it is.
func explainMsgpack(data []byte, v any, err error, strict bool) error {
	if len(data) == 0 {
		return errors.New("the body is empty")
	}
	if looksJSON(data) {
		return errJSONBody
	}
	body, terr := msgpackTree(data)
	if terr != nil {
		return fmt.Errorf("not a msgpack body: %w", terr)
	}
	if serr := schemaMismatch(body, v); serr != nil {
		return serr
	}
	if c := culprit(body, reflect.TypeOf(v), "", strict); c != nil {
		return c
	}
	return err
}

// errJSONBody answers a JSON body sent without the Content-Type that says so.
var errJSONBody = errors.New("the body is JSON, and planact reads msgpack: encode it as msgpack (Content-Type: " + ContentType +
	"), or, for what a trainer writes (arrivals, cancels, pauses, resumes), publish it with the header Content-Type: " + ContentTypeJSON +
	" (nats pub SUBJECT BODY -H 'Content-Type: " + ContentTypeJSON + "')")

// looksJSON reports whether data, which is not a msgpack message (a
// message is a map), reads as a JSON object or array. A msgpack map
// never starts with '{' or '[' (those bytes are the integers 123 and 91).
func looksJSON(data []byte) bool {
	data = bytes.TrimLeft(data, " \t\r\n")
	return len(data) > 0 && (data[0] == '{' || data[0] == '[')
}

// schemaMismatch says that a body of another kind than v was sent, before
// any of its fields is blamed: v's own fields are not the point then.
func schemaMismatch(body any, v any) error {
	m, ok := v.(Message)
	if !ok {
		return nil
	}
	if _, ok := v.(enveloped); !ok {
		return nil
	}
	fields, ok := body.(map[string]any)
	if !ok {
		return nil
	}
	got, ok := fields["schema"].(string)
	if !ok || got == m.Kind() {
		return nil
	}
	return fmt.Errorf("body is %q, this reader understands %q", got, m.Kind())
}

// msgpackTree decodes a msgpack body into plain values: maps (with string
// keys where every key is a string), slices, numbers of the width they
// were sent in, strings, bytes, booleans and nil.
func msgpackTree(data []byte) (any, error) {
	if err := scanBody(data); err != nil {
		return nil, err // the library reads bytes as it reads arrays: all it is told at once
	}
	r := bytes.NewReader(data)
	v, err := decodeValue(msgpack.NewDecoder(r), 0)
	if err != nil {
		return nil, err
	}
	if r.Len() > 0 {
		return nil, fmt.Errorf("%d bytes left after the first value", r.Len())
	}
	return v, nil
}

// jsonTree decodes a JSON body into plain values, its numbers kept as
// json.Number (so that an integer is blamed as it was written). A key
// given twice in one object is refused, named by its path: encoding/json
// keeps the last one silently.
func jsonTree(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, jsonErr(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("not a JSON body: more follows its first value (at byte %d)", dec.InputOffset())
	}
	if err := jsonDuplicateKey(data); err != nil {
		return nil, err
	}
	return v, nil
}

// jsonDuplicateKey finds the first key given twice in an object of the
// JSON value data (which decodes), in the order written.
func jsonDuplicateKey(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return jsonErr(err)
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return jsonErr(err)
				}
				k, _ := tok.(string)
				if seen[k] {
					return &duplicateKeyError{join(path, k)}
				}
				seen[k] = true
				if err := walk(join(path, k)); err != nil {
					return err
				}
			}
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		default:
			return nil
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return jsonErr(err)
		}
		return nil
	}
	return walk("")
}

func jsonErr(err error) error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("not a JSON body: at byte %d: %v", syn.Offset, err)
	}
	return fmt.Errorf("not a JSON body: %v", err)
}

// fromJSON turns a JSON tree into what msgpack encodes as the same data:
// integers as integers (uint64 beyond int64, a float beyond that), other
// numbers as floats.
func fromJSON(v any) any {
	switch t := v.(type) {
	case json.Number:
		if n, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return n
		}
		if u, err := strconv.ParseUint(string(t), 10, 64); err == nil {
			return u
		}
		f, _ := strconv.ParseFloat(string(t), 64) // ±Inf beyond float64: refused where it matters
		return f
	case map[string]any:
		for k, x := range t {
			t[k] = fromJSON(x)
		}
	case []any:
		for i, x := range t {
			t[i] = fromJSON(x)
		}
	}
	return v
}

// fieldError is a value of a body that its field cannot hold.
type fieldError struct {
	path string // "config.max_turns", "tasks[3].prompt"; "" for the body
	got  any
	want string
}

func (e *fieldError) Error() string {
	where := e.path
	if where == "" {
		where = "the body"
	}
	return fmt.Sprintf("%s is %s: want %s", where, describe(e.got), e.want)
}

// unknownFieldError is a field the body's type does not have.
type unknownFieldError struct{ path string }

func (e *unknownFieldError) Error() string { return fmt.Sprintf("unknown field %q", e.path) }

// culprit returns the first value of body (map keys in sorted order) that
// type t cannot hold, or, strict, the first field t does not have; nil if
// there is none. The rules are the decoder's: nil is every type's zero, an
// integer takes an integer in its range or a float with no fraction
// (decodeInt), a float any number, a string a string or bytes.
func culprit(body any, t reflect.Type, path string, strict bool) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if body == nil || opaque(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Interface:
		return freeCulprit(body, path)
	case reflect.Bool:
		if _, ok := body.(bool); !ok {
			return &fieldError{path, body, "true or false"}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intCulprit(body, t, path, t == intSliceElem)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return uintCulprit(body, t, path)
	case reflect.Float32, reflect.Float64:
		if c := hugeNumber(body, path); c != nil {
			return c
		}
		if _, ok := number(body); !ok {
			return &fieldError{path, body, "a number"}
		}
	case reflect.String:
		switch body.(type) {
		case string, []byte:
		default:
			return &fieldError{path, body, "a string"}
		}
	case reflect.Struct:
		return structCulprit(body, t, path, strict)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			switch body.(type) {
			case string, []byte:
				return nil
			}
		}
		items, ok := body.([]any)
		if !ok {
			return &fieldError{path, body, "an array"}
		}
		elem := t.Elem()
		if t == intSlice {
			elem = intSliceElem
		}
		for i, x := range items {
			if c := culprit(x, elem, fmt.Sprintf("%s[%d]", path, i), strict); c != nil {
				return c
			}
		}
	case reflect.Map:
		return mapCulprit(body, t, path, strict)
	}
	return nil
}

// intSlice is decoded by codec.go's fast loop, which reads integers only;
// intSliceElem stands for its elements.
var (
	intSlice     = reflect.TypeOf([]int(nil))
	intSliceElem = reflect.TypeOf(tokenID(0))
)

type tokenID int

// opaque types decode themselves: their bodies are theirs to judge.
func opaque(t reflect.Type) bool {
	if t == reflect.TypeOf(time.Time{}) {
		return true
	}
	p := reflect.PointerTo(t)
	for _, i := range []reflect.Type{
		reflect.TypeOf((*msgpack.CustomDecoder)(nil)).Elem(),
		reflect.TypeOf((*msgpack.Unmarshaler)(nil)).Elem(),
	} {
		if t.Implements(i) || p.Implements(i) {
			return true
		}
	}
	return false
}

func structCulprit(body any, t reflect.Type, path string, strict bool) error {
	m, ok := body.(map[string]any)
	if !ok {
		if _, ok := body.(map[any]any); ok {
			return &fieldError{path, body, "a map whose keys are field names (strings)"}
		}
		return &fieldError{path, body, "a map of fields"}
	}
	fields := jsonFields(t)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ft, ok := fields[k]
		if !ok {
			if strict {
				return &unknownFieldError{join(path, k)}
			}
			continue
		}
		if c := culprit(m[k], ft, join(path, k), strict); c != nil {
			return c
		}
	}
	return nil
}

func mapCulprit(body any, t reflect.Type, path string, strict bool) error {
	if t.Key().Kind() != reflect.String {
		return nil // planact's messages key their maps by strings
	}
	m, ok := body.(map[string]any)
	if !ok {
		if _, ok := body.(map[any]any); ok {
			return &fieldError{path, body, "a map whose keys are strings"}
		}
		return &fieldError{path, body, "a map"}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if c := culprit(m[k], t.Elem(), join(path, k), strict); c != nil {
			return c
		}
	}
	return nil
}

// intCulprit judges a value for an integer field of type t; onlyInts: the
// field reads integers only (token ids, in codec.go's fast loop).
func intCulprit(body any, t reflect.Type, path string, onlyInts bool) error {
	bits := t.Bits()
	lo, hi := int64(math.MinInt64)>>(64-bits), int64(math.MaxInt64)>>(64-bits)
	outOfRange := &fieldError{path, body, fmt.Sprintf("an integer from %d to %d", lo, hi)}
	switch x := body.(type) {
	case int8, int16, int32, int64:
		if n := reflect.ValueOf(x).Int(); n < lo || n > hi {
			return outOfRange
		}
	case uint8, uint16, uint32, uint64:
		if reflect.ValueOf(x).Uint() > uint64(hi) {
			return outOfRange
		}
	case float32, float64:
		if onlyInts {
			return &fieldError{path, body, "an integer"}
		}
		f := reflect.ValueOf(x).Float()
		if f != math.Trunc(f) {
			return &fieldError{path, body, "an integer (a float is taken only when it has no fraction, like 4.0)"}
		}
		if f < float64(lo) || f >= -float64(lo) {
			return outOfRange
		}
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return intCulprit(n, t, path, onlyInts)
		}
		if isIntegerLiteral(string(x)) {
			return outOfRange // beyond int64: blamed as it was written
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return outOfRange
		}
		if c := intCulprit(f, t, path, onlyInts); c != nil {
			c.(*fieldError).got = x
			return c
		}
	default:
		return &fieldError{path, body, "an integer"}
	}
	return nil
}

func uintCulprit(body any, t reflect.Type, path string) error {
	hi := uint64(math.MaxUint64) >> (64 - t.Bits())
	outOfRange := &fieldError{path, body, fmt.Sprintf("an integer from 0 to %d", hi)}
	switch x := body.(type) {
	case int8, int16, int32, int64:
		if reflect.ValueOf(x).Int() < 0 {
			return outOfRange
		}
	case uint8, uint16, uint32, uint64:
		if reflect.ValueOf(x).Uint() > hi {
			return outOfRange
		}
	case json.Number:
		if _, err := strconv.ParseUint(string(x), 10, t.Bits()); err != nil {
			return outOfRange
		}
	default:
		return &fieldError{path, body, "an integer"}
	}
	return nil
}

// freeCulprit finds what a free-form value (a task's metadata) cannot
// hold: a map keyed by anything but strings (it is read into
// map[string]any), or, in a JSON value, a number beyond what a float64
// holds (hugeNumber).
func freeCulprit(body any, path string) error {
	switch x := body.(type) {
	case map[any]any:
		return &fieldError{path, body, "a map whose keys are strings"}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if c := freeCulprit(x[k], join(path, k)); c != nil {
				return c
			}
		}
	case []any:
		for i, v := range x {
			if c := freeCulprit(v, fmt.Sprintf("%s[%d]", path, i)); c != nil {
				return c
			}
		}
	default:
		return hugeNumber(body, path)
	}
	return nil
}

// hugeNumber refuses a JSON number beyond what a float64 holds (1e400),
// which msgpack cannot carry: refused rather than made infinite. (Maps and
// arrays are walked by freeCulprit.)
func hugeNumber(body any, path string) error {
	if x, ok := body.(json.Number); ok {
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return &fieldError{path, body, fmt.Sprintf("a number within ±%g", math.MaxFloat64)}
		}
	}
	return nil
}

// number reads a plain numeric value.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int8, int16, int32, int64:
		return float64(reflect.ValueOf(x).Int()), true
	case uint8, uint16, uint32, uint64:
		return float64(reflect.ValueOf(x).Uint()), true
	case float32, float64:
		return reflect.ValueOf(x).Float(), true
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil
	}
	return 0, false
}

func isIntegerLiteral(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// describe says what a plain value is, in a trainer's words.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "nil"
	case bool:
		return fmt.Sprintf("the boolean %t", x)
	case string:
		return "the string " + quoteShort(x)
	case []byte:
		return fmt.Sprintf("%d bytes of binary", len(x))
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return fmt.Sprintf("the integer %v", x)
	case float32:
		return "the float " + strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return "the float " + strconv.FormatFloat(x, 'g', -1, 64)
	case json.Number:
		if isIntegerLiteral(string(x)) {
			return "the integer " + string(x)
		}
		return "the number " + string(x)
	case []any:
		return fmt.Sprintf("an array of %d", len(x))
	case arrayOf:
		return fmt.Sprintf("an array of %d", x)
	case map[string]any, map[any]any:
		return "a map"
	case time.Time:
		return "a timestamp"
	}
	return fmt.Sprintf("a %T", v)
}

// quoteShort quotes s, cut to a length an error message can carry.
func quoteShort(s string) string {
	const max = 40
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

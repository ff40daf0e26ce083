package schema

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The msgpack library is lenient where a trainer's mistake must be an
// error: it fills a struct from an array, by position ("engine":
// ["http://x", "sglang", "m", 5]; "config": [] is a config of defaults),
// so that neither the field names nor the unknown-field check ever apply;
// and of a key given twice in a map it keeps the last, or merges the two
// where the value is a struct. checkShape reads what a trainer wrote along
// the type it is decoded into, before it is, and refuses both, naming the
// path, as culprit does for a JSON body (whose duplicate keys jsonTree
// refuses).

// checkShape walks the msgpack body data (scanned: scanBody) along type t:
// every value where t has a struct must be a map (or nil), no map may give
// a key twice, and every map's keys must be strings (a key of a struct is
// a field name; a free-form map is read into map[string]any). It
// allocates next to nothing: a walk costs a fraction of the decode.
func checkShape(data []byte, t reflect.Type) error {
	w := shapeWalker{data: data}
	return w.value(shapeOf(t))
}

type shapeWalker struct {
	data []byte
	i    int
	path []pathStep // where the walk is, named only in an error
}

// pathStep is a map key, or (key nil) an array element.
type pathStep struct {
	key   []byte
	index int
}

func (w *shapeWalker) where() string {
	var b strings.Builder
	for _, s := range w.path {
		if s.key == nil {
			fmt.Fprintf(&b, "[%d]", s.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(s.key)
	}
	return b.String()
}

// Kinds of msgpack values, as the walker tells them apart.
const (
	mpScalar = iota // nil, booleans, numbers, extensions: skipped whole
	mpString        // a str or bin of n bytes, which follow
	mpArray         // of n values
	mpMap           // of n keys and values
)

// head reads the header of the value at w.i: a scalar is skipped whole, a
// string or container is left at its first byte or element.
func (w *shapeWalker) head() (kind, n int) {
	c := w.data[w.i]
	w.i++
	switch {
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
		return mpScalar, 0
	case msgpcode.IsFixedMap(c):
		return mpMap, int(c & 0x0f)
	case msgpcode.IsFixedArray(c):
		return mpArray, int(c & 0x0f)
	case msgpcode.IsFixedString(c):
		return mpString, int(c & 0x1f)
	}
	switch c {
	case msgpcode.Nil, msgpcode.False, msgpcode.True:
		return mpScalar, 0
	case msgpcode.Uint8, msgpcode.Int8:
		w.i++
	case msgpcode.Uint16, msgpcode.Int16:
		w.i += 2
	case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
		w.i += 4
	case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
		w.i += 8
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		w.i += 1 + 1<<(c-msgpcode.FixExt1)
	case msgpcode.Str8, msgpcode.Bin8:
		return mpString, w.length(1)
	case msgpcode.Str16, msgpcode.Bin16:
		return mpString, w.length(2)
	case msgpcode.Str32, msgpcode.Bin32:
		return mpString, w.length(4)
	case msgpcode.Ext8:
		w.i += w.length(1) + 1
	case msgpcode.Ext16:
		w.i += w.length(2) + 1
	case msgpcode.Ext32:
		w.i += w.length(4) + 1
	case msgpcode.Array16:
		return mpArray, w.length(2)
	case msgpcode.Array32:
		return mpArray, w.length(4)
	case msgpcode.Map16:
		return mpMap, w.length(2)
	case msgpcode.Map32:
		return mpMap, w.length(4)
	}
	return mpScalar, 0
}

// length reads a big-endian length of size bytes (scanBody checked that
// it is there, and backed).
func (w *shapeWalker) length(size int) int {
	var n int
	switch size {
	case 1:
		n = int(w.data[w.i])
	case 2:
		n = int(binary.BigEndian.Uint16(w.data[w.i:]))
	case 4:
		n = int(binary.BigEndian.Uint32(w.data[w.i:]))
	}
	w.i += size
	return n
}

// value walks the value at w.i, read into what sh describes (nil: a
// free-form value, read into an interface).
func (w *shapeWalker) value(sh *shape) error {
	kind, n := w.head()
	switch kind {
	case mpString:
		w.i += n
	case mpArray:
		var elem *shape
		if sh != nil {
			switch sh.kind {
			case shapeOfStruct:
				return &fieldError{w.where(), arrayOf(n), "a map of fields"}
			case shapeOfList:
				elem = sh.elem
			}
		}
		w.path = append(w.path, pathStep{})
		for i := range n {
			w.path[len(w.path)-1].index = i
			if err := w.value(elem); err != nil {
				return err
			}
		}
		w.path = w.path[:len(w.path)-1]
	case mpMap:
		return w.mapValue(sh, n)
	}
	return nil
}

// mapValue walks the n keys and values of a map read into what sh
// describes.
func (w *shapeWalker) mapValue(sh *shape, n int) error {
	var fields map[string]*shape // of a struct
	var elem *shape              // of a map
	wantKeys := "a map whose keys are strings"
	if sh != nil {
		switch sh.kind {
		case shapeOfStruct:
			fields = sh.fields
			wantKeys = "a map whose keys are field names (strings)"
		case shapeOfMap:
			elem = sh.elem
		case shapeOfOtherMap:
			return w.skipMap(n) // planact's messages key their maps by strings; this one is the decoder's to judge
		}
	}
	var few [16][]byte // the keys so far, for a small map
	var many map[string]struct{}
	if n > len(few) {
		many = make(map[string]struct{}, min(n, 1024))
	}
	for k := range n {
		kind, size := w.head()
		if kind != mpString {
			return &fieldError{w.where(), map[any]any(nil), wantKeys}
		}
		key := w.data[w.i : w.i+size : w.i+size]
		w.i += size
		if many != nil {
			if _, dup := many[string(key)]; dup {
				return w.duplicate(key)
			}
			many[string(key)] = struct{}{}
		} else {
			for _, seen := range few[:k] {
				if bytes.Equal(seen, key) {
					return w.duplicate(key)
				}
			}
			few[k] = key
		}
		vt := elem
		w.path = append(w.path, pathStep{key: key})
		if fields != nil {
			vt = fields[string(key)] // nil for a field the struct does not have: the decoder refuses it
			if rule, ok := sh.empty[string(key)]; ok && w.emptyString() {
				return &fieldError{w.where(), "", rule}
			}
		}
		if err := w.value(vt); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
	}
	return nil
}

func (w *shapeWalker) duplicate(key []byte) error {
	w.path = append(w.path, pathStep{key: key})
	return &duplicateKeyError{w.where()}
}

// skipMap walks past the n keys and values of a map whose keys are not
// looked at.
func (w *shapeWalker) skipMap(n int) error {
	for range 2 * n {
		if err := w.value(nil); err != nil {
			return err
		}
	}
	return nil
}

// emptyString reports whether the value at w.i is an empty string.
func (w *shapeWalker) emptyString() bool {
	switch w.data[w.i] {
	case msgpcode.FixedStrLow:
		return true
	case msgpcode.Str8, msgpcode.Bin8:
		return w.data[w.i+1] == 0
	case msgpcode.Str16, msgpcode.Bin16:
		return binary.BigEndian.Uint16(w.data[w.i+1:]) == 0
	case msgpcode.Str32, msgpcode.Bin32:
		return binary.BigEndian.Uint32(w.data[w.i+1:]) == 0
	}
	return false
}

// emptyRefused are the string fields of what a trainer writes that an
// empty string cannot stand for: left out, they take their default; given
// empty, they are a mistake (the schema's enum has no ""), not the
// default. What is wanted, by field, by type.
var emptyRefused = map[reflect.Type]map[string]string{
	reflect.TypeOf(Pause{}): {"mode": "wait or abort (left out: wait)"},
}

// shape is what the walker needs to know of a Go type, worked out once
// per type (shapeOf): a task list walks a task's fields for every task.
type shape struct {
	kind   int
	fields map[string]*shape // a struct's, by json name
	elem   *shape            // a list's or map's elements; nil: free-form
	empty  map[string]string // a struct's emptyRefused fields
}

// Kinds of shapes.
const (
	shapeOfScalar   = iota // a string, number or boolean: the decoder judges its value
	shapeOfStruct          // fields by name, from a map
	shapeOfList            // a slice or array
	shapeOfMap             // a map keyed by strings
	shapeOfOtherMap        // a map keyed by anything else
)

var shapes sync.Map // reflect.Type → *shape

// shapeOf is the shape of t; nil for a free-form value (an interface, or
// a type that decodes itself).
func shapeOf(t reflect.Type) *shape {
	if sh, ok := shapes.Load(t); ok {
		return sh.(*shape)
	}
	sh, _ := shapes.LoadOrStore(t, buildShape(t, map[reflect.Type]*shape{}))
	return sh.(*shape)
}

// buildShape works out t's shape; seen holds the shapes under way, for a
// type that holds itself.
func buildShape(t reflect.Type, seen map[reflect.Type]*shape) *shape {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Interface || opaque(t) {
		return nil // decoded as it comes (a type that decodes itself reads a task's metadata, say): its maps are maps all the same
	}
	if sh, ok := seen[t]; ok {
		return sh
	}
	sh := &shape{}
	seen[t] = sh
	switch t.Kind() {
	case reflect.Struct:
		sh.kind, sh.fields, sh.empty = shapeOfStruct, map[string]*shape{}, emptyRefused[t]
		for name, ft := range jsonFields(t) {
			sh.fields[name] = buildShape(ft, seen)
		}
	case reflect.Slice, reflect.Array:
		sh.kind, sh.elem = shapeOfList, buildShape(t.Elem(), seen)
	case reflect.Map:
		sh.kind = shapeOfOtherMap
		if t.Key().Kind() == reflect.String {
			sh.kind, sh.elem = shapeOfMap, buildShape(t.Elem(), seen)
		}
	}
	return sh
}

// arrayOf stands for an array of n values in an error (describe), without
// the values.
type arrayOf int

// duplicateKeyError is a key given twice in one map of a body.
type duplicateKeyError struct{ path string }

func (e *duplicateKeyError) Error() string {
	return fmt.Sprintf("duplicate key %s: a map gives each key once", strconv.Quote(e.path))
}

package schema

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The msgpack library allocates what an array or map header claims before
// it reads a single element: a 5-byte header claiming 2^32 tasks, or 2^32
// values in a task's metadata, had the session-store allocate hundreds of
// gigabytes and die. What a trainer writes is therefore scanned before it
// is decoded (scanBody), and planact's own readers of bodies of any shape
// (decodeValue) grow their slices and maps as elements come.

// trainerWritten marks what a trainer writes (arrivals, cancels, pauses,
// resumes, task lists): bodies from outside planact, scanned before they
// are decoded wherever they are read. planact's own messages are not: a
// scan costs about a tenth of a token array's decode.
type trainerWritten interface{ trainerWritten() }

func (*Arrive) trainerWritten()   {}
func (*Cancel) trainerWritten()   {}
func (*Pause) trainerWritten()    {}
func (*Resume) trainerWritten()   {}
func (*TaskList) trainerWritten() {}

// maxDepth bounds how deep the arrays and maps of a body may nest; planact's
// messages nest a few levels, and free-form metadata may nest more.
const maxDepth = 200

// scanBody checks, without allocating, that the first msgpack value of
// data is whole: every length it declares is backed by the bytes that
// follow, and it nests at most maxDepth deep. Bytes after it are left to
// the caller.
func scanBody(data []byte) error {
	left := []int{1} // values still to read, per open array or map
	i := 0
	for len(left) > 0 {
		if left[len(left)-1] == 0 {
			left = left[:len(left)-1]
			continue
		}
		left[len(left)-1]--
		if i >= len(data) {
			return errShort
		}
		c := data[i]
		i++
		skip, items := 0, -1 // bytes of the value after its header; elements, for a container
		switch {
		case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
		case msgpcode.IsFixedMap(c):
			items = 2 * int(c&0x0f)
		case msgpcode.IsFixedArray(c):
			items = int(c & 0x0f)
		case msgpcode.IsFixedString(c):
			skip = int(c & 0x1f)
		default:
			var n uint64
			var err error
			switch c {
			case msgpcode.Nil, msgpcode.False, msgpcode.True:
			case msgpcode.Uint8, msgpcode.Int8:
				skip = 1
			case msgpcode.Uint16, msgpcode.Int16:
				skip = 2
			case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
				skip = 4
			case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
				skip = 8
			case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
				skip = 1 + 1<<(c-msgpcode.FixExt1)
			case msgpcode.Str8, msgpcode.Bin8, msgpcode.Ext8:
				n, i, err = length(data, i, 1)
				skip = int(n)
			case msgpcode.Str16, msgpcode.Bin16, msgpcode.Ext16:
				n, i, err = length(data, i, 2)
				skip = int(n)
			case msgpcode.Str32, msgpcode.Bin32, msgpcode.Ext32:
				n, i, err = length(data, i, 4)
				skip = int(n)
			case msgpcode.Array16:
				n, i, err = length(data, i, 2)
				items = int(n)
			case msgpcode.Array32:
				n, i, err = length(data, i, 4)
				items = int(n)
			case msgpcode.Map16:
				n, i, err = length(data, i, 2)
				items = 2 * int(n)
			case msgpcode.Map32:
				n, i, err = length(data, i, 4)
				items = 2 * int(n)
			default:
				return fmt.Errorf("byte %d: 0x%02x starts no msgpack value", i-1, c)
			}
			if err != nil {
				return err
			}
			if c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32 {
				skip++ // the extension's type
			}
		}
		if skip > len(data)-i {
			return errShort
		}
		i += skip
		if items >= 0 {
			// Every element takes a byte at least.
			if items > len(data)-i {
				return fmt.Errorf("byte %d: an array or map of %d elements in the %d bytes left", i, items, len(data)-i)
			}
			if len(left) > maxDepth {
				return fmt.Errorf("byte %d: arrays and maps nested deeper than %d", i, maxDepth)
			}
			left = append(left, items)
		}
	}
	return nil
}

var errShort = errors.New("the body ends inside a value")

// length reads a big-endian length of size bytes at data[i:].
func length(data []byte, i, size int) (uint64, int, error) {
	if len(data)-i < size {
		return 0, i, errShort
	}
	var n uint64
	switch size {
	case 1:
		n = uint64(data[i])
	case 2:
		n = uint64(binary.BigEndian.Uint16(data[i:]))
	case 4:
		n = uint64(binary.BigEndian.Uint32(data[i:]))
	}
	return n, i + size, nil
}

// decodeValue reads one msgpack value into plain Go values: maps with
// string keys (map[any]any where a key is not a string), []any, numbers of
// the width they were sent in, strings, []byte, booleans and nil. Unlike
// the library's generic decoding, it allocates arrays and maps as elements
// come, and refuses to nest deeper than maxDepth; the library still reads
// a string or bytes at once, so the body is scanned first (msgpackTree).
func decodeValue(d *msgpack.Decoder, depth int) (any, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		if depth >= maxDepth {
			return nil, fmt.Errorf("arrays and maps nested deeper than %d", maxDepth)
		}
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, min(n, 64))
		var other map[any]any // once a key is not a string
		for range n {
			k, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			if b, ok := k.([]byte); ok {
				k = string(b)
			}
			switch k.(type) {
			case map[string]any, map[any]any, []any:
				return nil, fmt.Errorf("a map key is %s", describe(k))
			}
			if s, ok := k.(string); ok && other == nil {
				m[s] = v
				continue
			}
			if other == nil {
				other = make(map[any]any, len(m)+1)
				for s, x := range m {
					other[s] = x
				}
			}
			other[k] = v
		}
		if other != nil {
			return other, nil
		}
		return m, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		if depth >= maxDepth {
			return nil, fmt.Errorf("arrays and maps nested deeper than %d", maxDepth)
		}
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		s := make([]any, 0, min(n, 64))
		for range n {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	}
	return d.DecodeInterface() // a scalar: strings and bytes are read as they come
}

package schema

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Token ids and log-probs are most of what planact encodes: a planner
// turn's trajectory is thousands of them, and so is every sample. The
// msgpack library encodes a slice element by element through reflection,
// looking each element's encoder up in a shared map; these loops write and
// read the same bytes directly (ints in their smallest form, floats as
// float64), several times faster.
func init() {
	msgpack.Register([]int(nil),
		func(e *msgpack.Encoder, v reflect.Value) error {
			if v.IsNil() {
				return e.EncodeNil()
			}
			s := v.Interface().([]int)
			buf := AppendArrayLen(make([]byte, 0, 5+3*len(s)), len(s))
			for _, x := range s {
				buf = appendInt(buf, int64(x))
			}
			_, err := e.Writer().Write(buf)
			return err
		},
		func(d *msgpack.Decoder, v reflect.Value) error {
			return decodeSlice(d, v, func(d *msgpack.Decoder) (int, error) {
				x, err := d.DecodeInt64()
				return int(x), err
			})
		})
	msgpack.Register([]float64(nil),
		func(e *msgpack.Encoder, v reflect.Value) error {
			if v.IsNil() {
				return e.EncodeNil()
			}
			s := v.Interface().([]float64)
			buf := AppendArrayLen(make([]byte, 0, 5+9*len(s)), len(s))
			for _, x := range s {
				buf = append(buf, 0xcb)
				buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(x))
			}
			_, err := e.Writer().Write(buf)
			return err
		},
		func(d *msgpack.Decoder, v reflect.Value) error {
			return decodeSlice(d, v, (*msgpack.Decoder).DecodeFloat64)
		})
	// Integer fields. The library stores a uint64 beyond int64 as a
	// negative number (2^64-1 became -1) and refuses any float; planact
	// refuses the first, saying so, and takes a float with no fraction as
	// the integer it is: JSON Schema's "integer" (schemas/) counts 4.0 as
	// one, and a Python or JavaScript trainer may well send 1.7e12.
	msgpack.Register(int(0), nil, decodeIntValue)
	msgpack.Register(int64(0), nil, decodeIntValue)
}

func decodeIntValue(d *msgpack.Decoder, v reflect.Value) error {
	n, err := decodeInt(d)
	if err != nil {
		return err
	}
	if v.OverflowInt(n) {
		return fmt.Errorf("%d does not fit a %s", n, v.Type())
	}
	v.SetInt(n)
	return nil
}

// decodeInt reads an integer: any msgpack integer that fits an int64, or a
// float that is a whole number within that range.
func decodeInt(d *msgpack.Decoder) (int64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch c {
	case msgpcode.Uint64:
		u, err := d.DecodeUint64()
		if err == nil && u > math.MaxInt64 {
			return 0, fmt.Errorf("the integer %d is beyond an int64", u)
		}
		return int64(u), err
	case msgpcode.Float, msgpcode.Double:
		f, err := d.DecodeFloat64()
		if err != nil {
			return 0, err
		}
		n, ok := wholeNumber(f)
		if !ok {
			return 0, fmt.Errorf("the float %v is not an integer", f)
		}
		return n, nil
	}
	return d.DecodeInt64()
}

// wholeNumber returns f as an int64 when it is a whole number an int64
// holds.
func wholeNumber(f float64) (int64, bool) {
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false // NaN and the infinities included
	}
	return int64(f), true
}

// decodeSlice decodes an array (or nil) into v, a []T, one element at a
// time with elem. The slice grows as elements come: a length the body
// cannot back is not allocated up front.
func decodeSlice[T any](d *msgpack.Decoder, v reflect.Value, elem func(*msgpack.Decoder) (T, error)) error {
	n, err := d.DecodeArrayLen()
	if err != nil || n == -1 {
		if err == nil {
			v.SetZero()
		}
		return err
	}
	s := make([]T, 0, min(n, maxPrealloc))
	for range n {
		x, err := elem(d)
		if err != nil {
			return err
		}
		s = append(s, x)
	}
	v.Set(reflect.ValueOf(s))
	return nil
}

// maxPrealloc bounds what a decoder allocates before the elements arrive.
const maxPrealloc = 1 << 16

// AppendArrayLen appends an array header, as msgpack.Encoder.EncodeArrayLen
// writes it.
func AppendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

// appendInt appends n in its smallest msgpack form, the bytes
// msgpack.Encoder.EncodeInt writes.
func appendInt(b []byte, n int64) []byte {
	switch {
	case n >= 0 && n <= math.MaxInt8:
		return append(b, byte(n))
	case n >= 0 && n <= math.MaxUint8:
		return append(b, 0xcc, byte(n))
	case n >= 0 && n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n >= 0 && n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	case n >= 0:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), uint64(n))
	case n >= -32:
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(n))
}

// Package schema defines every message and KV value planact puts on the bus,
// their msgpack encoding and their headers. A change to a message is a new
// version: readers accept the versions they know and reject the others.
package schema

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/fail"
)

// Header names every planact message carries (DESIGN §2).
const (
	HdrSchema      = "Planact-Schema"
	HdrRollout     = "Planact-Rollout"
	HdrEpisode     = "Planact-Episode"
	HdrTurn        = "Planact-Turn"
	HdrNode        = "Planact-Node"
	HdrRole        = "Planact-Role"
	HdrContentType = "Content-Type"
	HdrTraceparent = "traceparent"
	ContentType    = "application/msgpack"
	// ContentTypeJSON marks a JSON body, which planact takes on the
	// messages a trainer writes (UnmarshalTrainer).
	ContentTypeJSON = "application/json"
)

// Roles of the two training jobs.
const (
	RolePlanner = "planner"
	RoleActor   = "actor"
)

// Meta is what headers and subjects say about a message.
type Meta struct {
	Rollout int64
	Episode int // -1 if none
	Turn    int // 0 if none
	Node    string
	Role    string
}

// Message is implemented by every type published on the bus.
type Message interface {
	// Kind names the message kind and version, e.g. "act.run/1".
	Kind() string
	// Subject is where the message is published.
	Subject() string
	// MsgID is the deterministic Nats-Msg-Id that makes publishing idempotent.
	MsgID() string
	// Meta gives the header fields.
	Meta() Meta
}

// Envelope is embedded first in every message so that a body alone (what
// `nats sub --translate` sees) says what it is.
type Envelope struct {
	Schema string `json:"schema"`
}

func (e *Envelope) setSchema(s string) { e.Schema = s }
func (e *Envelope) schema() string     { return e.Schema }

type enveloped interface {
	setSchema(string)
	schema() string
}

// Marshal encodes v as msgpack, using the json tags as field names, and
// stamps its schema when v is a Message.
func Marshal(v any) ([]byte, error) {
	if m, ok := v.(Message); ok {
		if e, ok := v.(enveloped); ok {
			e.setSchema(m.Kind())
		}
	}
	buf := buffers.Get().(*bytes.Buffer)
	buf.Reset()
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	enc.SetCustomStructTag("json")
	enc.SetOmitEmpty(true)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	out := bytes.Clone(buf.Bytes())
	if buf.Cap() <= maxPooledBuffer {
		buffers.Put(buf)
	}
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return out, nil
}

// buffers are reused by Marshal: a body grows its buffer once, not at
// every encode.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer keeps a rare huge body's buffer out of the pool.
const maxPooledBuffer = 4 << 20

// decode decodes data into v (fields by their json names) with a decoder
// from msgpack's pool: every message read costs no decoder of its own.
// What v gets is its own (msgpack copies strings and bytes out of its
// buffers).
func decode(data []byte, v any) error {
	r := readers.Get().(*bytes.Reader)
	r.Reset(data)
	dec := msgpack.GetDecoder()
	dec.Reset(r)
	dec.SetCustomStructTag("json")
	err := dec.Decode(v)
	msgpack.PutDecoder(dec)
	r.Reset(nil)
	readers.Put(r)
	return err
}

var readers = sync.Pool{New: func() any { return new(bytes.Reader) }}

// Unmarshal decodes msgpack data into v. When v is a Message, the body's
// schema must be one this reader knows: same kind, same major version. An
// error names the field that could not be read, its value and what is
// wanted ("config.max_turns is the float 2.5: want an integer").
func Unmarshal(data []byte, v any) error {
	if _, ok := v.(trainerWritten); ok {
		// Whoever reads what a trainer wrote (a watcher of arrivals, say)
		// reads it as warily as the session-store does.
		if err := scanBody(data); err != nil {
			return fail.Invalidf("decode %s: %w", nameOf(v), explainMsgpack(data, v, err, false))
		}
	}
	if err := wantFields(data, v); err != nil {
		return fail.Invalidf("decode %s: %w", nameOf(v), err)
	}
	if err := decode(data, v); err != nil {
		return fail.Invalidf("decode %s: %w", nameOf(v), explainMsgpack(data, v, err, false))
	}
	return checkSchema(v)
}

// wantFields refuses a msgpack nil or array where v, a pointer to a
// struct, wants a map of fields: planact writes every struct as a map, and
// the decoder would take a nil for an empty value (a session, a role's
// state, a run holding nothing) and an array for fields in order.
func wantFields(data []byte, v any) error {
	if len(data) == 0 {
		return nil
	}
	if t := reflect.TypeOf(v); t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	switch c := data[0]; {
	case c == 0xc0:
		return errors.New("the body is nil: want a map of fields")
	case c >= 0x90 && c <= 0x9f || c == 0xdc || c == 0xdd:
		return errors.New("the body is an array: want a map of fields")
	}
	return nil
}

// nameOf names what is decoded into v in errors: its kind for a message.
func nameOf(v any) string {
	if m, ok := v.(Message); ok {
		return m.Kind()
	}
	return fmt.Sprintf("%T", v)
}

// checkSchema checks, when v is a Message, that the body it was decoded
// from declared v's kind.
func checkSchema(v any) error {
	m, ok := v.(Message)
	if !ok {
		return nil
	}
	e, ok := v.(enveloped)
	if !ok {
		return nil
	}
	if got, want := e.schema(), m.Kind(); got != want {
		if got == "" {
			return fail.Invalidf("decode %s: body has no schema field", want)
		}
		return fail.Invalidf("decode: body is %q, this reader understands %q", got, want)
	}
	return nil
}

// UnmarshalPart decodes the fields of a body of kind m that v has (a
// struct with the json names of those fields, Envelope embedded), skipping
// the rest: for a reader that needs little of a large message (the parser
// reads a planner output's text, not its token trajectory). The body's
// schema must be m's, as Unmarshal checks.
func UnmarshalPart[T any](data []byte, m Message, v *T) error {
	if err := decode(data, v); err != nil {
		return fail.Invalidf("decode %s: %w", m.Kind(), explainMsgpack(data, v, err, false))
	}
	e, ok := any(v).(enveloped)
	if !ok {
		return fail.Permanentf("decode %s: %T has no Envelope", m.Kind(), v)
	}
	if got := e.schema(); got != m.Kind() {
		if got == "" {
			return fail.Invalidf("decode %s: body has no schema field", m.Kind())
		}
		return fail.Invalidf("decode: body is %q, this reader understands %q", got, m.Kind())
	}
	return nil
}

// ToJSONable decodes any msgpack body into plain Go values (maps with string
// keys, slices, numbers), ready for encoding/json. It backs `planact decode`.
func ToJSONable(data []byte) (any, error) {
	v, err := msgpackTree(data)
	if err != nil {
		return nil, fail.Invalidf("not a msgpack body: %w", err)
	}
	return stringKeys(v), nil
}

func stringKeys(v any) any {
	switch t := v.(type) {
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = stringKeys(x)
		}
		return m
	case map[string]any:
		for k, x := range t {
			t[k] = stringKeys(x)
		}
		return t
	case []any:
		for i, x := range t {
			t[i] = stringKeys(x)
		}
		return t
	case []byte:
		return string(t)
	}
	return v
}

// KindOf returns the schema a body declares, without decoding the rest.
func KindOf(data []byte) (string, error) {
	var e Envelope
	if err := decode(data, &e); err != nil {
		return "", fail.Invalidf("not a planact body: %w", err)
	}
	if e.Schema == "" || !strings.Contains(e.Schema, "/") {
		return "", fail.Invalidf("body has no schema field")
	}
	return e.Schema, nil
}

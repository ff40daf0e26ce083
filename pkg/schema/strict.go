package schema

import (
	"bytes"
	"fmt"
	"mime"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/fail"
)

// UnmarshalStrict decodes a message a trainer wrote, as Unmarshal does, and
// rejects a body that carries a field the message does not have, naming it
// with its path ("config.max_turn", "tasks[3].lable"): a misspelt field must
// be an error, not a default. Free-form maps (a task's metadata) may hold
// anything keyed by strings. A value of the wrong type is named the same
// way ("config.max_turns is the string "4": want an integer"), and so are
// an array where fields are wanted ("config is an array of 0: want a map
// of fields"), a key given twice in one map, and a value out of the bounds
// the schema states (a negative at_ms or group_index, an empty prompt).
func UnmarshalStrict(data []byte, v Message) error {
	return unmarshalStrict(data, v, v.Kind())
}

// UnmarshalValueStrict is UnmarshalStrict for a value that is not a message
// (a task list in the object store); what names it in errors.
func UnmarshalValueStrict(data []byte, v any, what string) error {
	return unmarshalStrict(data, v, what)
}

func unmarshalStrict(data []byte, v any, what string) error {
	if err := decodeStrict(data, v); err != nil {
		return fail.Invalidf("decode %s: %w", what, explainMsgpack(data, v, err, true))
	}
	return checkRead(v, what)
}

// checkRead checks what a trainer's body was decoded into: its schema (a
// message's), then the bounds of its values (bounded).
func checkRead(v any, what string) error {
	if err := checkSchema(v); err != nil {
		return err
	}
	if b, ok := v.(bounded); ok {
		if err := b.checkBounds(); err != nil {
			return fail.Invalidf("decode %s: %w", what, err)
		}
	}
	return nil
}

// decodeStrict decodes msgpack data into v, refusing fields v does not have
// and bytes after the body; the body is scanned first (scanBody), so that
// what it claims is not allocated before it is read, and its shape checked
// (checkShape: no array for a struct, no key twice in a map). Its decoding
// errors name no field: explain finds it.
func decodeStrict(data []byte, v any) error {
	if err := scanBody(data); err != nil {
		return err
	}
	if err := checkShape(data, reflect.TypeOf(v)); err != nil {
		return err
	}
	r := bytes.NewReader(data)
	dec := msgpack.NewDecoder(r)
	dec.SetCustomStructTag("json")
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(v); err != nil {
		return err
	}
	if r.Len() > 0 {
		return fmt.Errorf("%d bytes left after the first value", r.Len())
	}
	return nil
}

// UnmarshalTrainer decodes a message a trainer wrote (an arrival, a cancel,
// a pause, a resume), given the headers it came with: msgpack, or JSON
// where its Content-Type header says application/json, both as strictly as
// UnmarshalStrict (unknown fields and values of the wrong type named by
// their path). A JSON body says what msgpack says: numbers, strings,
// booleans, arrays and maps, with the field names of the schema.
func UnmarshalTrainer(data []byte, h map[string][]string, v Message) error {
	ct := header(h, HdrContentType)
	switch mediaType(ct) {
	case "", ContentType, "application/x-msgpack", "application/vnd.msgpack":
		return UnmarshalStrict(data, v)
	case ContentTypeJSON:
		return unmarshalJSON(data, v)
	}
	return fail.Invalidf("decode %s: %s %q: planact reads %s (the default) or, from a trainer, %s",
		v.Kind(), HdrContentType, ct, ContentType, ContentTypeJSON)
}

// unmarshalJSON decodes a JSON body by way of the msgpack it stands for, so
// that it meets exactly the rules a msgpack body meets; what is wrong is
// blamed on the JSON as it was written.
func unmarshalJSON(data []byte, v Message) error {
	body, err := jsonTree(data)
	if err != nil {
		return fail.Invalidf("decode %s (%s: %s): %w", v.Kind(), HdrContentType, ContentTypeJSON, err)
	}
	if err := schemaMismatch(body, v); err != nil {
		return fail.Invalidf("decode %s: %w", v.Kind(), err)
	}
	if c := culprit(body, reflect.TypeOf(v), "", true); c != nil {
		return fail.Invalidf("decode %s: %w", v.Kind(), c)
	}
	// Integers in their smallest form, as msgpack clients write them: a
	// task's metadata reads the same from JSON as from msgpack.
	var packed bytes.Buffer
	enc := msgpack.NewEncoder(&packed)
	enc.UseCompactInts(true)
	if err := enc.Encode(fromJSON(body)); err != nil {
		return fail.Invalidf("decode %s: %w", v.Kind(), err)
	}
	if err := decodeStrict(packed.Bytes(), v); err != nil {
		return fail.Invalidf("decode %s: %w", v.Kind(), err)
	}
	return checkRead(v, v.Kind())
}

// mediaType is a Content-Type without its parameters, lower case; "" for
// none, or for one that cannot be read (then refused as given).
func mediaType(ct string) string {
	if strings.TrimSpace(ct) == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return "unreadable"
	}
	return mt
}

// header returns the first value of header name in h, its name matched
// without regard to case (NATS headers keep the case they were sent in).
func header(h map[string][]string, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// jsonFields maps the json names of t's fields (embedded structs' included)
// to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for k, ft := range jsonFields(f.Type) {
				out[k] = ft
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// bounded is what a trainer writes whose values have bounds its schema
// states beyond their types (minimum 0, minLength 1): checked as it is
// read, so that a trainer learns of a negative group_index from the
// refusal, not from a rollout that went wrong.
type bounded interface{ checkBounds() error }

func (m *Arrive) checkBounds() error {
	if err := notNegative("rollout", m.Rollout, "a rollout id"); err != nil {
		return err
	}
	if err := notNegative("at_ms", m.AtMs, "unix milliseconds"); err != nil {
		return err
	}
	if err := weightVersionFits(m.WeightVersion); err != nil {
		return err
	}
	return ValidateTasks(m.Tasks)
}

// weightVersionFits refuses a weight_version longer than MaxWeightVersion:
// planact repeats a role's version in answers and rollbacks on CONTROL,
// which takes small messages only.
func weightVersionFits(v string) error {
	if len(v) > MaxWeightVersion {
		return fail.Invalidf("weight_version %s: want at most %d bytes", quoteShort(v), MaxWeightVersion)
	}
	return nil
}

func (m *Cancel) checkBounds() error {
	if err := notNegative("rollout", m.Rollout, "a rollout id"); err != nil {
		return err
	}
	return notNegative("at_ms", m.AtMs, "unix milliseconds")
}

func (m *Pause) checkBounds() error { return notNegative("at_ms", m.AtMs, "unix milliseconds") }
func (m *Resume) checkBounds() error {
	if err := notNegative("at_ms", m.AtMs, "unix milliseconds"); err != nil {
		return err
	}
	return weightVersionFits(m.WeightVersion)
}

func (m *TaskList) checkBounds() error { return ValidateTasks(m.Tasks) }

// ValidateTasks says what is wrong with the first task of a list that
// breaks the bounds of the task schema (defs.v1.schema.json#/$defs/task),
// naming it by its path: a negative group_index or index, an empty or
// missing prompt. Every task list a rollout runs is checked with it,
// inline in an arrival or in the object store.
func ValidateTasks(tasks []Task) error {
	for i, t := range tasks {
		switch {
		case t.GroupIndex < 0:
			return fail.E(fail.Invalid, &fieldError{fmt.Sprintf("tasks[%d].group_index", i), int64(t.GroupIndex), "an integer from 0"})
		case t.Index < 0:
			return fail.E(fail.Invalid, &fieldError{fmt.Sprintf("tasks[%d].index", i), int64(t.Index), "an integer from 0"})
		case t.Prompt == "":
			return fail.Invalidf("tasks[%d].prompt is empty or missing: want the task's prompt (1 character at least)", i)
		}
	}
	return nil
}

// notNegative refuses a negative n at path, which wants what, from 0.
func notNegative(path string, n int64, what string) error {
	if n < 0 {
		return &fieldError{path, n, what + " from 0"}
	}
	return nil
}

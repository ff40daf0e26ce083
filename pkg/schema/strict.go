package schema

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/planact/planact/pkg/fail"
)

// UnmarshalStrict decodes a message a trainer wrote, as Unmarshal does, and
// rejects a body that carries a field the message does not have, naming it
// with its path ("config.max_turn", "tasks[3].lable"): a misspelt field must
// be an error, not a default. Free-form maps (a task's metadata) may hold
// anything.
func UnmarshalStrict(data []byte, v Message) error {
	if err := Unmarshal(data, v); err != nil {
		return err
	}
	return checkFields(data, v, v.Kind())
}

// UnmarshalValueStrict is UnmarshalStrict for a value that is not a message
// (a task list in the object store); what names it in errors.
func UnmarshalValueStrict(data []byte, v any, what string) error {
	if err := Unmarshal(data, v); err != nil {
		return err
	}
	return checkFields(data, v, what)
}

func checkFields(data []byte, v any, what string) error {
	raw, err := ToJSONable(data)
	if err != nil {
		return err
	}
	if path := unknownField(raw, reflect.TypeOf(v), ""); path != "" {
		return fail.Invalidf("decode %s: unknown field %q", what, path)
	}
	return nil
}

// unknownField returns the path of the first field of v (in sorted order)
// that type t does not have, or "".
func unknownField(v any, t reflect.Type, path string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return ""
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
				return join(path, k)
			}
			if p := unknownField(m[k], ft, join(path, k)); p != "" {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		items, ok := v.([]any)
		if !ok {
			return ""
		}
		for i, x := range items {
			if p := unknownField(x, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok || t.Elem().Kind() == reflect.Interface {
			return "" // free-form
		}
		for k, x := range m {
			if p := unknownField(x, t.Elem(), join(path, k)); p != "" {
				return p
			}
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

package schema_test

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/planact/planact/pkg/schema"
)

// TestMetaInt: a number in decoded metadata reads back whatever type the
// codec gave it; anything else is no number.
func TestMetaInt(t *testing.T) {
	for _, want := range []int{0, 7, 300, 70000, 1 << 40, -3} {
		data, err := msgpack.Marshal(map[string]any{"n": want})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		if got, ok := schema.MetaInt(m["n"]); !ok || got != want {
			t.Errorf("%d decoded as %T: MetaInt = %d, %v", want, m["n"], got, ok)
		}
	}
	if got, ok := schema.MetaInt(float64(4)); !ok || got != 4 {
		t.Errorf("float64(4): %d, %v", got, ok)
	}
	for _, v := range []any{nil, "4", true} {
		if _, ok := schema.MetaInt(v); ok {
			t.Errorf("%#v read as a number", v)
		}
	}
}

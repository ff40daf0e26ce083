package session

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/fail"
	"github.com/planact/planact/pkg/schema"
)

// listedTask reads what schema.Task has, field for field: a field added to
// a task must be added here, or every task list carrying it is refused.
func TestListedTaskHasTheFieldsOfATask(t *testing.T) {
	fields := func(typ reflect.Type) map[string]string {
		out := map[string]string{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			out[f.Tag.Get("json")] = f.Name
		}
		return out
	}
	if got, want := fields(reflect.TypeFor[listedTask]()), fields(reflect.TypeFor[schema.Task]()); !reflect.DeepEqual(got, want) {
		t.Errorf("listedTask's fields %v, schema.Task's %v", got, want)
	}
	if got, want := fields(reflect.TypeFor[taskList]()), fields(reflect.TypeFor[schema.TaskList]()); !reflect.DeepEqual(got, want) {
		t.Errorf("taskList's fields %v, schema.TaskList's %v", got, want)
	}
}

// A task list in the object store is read whole, checked as strictly as
// before, and kept without the tasks' metadata (which no service reads).
func TestLoadTasksFromTheObjectStore(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "t")
	ctx := context.Background()
	put := func(n int64, body []byte) {
		t.Helper()
		name := "list-" + strings.Repeat("x", int(n))
		if _, err := b.Tasks[schema.RolePlanner].PutBytes(ctx, name, body); err != nil {
			t.Fatal(err)
		}
		tl := &schema.TaskList{Object: name, From: schema.RolePlanner, Digest: schema.DigestSHA256 + bus.SHA256(body)}
		if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(n), tl); err != nil {
			t.Fatal(err)
		}
	}
	enc := func(v any) []byte {
		t.Helper()
		data, err := schema.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	want := []schema.Task{
		{GroupIndex: 0, Index: 0, Prompt: "capital of Peru?", Label: "Lima", Metadata: map[string]any{"source": "geo", "tags": []any{"a", map[string]any{"b": 1}}}},
		{GroupIndex: 0, Index: 1, Prompt: "capital of Peru?", Label: "Lima"},
	}
	put(1, enc(&schema.TaskList{Tasks: want}))
	got, found, err := LoadTasks(ctx, b.Sessions, b.NC, 1)
	if err != nil || !found || len(got) != 2 {
		t.Fatalf("LoadTasks: %v, %v, %v", got, found, err)
	}
	for i := range want {
		w := want[i]
		w.Metadata = nil
		if !reflect.DeepEqual(got[i], w) {
			t.Errorf("task %d: %+v, want %+v", i, got[i], w)
		}
	}

	// Refused as before: a field a task does not have, metadata that is
	// not a map.
	put(2, enc(map[string]any{"tasks": []any{map[string]any{"prompt": "?", "lable": "x"}}}))
	put(3, enc(map[string]any{"tasks": []any{map[string]any{"prompt": "?", "metadata": "not a map"}}}))
	for n, wantErr := range map[int64]string{2: `"tasks[0].lable"`, 3: "metadata"} {
		_, _, err := LoadTasks(ctx, b.Sessions, b.NC, n)
		if err == nil || !strings.Contains(err.Error(), wantErr) || fail.KindOf(err) == fail.Transient {
			t.Errorf("list %d: %v, want an error naming %s", n, err, wantErr)
		}
	}

	// An object that is gone is said so.
	if _, err := bus.Create(ctx, b.Sessions, schema.TasksKey(4), &schema.TaskList{Object: "never-put", From: schema.RolePlanner, Digest: schema.DigestSHA256 + strings.Repeat("0", 64)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadTasks(ctx, b.Sessions, b.NC, 4); err == nil || !strings.Contains(err.Error(), "is gone") || errors.Is(err, context.Canceled) {
		t.Errorf("a list whose object is gone: %v", err)
	}
}

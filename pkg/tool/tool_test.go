package tool_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/tool"
)

// once registers the test's own entry once per process.
var once sync.Once

func TestRegister(t *testing.T) {
	once.Do(func() { // -count=N runs the test N times in one process
		tool.Register("upper-test", func(_ context.Context, in string) (string, error) { return strings.ToUpper(in), nil })
	})
	fn, ok := tool.Lookup("upper-test")
	if !ok {
		t.Fatal("registered tool not found")
	}
	if out, err := fn(context.Background(), "paris"); err != nil || out != "PARIS" {
		t.Errorf("upper-test(paris) = %q, %v", out, err)
	}
	if _, ok := tool.Lookup("missing"); ok {
		t.Error("an unregistered tool was found")
	}
	for name, fn := range map[string]tool.Func{
		"upper-test": func(context.Context, string) (string, error) { return "", nil }, // twice
		"web search": func(context.Context, string) (string, error) { return "", nil }, // a name no config can declare
		"nil-func":   nil,
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", name)
				}
			}()
			tool.Register(name, fn)
		}()
	}
	if got := tool.Registered(); len(got) != 1 || got[0] != "upper-test" {
		t.Errorf("registered %v", got)
	}
}

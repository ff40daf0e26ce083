package reward_test

import (
	"context"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/reward"
)

// once registers the test's own entry once per process.
var once sync.Once

func TestRegister(t *testing.T) {
	once.Do(func() { // -count=N runs the test N times in one process
		reward.Register("length-test", func(_ context.Context, _, answer, _ string) (float64, error) { return float64(len(answer)), nil })
	})
	fn, ok := reward.Lookup("length-test")
	if !ok {
		t.Fatal("registered reward not found")
	}
	if v, err := fn(context.Background(), "q", "Paris", "Paris"); err != nil || v != 5 {
		t.Errorf("length-test = %v, %v", v, err)
	}
	for _, name := range []string{"f1", "em", "length-test", "Bad Name", "http://x"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", name)
				}
			}()
			reward.Register(name, func(context.Context, string, string, string) (float64, error) { return 0, nil })
		}()
	}
}

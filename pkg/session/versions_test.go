package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/fail"
)

// askFunc answers WeightVersion, counting the questions.
type askFunc struct {
	v     string
	err   error
	asked int
}

func (a *askFunc) WeightVersion(context.Context) (string, error) {
	a.asked++
	return a.v, a.err
}

// TestCheck: staleness is decided on what the engine says it serves now;
// what it cannot say is said, never assumed.
func TestCheck(t *testing.T) {
	notSupported := fail.E(fail.Permanent, fmt.Errorf("sglang weight version: %w", engine.ErrNotSupported))
	for _, tc := range []struct {
		name      string
		newest    string
		max       int
		engine    askFunc
		asked     int
		stale     bool
		unchecked string // a part of it
		failed    bool
	}{
		{"no bound", "step-9", 0, askFunc{v: "step-1"}, 0, false, "", false},
		{"within the bound", "step-9", 2, askFunc{v: "step-7"}, 1, false, "", false},
		{"past the bound", "step-9", 2, askFunc{v: "step-6"}, 1, true, "", false},
		{"ahead of the trainer", "step-9", 1, askFunc{v: "step-12"}, 1, false, "", false},
		{"the engine cannot say", "step-9", 1, askFunc{err: notSupported}, 1, false, "cannot say which weights it serves", false},
		{"the engine names none", "step-9", 1, askFunc{}, 1, false, "names no weight version", false},
		{"no number", "step-9", 1, askFunc{v: "default"}, 1, false, `"default"`, false},
		{"no trainer version", "", 1, askFunc{v: "step-1"}, 0, false, "announced no weight version", false},
		{"the engine does not answer", "step-9", 1, askFunc{err: fail.Transientf("connection refused")}, 1, false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newest := func(context.Context) (string, error) { return tc.newest, nil }
			unchecked, err := Check(context.Background(), &tc.engine, newest, tc.max)
			var stale *StaleError
			if tc.engine.asked != tc.asked || errors.As(err, &stale) != tc.stale || (tc.stale && fail.KindOf(err) != fail.Permanent) ||
				(err != nil && !tc.stale) != tc.failed || (tc.failed && !fail.IsRetryable(err)) ||
				(tc.unchecked == "") != (unchecked == "") || !strings.Contains(unchecked, tc.unchecked) {
				t.Errorf("Check = %q, %v after %d questions; want stale %v, failed %v, unchecked %q, %d questions",
					unchecked, err, tc.engine.asked, tc.stale, tc.failed, tc.unchecked, tc.asked)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRunRefuses checks the arguments that are refused before anything is
// built or started.
func TestRunRefuses(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"explode"}, `unknown command "explode"`},
		{[]string{"chaos", "--topology", "mesh"}, `--topology "mesh"`},
		{[]string{"soak", "--topology", "mesh"}, `--topology "mesh"`},
		{[]string{"chaos", "--kinds", "kill:everything"}, `no fault "kill:everything"`},
		{[]string{"chaos", "extra"}, "unexpected arguments"},
		{[]string{"soak", "--no-such-flag"}, "not defined"},
		// A number a run cannot take is refused, not replaced by a default.
		{[]string{"chaos", "--faults", "-1"}, "--faults -1"},
		{[]string{"chaos", "--tasks", "0"}, "--tasks 0"},
		{[]string{"chaos", "--samples-per-prompt", "-2"}, "--samples-per-prompt -2"},
		{[]string{"chaos", "--concurrency", "0"}, "--concurrency 0"},
		{[]string{"chaos", "--rollouts", "0"}, "--rollouts 0"},
		{[]string{"chaos", "--duration", "0s"}, "--duration 0s"},
		{[]string{"chaos", "--rollout-timeout", "-1s"}, "--rollout-timeout -1s"},
		{[]string{"chaos", "--act-timeout", "0s"}, "--act-timeout 0s"},
		{[]string{"soak", "--interval", "0s"}, "--interval 0s"},
		{[]string{"soak", "--tasks", "0"}, "--tasks 0"},
		// Kinds none of which is a fault of the topology would run it with
		// no fault at all, or with every kind.
		{[]string{"chaos", "--topology", "single", "--kinds", "kill:nats-meta-leader"}, "none is a fault of the single topology"},
		{[]string{"chaos", "--kinds", "restart:nats-cluster"}, "none is a fault of the single topology"},
	}
	// Cancelled: an argument that is let through fails on the build
	// rather than start a run.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(ctx, tc.args, func(string) string { return "" }, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one that says %q", err, tc.want)
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"help"}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"chaos", "soak"} {
		if !strings.Contains(out.String(), "planact-chaos "+cmd) {
			t.Errorf("usage does not name %s:\n%s", cmd, out.String())
		}
	}
}

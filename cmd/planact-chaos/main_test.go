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
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errOut)
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

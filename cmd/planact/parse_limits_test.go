package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestParseLimitsRefused: a limit of 0 or less is refused naming its flag;
// the parser took it for its default and parsed as if none was given.
func TestParseLimitsRefused(t *testing.T) {
	const plan = "<graph>\n<node id=\"a\" tool=\"search\">capital of France</node>\n<node id=\"b\" tool=\"search\" deps=\"a\">population of {a}</node>\n</graph>\n"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-nodes", "0"}, "parse: --max-nodes 0: want at least 1"},
		{[]string{"--max-nodes", "-5"}, "parse: --max-nodes -5: want at least 1"},
		{[]string{"--max-depth", "0"}, "parse: --max-depth 0: want at least 1"},
		{[]string{"--max-arg-bytes", "0"}, "parse: --max-arg-bytes 0: want at least 1"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"parse"}, c.args...), noenv, strings.NewReader(plan), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %v: %v, want an error naming %s\n%s", c.args, err, c.want, out.String())
		}
	}
	// What is meant still goes, and a limit given is the limit.
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"parse", "--max-nodes", "2", "--max-depth", "2"}, noenv, strings.NewReader(plan), &out, &errOut); err != nil {
		t.Fatalf("parse: %v\n%s%s", err, out.String(), errOut.String())
	}
	out.Reset()
	err := run(context.Background(), []string{"parse", "--max-nodes", "1"}, noenv, strings.NewReader(plan), &out, &errOut)
	if err == nil || !strings.Contains(out.String(), "too_many_nodes") {
		t.Errorf("parse --max-nodes 1: %v\n%s", err, out.String())
	}
}

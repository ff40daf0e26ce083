package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/plan"
)

const diamondPlan = `<graph>
<node id="s1">search("capital of France")</node>
<node id="s2" depends="s1">search("population of {s1}")</node>
<node id="s3" depends="s1">search("area of {s1}")</node>
<node id="s4" depends="s2,s3">math("{s2} / {s3}")</node>
</graph>`

func TestParseCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plan.txt")
	if err := os.WriteFile(file, []byte(diamondPlan), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		stdin    string
		wantErr  bool
		wantKind plan.ErrorKind // for errors printed as JSON
		check    func(t *testing.T, out string)
	}{
		{name: "stdin json", stdin: diamondPlan, check: func(t *testing.T, out string) {
			var got struct {
				Format       plan.Format `json:"format"`
				Plan         *plan.Plan  `json:"plan"`
				Levels       [][]string  `json:"levels"`
				CriticalPath []string    `json:"critical_path"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if got.Format != plan.FormatGraph || len(got.Plan.Nodes) != 4 {
				t.Errorf("got %+v", got)
			}
			if !reflect.DeepEqual(got.Levels, [][]string{{"s1"}, {"s2", "s3"}, {"s4"}}) ||
				!reflect.DeepEqual(got.CriticalPath, []string{"s1", "s2", "s4"}) {
				t.Errorf("levels %v, critical path %v", got.Levels, got.CriticalPath)
			}
		}},
		{name: "file dot", args: []string{"--dot", file}, check: func(t *testing.T, out string) {
			if !strings.HasPrefix(out, "digraph plan {") || !strings.Contains(out, `"s2" -> "s4";`) {
				t.Errorf("DOT:\n%s", out)
			}
		}},
		{name: "answer", stdin: "<answer>Paris | 2.1M</answer>", check: func(t *testing.T, out string) {
			if !strings.Contains(out, `"answers": [`) || !strings.Contains(out, `"2.1M"`) {
				t.Errorf("out:\n%s", out)
			}
		}},
		{name: "forced format", args: []string{"--format", "numbered"}, stdin: diamondPlan, wantErr: true, wantKind: plan.ErrSyntax},
		{name: "unknown tool", args: []string{"--tools", "search, wiki"}, stdin: diamondPlan, wantErr: true, wantKind: plan.ErrUnknownTool},
		{name: "limits", args: []string{"--max-depth", "2"}, stdin: diamondPlan, wantErr: true, wantKind: plan.ErrTooDeep},
		{name: "cycle", stdin: `<graph><node id="a" depends="b">x</node><node id="b" depends="a">y</node></graph>`, wantErr: true, wantKind: plan.ErrCycle,
			check: func(t *testing.T, out string) {
				if !strings.Contains(out, `"message": "plan has a cycle: a -> b -> a`) {
					t.Errorf("out:\n%s", out)
				}
			}},
		{name: "answer mentioned in a plan", stdin: "I will give the result in <answer> tags.\n" + diamondPlan, check: func(t *testing.T, out string) {
			if !strings.Contains(out, `"format": "graph"`) || strings.Contains(out, `"answers"`) {
				t.Errorf("out:\n%s", out)
			}
		}},
		{name: "stop string stripped", args: []string{"--stop", "</answer>"}, stdin: "I know it.\n<answer>Paris", check: func(t *testing.T, out string) {
			if !strings.Contains(out, `"Paris"`) {
				t.Errorf("out:\n%s", out)
			}
		}},
		{name: "answer never closed", stdin: "I know it.\n<answer>Paris", wantErr: true, wantKind: plan.ErrSyntax},
		{name: "placeholder naming no step", stdin: "1. search(\"a\")\n2. search(\"b $7\")\n3. join()", wantErr: true, wantKind: plan.ErrBadPlaceholder},
		{name: "missing file", args: []string{filepath.Join(t.TempDir(), "nope")}, wantErr: true},
		{name: "bad flag", args: []string{"--bogus"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runParse(context.Background(), tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v; stderr: %s", err, tt.wantErr, stderr.String())
			}
			if tt.wantKind != "" {
				var pe *plan.Error
				if !errors.As(err, &pe) || pe.Kind != tt.wantKind {
					t.Fatalf("err = %v, want kind %s", err, tt.wantKind)
				}
				var printed plan.Error
				if err := json.Unmarshal(stdout.Bytes(), &printed); err != nil || printed.Kind != tt.wantKind || printed.Message != pe.Message {
					t.Errorf("stdout %q does not hold the error (%v)", stdout.String(), err)
				}
			}
			if tt.check != nil {
				tt.check(t, stdout.String())
			}
		})
	}
}

// TestParseCommandStops: the command's context (cancelled by Ctrl-C or
// SIGTERM in main) stops a long parse at once, with the context's error.
func TestParseCommandStops(t *testing.T) {
	var b strings.Builder
	b.WriteString("<graph>\n")
	for i := 0; b.Len() < 8<<20; i++ {
		fmt.Fprintf(&b, "<node id=\"s%d\">search(capital{}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}\n<tool%d>", i, i)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, ctx := range map[string]context.Context{
		"before the parse": cancelled,
		"during the parse": &endsLater{Context: context.Background(), looks: 5},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runParse(ctx, nil, strings.NewReader(b.String()), &stdout, &stderr)
			var pe *plan.Error
			if !errors.Is(err, context.Canceled) || errors.As(err, &pe) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if stdout.Len() != 0 {
				t.Errorf("printed %q for a stopped parse", stdout.String())
			}
		})
	}
}

// endsLater is a context that ends once its Err has been asked looks
// times: a signal that arrives in the middle of a parse, without a clock.
type endsLater struct {
	context.Context
	looks int
}

func (c *endsLater) Done() <-chan struct{} { return make(chan struct{}) }

func (c *endsLater) Err() error {
	if c.looks <= 0 {
		return context.Canceled
	}
	c.looks--
	return nil
}

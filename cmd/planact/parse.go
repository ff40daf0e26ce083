package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/planact/planact/pkg/plan"
)

// maxPlanBytes bounds what planact parse reads: far more than any planner
// writes in one turn.
const maxPlanBytes = 16 << 20

// parseOutput is what planact parse prints for a plan or an answer.
type parseOutput struct {
	plan.Result
	Levels       [][]string `json:"levels,omitempty"`
	CriticalPath []string   `json:"critical_path,omitempty"`
}

// runParse implements `planact parse [--format f] [--dot] [--tools a,b] [file]`:
// it parses a planner output from file (or stdin) and prints the Result as
// indented JSON with its levels and critical path, or the plan as Graphviz
// DOT. A parse error is printed as JSON on stdout and returned. The parse
// stops when ctx ends (Ctrl-C, SIGTERM), whatever the input.
func runParse(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("parse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	format := fs.String("format", "auto", "plan format: auto, graph, tasklist, json, numbered, steps or answer")
	dot := fs.Bool("dot", false, "print the plan as Graphviz DOT instead of JSON")
	tools := fs.String("tools", "", "comma-separated known tool names (default: accept any tool)")
	defaultTool := fs.String("default-tool", plan.DefaultTool, "tool of tasks that name none")
	maxNodes := fs.Int("max-nodes", plan.DefaultMaxNodes, "maximum nodes in a plan")
	maxDepth := fs.Int("max-depth", plan.DefaultMaxDepth, "maximum length of a dependency chain, in nodes")
	maxArg := fs.Int("max-arg-bytes", plan.DefaultMaxArgBytes, "maximum size of one argument value")
	stop := fs.String("stop", "", "comma-separated stop strings the engine stopped on and stripped (as the plan-parser passes them), e.g. </answer>")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact parse [--format f] [--dot] [--tools a,b] [file]   (reads stdin without a file)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		fs.Usage()
		return errors.New("parse: at most one file")
	}
	// The parser takes 0 for "the default": a 0 given was a mistake, and
	// a negative one no limit.
	for _, l := range []struct {
		name string
		v    int
	}{{"max-nodes", *maxNodes}, {"max-depth", *maxDepth}, {"max-arg-bytes", *maxArg}} {
		if l.v < 1 {
			return fmt.Errorf("parse: --%s %d: want at least 1", l.name, l.v)
		}
	}
	in := stdin
	if fs.NArg() == 1 {
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			return fmt.Errorf("parse: %w", err)
		}
		defer f.Close()
		in = f
	}
	data, err := readAll(ctx, io.LimitReader(in, maxPlanBytes+1))
	switch {
	case errors.Is(err, errStopped):
		return fmt.Errorf("parse: %w", ctx.Err())
	case err != nil:
		return fmt.Errorf("parse: read: %w", err)
	}
	if len(data) > maxPlanBytes {
		return fmt.Errorf("parse: input larger than %d bytes", maxPlanBytes)
	}
	opts := plan.Options{
		Format:      plan.Format(*format),
		DefaultTool: *defaultTool,
		MaxNodes:    *maxNodes,
		MaxDepth:    *maxDepth,
		MaxArgBytes: *maxArg,
	}
	for _, t := range strings.Split(*tools, ",") {
		if t = strings.TrimSpace(t); t != "" {
			opts.Tools = append(opts.Tools, t)
		}
	}
	for _, s := range strings.Split(*stop, ",") {
		if s != "" {
			opts.Stop = append(opts.Stop, s)
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	r, err := plan.ParseContext(ctx, string(data), opts)
	var pe *plan.Error
	if errors.As(err, &pe) {
		if werr := enc.Encode(pe); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if *dot && r.Plan != nil {
		_, err := io.WriteString(stdout, r.Plan.DOT())
		return err
	}
	out := parseOutput{Result: r}
	if r.Plan != nil {
		out.Levels = r.Plan.Levels()
		out.CriticalPath, _ = r.Plan.CriticalPath(nil)
	}
	return enc.Encode(out)
}

// errStopped is what readAll returns when its context ended first.
var errStopped = errors.New("stopped before the end of the input")

// readAll reads r to its end, or until ctx ends (then it returns
// errStopped): a terminal or a pipe that stays open must not keep a
// command from stopping when it is told to. The read is left to finish in
// the background (the process is about to exit).
func readAll(ctx context.Context, r io.Reader) ([]byte, error) {
	type read struct {
		data []byte
		err  error
	}
	done := make(chan read, 1)
	go func() {
		data, err := io.ReadAll(r)
		done <- read{data, err}
	}()
	select {
	case rd := <-done:
		return rd.data, rd.err
	case <-ctx.Done():
		return nil, errStopped
	}
}

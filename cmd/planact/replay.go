package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/internal/replay"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/engine"
)

// errDifferent is what replay returns when the replay differed from the
// recording (exit status 1, after the report).
var errDifferent = errors.New("the replay differs from the recording")

// runReplay runs a recorded rollout (or one episode) again through today's
// planact with the recorded engine outputs in place of the engines, and
// reports every difference; or writes the recording (--record); or asks
// another planner the episodes' first prompts (--planner).
func runReplay(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn bus.ConnOptions
	conn.AddFlags(fs, "")
	from := fs.String("from", "", "replay the recording in this file (as --record writes it; testdata/replay holds some) instead of the server's streams")
	record := fs.String("record", "", "write the rollout's recording to this file and stop (replay it later with --from)")
	planner := fs.String("planner", "", "ask the planner engine at this URL each episode's first prompt (or the named episode's), and show its answer beside the recorded one, both parsed by today's plan-parser")
	protocol := fs.String("planner-protocol", engine.ProtocolSGLang, "the --planner engine's protocol: "+strings.Join(engine.Protocols, ", "))
	model := fs.String("planner-model", "", "the model name the --planner engine wants (OpenAI protocols)")
	asJSON := fs.Bool("json", false, "print the report (or the side-by-side answers) as JSON")
	verbose := fs.Bool("v", false, "log what the replay's services do (stderr)")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the replay (and on reading the streams)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: planact replay [flags] <rollout> [episode]\n       planact replay [flags] --from FILE [episode]")
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	var n int64 = -1
	if *from == "" {
		if len(pos) < 1 || len(pos) > 2 {
			fs.Usage()
			return fmt.Errorf("replay: name a rollout, and optionally one of its episodes (or --from FILE)")
		}
		if n, err = strconv.ParseInt(pos[0], 10, 64); err != nil || n < 0 {
			return fmt.Errorf("replay: rollout %q: want a rollout id (a number ≥ 0)", pos[0])
		}
		pos = pos[1:]
	} else if len(pos) > 1 {
		fs.Usage()
		return fmt.Errorf("replay: with --from, name at most an episode")
	}
	var episodes []int
	if len(pos) == 1 {
		e, err := strconv.Atoi(pos[0])
		if err != nil || e < 0 {
			return fmt.Errorf("replay: episode %q: want an episode index (a number ≥ 0)", pos[0])
		}
		episodes = []int{e}
	}
	switch {
	case *timeout <= 0:
		return fmt.Errorf("replay: --timeout %v: want a positive duration", *timeout)
	case *record != "" && *from != "":
		return fmt.Errorf("replay: --record writes what the server's streams hold; --from reads a file: one or the other")
	case *record != "" && *planner != "":
		return fmt.Errorf("replay: --record and --planner: one at a time")
	case *planner == "" && (*protocol != engine.ProtocolSGLang || *model != ""):
		return fmt.Errorf("replay: --planner-protocol and --planner-model go with --planner")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var rec *replay.Recording
	if *from != "" {
		if rec, err = replay.LoadFile(*from); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
	} else {
		if conn, err = conn.Resolve(getenv); err != nil {
			return err
		}
		nc, err := conn.Dial("planact-replay")
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		defer nc.Close()
		if err := planactThere(ctx, nc, n, "planner"); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if rec, err = replay.Record(ctx, nc, n); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
	}
	if *record != "" {
		if err := rec.SaveFile(*record); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		fmt.Fprintf(stdout, "rollout %d recorded in %s: %d episodes (replay it with planact replay --from %s)\n", rec.Rollout, *record, len(rec.Episodes), *record)
		return nil
	}
	if *planner != "" {
		other, err := engine.NewClient(*protocol, *planner, engine.Options{Model: *model})
		if err != nil {
			return fmt.Errorf("replay: --planner: %w", err)
		}
		cs, err := replay.SideBySide(ctx, rec, episodes, other, *protocol)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if *asJSON {
			return writeJSON(stdout, cs)
		}
		printSideBySide(stdout, rec, *planner, cs)
		return nil
	}
	log := zerolog.Nop()
	if *verbose {
		log = zerolog.New(stderr).With().Timestamp().Logger()
	}
	r, err := replay.Run(ctx, rec, replay.Options{Episodes: episodes, Log: log, Timeout: *timeout})
	if err != nil {
		return err
	}
	if *asJSON {
		if err := writeJSON(stdout, struct {
			Rollout     int64               `json:"rollout"`
			Episodes    []int               `json:"episodes"`
			Differences []replay.Difference `json:"differences"`
			Notes       []string            `json:"notes"`
		}{r.Rollout, r.Episodes, r.Differences, r.Notes}); err != nil {
			return err
		}
	} else {
		printReplay(stdout, r)
	}
	if len(r.Differences) > 0 {
		return fmt.Errorf("%w: %d differences", errDifferent, len(r.Differences))
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func printReplay(w io.Writer, r *replay.Report) {
	what := fmt.Sprintf("%d episodes", len(r.Episodes))
	if len(r.Episodes) == 1 {
		what = fmt.Sprintf("episode %d", r.Episodes[0])
	}
	if len(r.Differences) == 0 {
		fmt.Fprintf(w, "replay of rollout %d (%s) through today's planact: no difference — the same DAGs, observations, trajectories, acts, samples (bit for bit), rewards and statuses\n", r.Rollout, what)
	} else {
		fmt.Fprintf(w, "replay of rollout %d (%s) through today's planact: %d differences\n", r.Rollout, what, len(r.Differences))
		for _, d := range r.Differences {
			fmt.Fprintf(w, "  %s\n      recorded %s\n      replayed %s\n", d.Where, d.Want, d.Got)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "what the recorded engines were asked otherwise than when recorded:")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

func printSideBySide(w io.Writer, rec *replay.Recording, url string, cs []replay.Comparison) {
	for i, c := range cs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "rollout %d episode %d: %s", rec.Rollout, c.Episode, c.Question)
		if c.Label != "" {
			fmt.Fprintf(w, " (label %q)", c.Label)
		}
		fmt.Fprintln(w)
		printSide(w, "recorded planner", c.Recorded)
		printSide(w, url, c.Other)
	}
}

func printSide(w io.Writer, who string, s replay.Side) {
	fmt.Fprintf(w, "  %s (weights %s, %d tokens, finish %s): ", who, orDash(s.WeightVersion), s.Tokens, orDash(s.FinishReason))
	switch s.Parsed {
	case "plan":
		fmt.Fprintf(w, "a plan of %d nodes\n", len(s.Nodes))
		for _, n := range s.Nodes {
			fmt.Fprintf(w, "      %s\n", n)
		}
	case "answer":
		fmt.Fprintf(w, "the answer %q", strings.Join(s.Answers, " | "))
		if s.Reward != nil {
			fmt.Fprintf(w, " (reward %.2f)", *s.Reward)
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprintf(w, "no plan: %s\n", s.Error)
	}
	lines := strings.Split(strings.TrimRight(s.Text, "\n"), "\n")
	for i, l := range lines {
		if i == 12 {
			fmt.Fprintf(w, "    | … (%d more lines; --json prints all)\n", len(lines)-i)
			break
		}
		fmt.Fprintf(w, "    | %s\n", l)
	}
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

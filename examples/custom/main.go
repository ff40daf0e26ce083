// Command custom is planact with a tool, a plan format and a reward
// function of its own, registered in its main: what a team writes instead
// of forking planact (docs/modes.md, "Customising without forking").
//
//	custom --nats nats://127.0.0.1:4222   serve every service against a NATS server
//	custom --demo                         play one rollout on an embedded server
//	                                      with simulated engines, print a JSON summary
//
// What it registers:
//   - the Go tool "kb_search" (kind go): looks a fact up in a knowledge base held
//     by this program (here the simulated world's facts);
//   - the plan format "lines": one call per line, "<id>: <tool>(<input>) <- <deps>";
//   - the reward "contains": 1 when the answer contains one of the label's
//     answers, normalised, else 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/embedded"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/planact"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/tool"
)

// kbCalls counts the Go tool's calls, for the demo's summary.
var kbCalls atomic.Int64

// world is the knowledge base the Go tool answers from.
var world = sim.DefaultWorld()

func init() {
	tool.Register("kb_search", func(_ context.Context, input string) (string, error) {
		kbCalls.Add(1)
		if v, ok := world.Lookup(input); ok {
			return v, nil
		}
		return "unknown", nil
	})
	plan.RegisterFormat("lines", plan.CustomFormat{
		Parse: ParseLines,
		Instructions: `Write one call per line: an id, the tool and its input, and after "<-" the ids it needs; {id} stands for that call's result:
s1: kb_search(capital of France)
s2: kb_search(population of {s1}) <- s1`,
	})
	reward.Register("contains", func(_ context.Context, _, answer, label string) (float64, error) {
		a := reward.Normalize(answer)
		for _, want := range reward.Answers(label) {
			if w := reward.Normalize(want); w != "" && strings.Contains(a, w) {
				return 1, nil
			}
		}
		return 0, nil
	})
}

var lineRe = regexp.MustCompile(`^\s*([A-Za-z_][\w-]*)\s*:\s*([A-Za-z_][\w-]*)\((.*)\)\s*(?:<-\s*(.*))?$`)

// ParseLines reads the "lines" format: "<id>: <tool>(<input>) <- <deps>".
// planact validates what it returns as every plan (ids, tools,
// dependencies, cycles, placeholders, limits).
func ParseLines(text string) ([]plan.Node, error) {
	var nodes []plan.Node
	for i, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		m := lineRe.FindStringSubmatch(line)
		if m == nil {
			if len(nodes) == 0 {
				continue // prose before the plan
			}
			return nil, fmt.Errorf("line %d %q: want <id>: <tool>(<input>) <- <deps>", i+1, strings.TrimSpace(line))
		}
		deps := []string{}
		for d := range strings.SplitSeq(m[4], ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, d)
			}
		}
		nodes = append(nodes, plan.Node{ID: m[1], Tool: m[2], Args: map[string]any{"input": strings.TrimSpace(m[3])}, Deps: deps})
	}
	if len(nodes) == 0 {
		return nil, errors.New(`no line of the form <id>: <tool>(<input>)`)
	}
	return nodes, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "custom:", err)
		os.Exit(1)
	}
}

// Summary is what --demo prints.
type Summary struct {
	PlannerStatus  string  `json:"planner_status"`
	ActorStatus    string  `json:"actor_status"`
	PlannerSamples int     `json:"planner_samples"`
	MeanReward     float64 `json:"mean_reward"`
	KBCalls        int64   `json:"kb_calls"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("custom", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", "", "serve every service against this NATS server")
	demo := fs.Bool("demo", false, "play one rollout on an embedded server with simulated engines, print a JSON summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := zerolog.New(stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	switch {
	case *natsURL != "":
		return planact.Serve(ctx, planact.Services, planact.Options{Conn: bus.ConnOptions{URL: *natsURL}, Log: log, Provision: true})
	case *demo:
		sum, err := playDemo(ctx, log)
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(sum)
	}
	return errors.New("want --nats URL or --demo")
}

// playDemo plays one rollout as both trainers, its config naming the Go
// tool and the reward.
func playDemo(ctx context.Context, log zerolog.Logger) (*Summary, error) {
	srv, err := embedded.Start(embedded.Options{Host: "127.0.0.1", Port: -1})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	planner, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: sim.RolePlanner, Seed: 1, WeightVersion: "planner-v1"})
	if err != nil {
		return nil, err
	}
	actor, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: sim.RoleActor, Seed: 2, WeightVersion: "actor-v1"})
	if err != nil {
		return nil, err
	}
	o := planact.Options{Conn: bus.ConnOptions{URL: srv.ClientURL()}, Log: log, Provision: true}
	sctx, stopServices := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- planact.Serve(sctx, planact.Services, o) }()
	defer func() { stopServices(); <-served }()
	if err := planact.WaitReady(ctx, o, planact.Services); err != nil {
		return nil, err
	}
	var tasks []schema.Task
	for i, t := range world.Tasks(4, 7) {
		tasks = append(tasks, schema.Task{GroupIndex: i, Index: i, Prompt: t.Question, Label: t.Label})
	}
	// The simulated planner calls the tool whose name holds "search".
	// (It writes only planact's own formats: "lines" is for a planner
	// prompted with its instructions; main_test.go parses it.)
	cfg := &schema.Config{Reward: "contains", Tools: []schema.Tool{{Name: "kb_search", Kind: schema.ToolGo, Description: "look up one short fact"}}}
	var results [2]*schema.Result
	var errs [2]error
	var wg sync.WaitGroup
	for i, a := range []*schema.Arrive{
		{Rollout: 1, Role: schema.RolePlanner, Engine: schema.Engine{URL: planner, Protocol: "sglang"}, WeightVersion: "planner-v1", Tasks: tasks, Config: cfg},
		{Rollout: 1, Role: schema.RoleActor, Engine: schema.Engine{URL: actor, Protocol: "sglang"}, WeightVersion: "actor-v1"},
	} {
		nc, err := o.Conn.Dial("custom-trainer-" + a.Role)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		c, err := client.New(nc)
		if err != nil {
			return nil, err
		}
		if err := c.Arrive(ctx, a); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Result(ctx, 1, a.Role)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	sum := &Summary{PlannerStatus: results[0].Status, ActorStatus: results[1].Status, PlannerSamples: len(results[0].Samples), KBCalls: kbCalls.Load()}
	for _, s := range results[0].Samples {
		sum.MeanReward += s.Reward / float64(len(results[0].Samples))
	}
	return sum, nil
}

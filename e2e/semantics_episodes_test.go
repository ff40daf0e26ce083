package e2e

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	plannergateway "github.com/planact/planact/services/planner-gateway"
)

// TestSemanticsParseErrors: with reprompt, a plan that does not parse costs
// a turn and the planner reads the parser's message; with end, the episode
// ends failed at once.
func TestSemanticsParseErrors(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	run := func(n int64, policy string, countries [3]string) outcome {
		tasks := []schema.Task{
			e.question(0, population(countries[0]), sim.FaultTimes(sim.FaultMalformedPlan, 1)),
			e.question(1, population(countries[1]), sim.FaultTimes(sim.FaultCyclicPlan, 1)),
			e.question(2, population(countries[2])),
		}
		return e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &schema.Config{ParseErrorPolicy: policy}, false)
	}
	var reprompt, end outcome
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		reprompt = run(241, schema.ParseReprompt, [3]string{"France", "Germany", "Spain"})
	}()
	go func() { defer wg.Done(); end = run(242, schema.ParseEnd, [3]string{"Italy", "Poland", "Sweden"}) }()
	wg.Wait()
	for _, o := range []outcome{reprompt, end} {
		if o.perr != nil || o.planner.Status != schema.ResultOK {
			t.Fatalf("%v %+v", o.perr, o.planner)
		}
	}
	for ep, want := range []string{"could not be used", "cycle"} {
		s, _ := sampleOf(reprompt.planner, 241, ep)
		checkTokenExact(t, s)
		if s.Status != schema.EpisodeCompleted || s.Reward != 1 || asInt(s.Metadata["turns"]) != 3 {
			t.Errorf("reprompt episode %d: %s, reward %v after %v turns; want completed in 3 (one lost to the bad plan)", ep, s.Status, s.Reward, s.Metadata["turns"])
		}
		if !strings.Contains(s.Response, "Your plan could not be used") || !strings.Contains(s.Response, want) {
			t.Errorf("reprompt episode %d: the planner did not read the parser's message (%q):\n%s", ep, want, s.Response)
		}
		if generatedRuns(s.LossMask) != 3 {
			t.Errorf("reprompt episode %d: %d generated turns in the sample", ep, generatedRuns(s.LossMask))
		}
	}
	for ep, want := range []string{"syntax", "cycle"} {
		s, _ := sampleOf(end.planner, 242, ep)
		if s.Status != schema.EpisodeFailed || asInt(s.Metadata["turns"]) != 1 || !strings.Contains(s.Metadata["end_reason"].(string), want) {
			t.Errorf("end episode %d: %s after %v turns (%v), want failed after 1 (%s)", ep, s.Status, s.Metadata["turns"], s.Metadata["end_reason"], want)
		}
	}
	if s, _ := sampleOf(end.planner, 242, 2); s.Status != schema.EpisodeCompleted {
		t.Errorf("end: the healthy episode ended %s", s.Status)
	}
}

// TestSemanticsGuards: max_turns and the context length end an episode
// truncated; a plan with more nodes than max_nodes is a parse error.
func TestSemanticsGuards(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{})
	compare := "Which capital has the larger population, the capital of Kenya or the capital of Peru?"

	turns := e.question(0, population("Chile"))
	nodes := e.question(0, compare)
	ctxTask := e.question(0, population("Mexico"))
	ctxCfg := schema.Config{}.WithDefaults()
	prompt := len(sim.Encode(plannergateway.RenderPrompt(ctxTask, ctxCfg)))
	ctxCfg.MaxContextTokens = prompt + 400 // room for the first plan, not for the second turn

	cases := []struct {
		n      int64
		task   schema.Task
		cfg    schema.Config
		status string
		reason string
		turns  int
	}{
		{251, turns, schema.Config{MaxTurns: 1}, schema.EpisodeTruncated, "max_turns", 1},
		{252, nodes, schema.Config{MaxNodes: 3, ParseErrorPolicy: schema.ParseEnd}, schema.EpisodeFailed, "too_many_nodes", 1},
		{253, ctxTask, ctxCfg, schema.EpisodeTruncated, "", 0},
	}
	outs := make([]outcome, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = e.rollout(t, e.trainer(t), e.trainer(t), c.n, []schema.Task{c.task}, &c.cfg, false)
		}()
	}
	wg.Wait()
	for i, c := range cases {
		o := outs[i]
		// A rollout whose only episode failed is failed, not ok.
		if c.status == schema.EpisodeFailed && (!errors.Is(o.perr, client.ErrFailed) || o.planner.Status != schema.ResultFailed) ||
			c.status != schema.EpisodeFailed && (o.perr != nil || o.planner.Status != schema.ResultOK) {
			t.Fatalf("rollout %d: %v %+v", c.n, o.perr, o.planner)
		}
		s, ok := sampleOf(o.planner, c.n, 0)
		if !ok {
			t.Fatalf("rollout %d: no planner sample", c.n)
		}
		checkTokenExact(t, s)
		reason, _ := s.Metadata["end_reason"].(string)
		if s.Status != c.status || !strings.Contains(reason, c.reason) || (c.turns > 0 && asInt(s.Metadata["turns"]) != c.turns) {
			t.Errorf("rollout %d: %s after %v turns (%q), want %s (%q)", c.n, s.Status, s.Metadata["turns"], reason, c.status, c.reason)
		}
		if o.planner.Stats.EpisodeStatus[c.status] != 1 {
			t.Errorf("rollout %d: stats %v", c.n, o.planner.Stats.EpisodeStatus)
		}
		if c.n == 253 && len(s.Tokens) > c.cfg.MaxContextTokens {
			t.Errorf("rollout %d: %d tokens in a context of %d", c.n, len(s.Tokens), c.cfg.MaxContextTokens)
		}
	}
}

package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/reward"
)

// testNode is a plan node as a test-side stand-in for the plan-parser reads it.
type testNode struct {
	id, tool, query string
	deps            []string
}

var (
	graphNodeRe   = regexp.MustCompile(`<node id="([^"]+)"(?: depends="([^"]*)")?>([\w.-]+)\((".*")\)</node>`)
	taskRe        = regexp.MustCompile(`(?m)^(T[0-9]+): .*\n- Dependencies: (.*)$`)
	numberedRe    = regexp.MustCompile(`(?m)^([0-9]+)\. ([\w.-]+)\((".*")\)$`)
	dollarRefRe   = regexp.MustCompile(`\$([0-9]+)`)
	answerRe      = regexp.MustCompile(`(?s)<answer>(.*?)</answer>`)
	thinkPrefixRe = regexp.MustCompile(`(?s)^<think>.*?</think>\s*`)
)

func splitDeps(s string) []string {
	var out []string
	for d := range strings.SplitSeq(s, ",") {
		if d = strings.TrimSpace(d); d != "" && d != "none" {
			out = append(out, d)
		}
	}
	return out
}

// parseTestPlan reads what the simulated planner writes in each format.
func parseTestPlan(t *testing.T, format, text string) []testNode {
	t.Helper()
	body := thinkPrefixRe.ReplaceAllString(text, "")
	var nodes []testNode
	switch format {
	case FormatGraph:
		for _, m := range graphNodeRe.FindAllStringSubmatch(body, -1) {
			q, err := strconv.Unquote(m[4])
			if err != nil {
				t.Fatalf("graph node %q: %v", m[0], err)
			}
			nodes = append(nodes, testNode{m[1], m[3], q, splitDeps(m[2])})
		}
	case FormatTaskList:
		tasks := taskRe.FindAllStringSubmatch(body, -1)
		_, calls, ok := strings.Cut(body, "</plan>")
		if !ok {
			t.Fatalf("no </plan> in %q", body)
		}
		var queries []string
		tool := ""
		for _, m := range regexp.MustCompile(`<([\w.-]+)>(.*?)</([\w.-]+)>`).FindAllStringSubmatch(calls, -1) {
			tool = m[1]
			queries = append(queries, strings.Split(m[2], "|")...)
		}
		if len(queries) != len(tasks) {
			t.Fatalf("%d tasks but %d calls in %q", len(tasks), len(queries), body)
		}
		for i, m := range tasks {
			nodes = append(nodes, testNode{m[1], tool, queries[i], splitDeps(m[2])})
		}
	case FormatJSON:
		var js struct {
			Nodes []struct {
				ID        string            `json:"id"`
				Tool      string            `json:"tool"`
				Args      map[string]string `json:"args"`
				DependsOn []string          `json:"depends_on"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(body), &js); err != nil {
			t.Fatalf("json plan %q: %v", body, err)
		}
		for _, n := range js.Nodes {
			nodes = append(nodes, testNode{n.ID, n.Tool, n.Args["query"], n.DependsOn})
		}
	case FormatNumbered:
		for _, m := range numberedRe.FindAllStringSubmatch(body, -1) {
			q, err := strconv.Unquote(m[3])
			if err != nil {
				t.Fatalf("numbered line %q: %v", m[0], err)
			}
			var deps []string
			for _, r := range dollarRefRe.FindAllStringSubmatch(q, -1) {
				deps = append(deps, r[1])
			}
			nodes = append(nodes, testNode{m[1], m[2], q, deps})
		}
		if !strings.Contains(body, fmt.Sprintf("%d. join()", len(nodes)+1)) {
			t.Fatalf("numbered plan without join: %q", body)
		}
	case FormatSteps:
		var steps []struct {
			ID           string            `json:"id"`
			Action       string            `json:"action"`
			Params       map[string]string `json:"params"`
			Dependencies []string          `json:"dependencies"`
		}
		if err := json.Unmarshal([]byte(body), &steps); err != nil {
			t.Fatalf("steps plan %q: %v", body, err)
		}
		for _, s := range steps {
			nodes = append(nodes, testNode{s.ID, s.Action, s.Params["query"], s.Dependencies})
		}
	}
	if len(nodes) == 0 {
		t.Fatalf("no nodes in %s plan %q", format, text)
	}
	return nodes
}

// substitute replaces {id} and $id placeholders with outputs.
func substitute(q string, outs map[string]string) string {
	for id, v := range outs {
		q = strings.ReplaceAll(q, "{"+id+"}", v)
		q = regexp.MustCompile(`\$`+regexp.QuoteMeta(id)+`\b`).ReplaceAllString(q, v)
	}
	return q
}

func plannerPromptText(question, format string) string {
	return "You are a planner. Tools:\n- search: look up one fact\n" +
		"Plan format: " + format + "\nQuestion: " + question + "\n"
}

// runEpisode plays the act-dispatcher against a simulated planner and actor:
// it executes every plan with the actor and feeds observations back until
// an answer. fail(turn, node) may make an act fail (its observation is ERROR).
func runEpisode(t *testing.T, planner, actor *Engine, question, format string, maxTurns int,
	failAct func(turn int, n testNode) bool) (answer string, turns int, transcript string) {
	t.Helper()
	ctx := context.Background()
	prompt := plannerPromptText(question, format)
	for turn := 1; turn <= maxTurns; turn++ {
		in := promptFromText(prompt)
		out, err := planner.generate(ctx, in, nil)
		if err != nil {
			t.Fatalf("turn %d: planner: %v", turn, err)
		}
		prompt += out.text + "\n"
		if m := answerRe.FindStringSubmatch(out.text); m != nil {
			return m[1], turn, prompt
		}
		nodes := parseTestPlan(t, format, out.text)
		outs := map[string]string{}
		var obs strings.Builder
		obs.WriteString("<observation>\n")
		for _, n := range nodes {
			input := substitute(n.query, outs)
			if failAct != nil && failAct(turn, n) {
				fmt.Fprintf(&obs, "%s %s(%q) -> ERROR: tool timed out\n", n.id, n.tool, input)
				continue
			}
			skipped := false
			for _, d := range n.deps {
				if _, ok := outs[d]; !ok {
					skipped = true
				}
			}
			if skipped {
				fmt.Fprintf(&obs, "%s %s(%q) -> SKIPPED: a dependency failed\n", n.id, n.tool, input)
				continue
			}
			aout, err := actor.generate(ctx, promptFromText("Tool: "+n.tool+"\nInput: "+input+"\nAnswer:"), nil)
			if err != nil {
				t.Fatalf("turn %d: actor: %v", turn, err)
			}
			if aout.ids[len(aout.ids)-1] != EOSID {
				t.Fatalf("actor output does not end with EOS: %v", aout.ids)
			}
			outs[n.id] = aout.text
			fmt.Fprintf(&obs, "%s %s(%q) -> %s\n", n.id, n.tool, input, aout.text)
		}
		obs.WriteString("</observation>\n")
		prompt += obs.String()
	}
	t.Fatalf("no answer after %d turns:\n%s", maxTurns, prompt)
	return "", 0, ""
}

func TestPlannerReachesAnswerInEveryFormat(t *testing.T) {
	w := DefaultWorld()
	tasks := w.Tasks(len(questionKinds), 3)
	for _, stepwise := range []float64{0, 1} {
		planner := New(Config{Role: RolePlanner, Seed: 1, PlannerStepwise: stepwise})
		actor := New(Config{Role: RoleActor, Seed: 1})
		for _, format := range Formats {
			for _, task := range tasks {
				t.Run(fmt.Sprintf("stepwise=%v/%s/%s", stepwise, format, task.Kind), func(t *testing.T) {
					ans, turns, transcript := runEpisode(t, planner, actor, task.Question, format, 6, nil)
					if reward.ExactMatch(ans, task.Label) != 1 {
						t.Fatalf("answer %q, label %q\n%s", ans, task.Label, transcript)
					}
					hops := len(parseQuestionMust(t, task.Question).kind.steps)
					if task.Kind[:7] == "compare" {
						hops = 2
					}
					want := 2
					if stepwise == 1 {
						want = hops + 1
					}
					if turns != want {
						t.Errorf("answered in %d turns, want %d\n%s", turns, want, transcript)
					}
				})
			}
		}
	}
}

func parseQuestionMust(t *testing.T, q string) questionPlan {
	t.Helper()
	p, ok := parseQuestion(q)
	if !ok {
		t.Fatalf("cannot parse %q", q)
	}
	return p
}

func TestPlannerReplansFailedLookups(t *testing.T) {
	planner := New(Config{Role: RolePlanner, Seed: 1})
	actor := New(Config{Role: RoleActor, Seed: 1})
	q := "Which capital has the larger population, the capital of France or the capital of Japan?"
	for _, format := range Formats {
		t.Run(format, func(t *testing.T) {
			// The first node of turn 1 fails; its dependents are skipped.
			ans, turns, transcript := runEpisode(t, planner, actor, q, format, 6, func(turn int, n testNode) bool {
				return turn == 1 && strings.Contains(n.query, "France")
			})
			if ans != "Tokyo" || turns != 3 {
				t.Fatalf("answer %q in %d turns, want Tokyo in 3\n%s", ans, turns, transcript)
			}
			if !strings.Contains(transcript, "try them again") {
				t.Errorf("no re-plan in\n%s", transcript)
			}
		})
	}
}

func TestActorWrongGivesWrongAnswer(t *testing.T) {
	planner := New(Config{Role: RolePlanner, Seed: 1})
	actor := New(Config{Role: RoleActor, Seed: 1})
	q := "What is the population of the capital of France? " + FaultActorWrong
	ans, _, transcript := runEpisode(t, planner, actor, q, FormatGraph, 6, nil)
	if ans == "2.1 million" {
		t.Fatalf("answer is right despite %s\n%s", FaultActorWrong, transcript)
	}
	if !strings.Contains(transcript, `search("capital of France `+FaultActorWrong+`")`) {
		t.Errorf("marker not copied into the first node's input\n%s", transcript)
	}

	// An actor error rate of 1 is always wrong; 0 never.
	wrong := New(Config{Role: RoleActor, Seed: 1, ActorErrorRate: 1})
	out, _ := wrong.generate(context.Background(), promptFromText("Tool: search\nInput: capital of France\n"), nil)
	if out.text == "Paris" {
		t.Error("ActorErrorRate 1 answered right")
	}
}

func TestPlanFaults(t *testing.T) {
	ctx := context.Background()
	base := "What is the population of the capital of France? "
	for _, tc := range []struct {
		marker, format string
		check          func(text string) bool
	}{
		{FaultToolInvalid, FormatGraph, func(s string) bool { return strings.Contains(s, InvalidTool+`("capital of France")`) }},
		{FaultCyclicPlan, FormatGraph, func(s string) bool {
			return strings.Contains(s, `<node id="s1" depends="s2">`) && strings.Contains(s, `<node id="s2" depends="s1">`)
		}},
		{FaultCyclicPlan, FormatJSON, func(s string) bool { return strings.Contains(s, `"depends_on":["T2"]`) }},
		{FaultMalformedPlan, FormatGraph, func(s string) bool { return !strings.Contains(s, "</graph>") }},
		{FaultMalformedPlan, FormatJSON, func(s string) bool {
			return json.Unmarshal([]byte(thinkPrefixRe.ReplaceAllString(s, "")), new(any)) != nil
		}},
		{FaultMalformedPlan, FormatSteps, func(s string) bool {
			return json.Unmarshal([]byte(thinkPrefixRe.ReplaceAllString(s, "")), new(any)) != nil
		}},
		{FaultMalformedPlan, FormatTaskList, func(s string) bool { return !strings.Contains(s, "</plan>") }},
		{FaultMalformedPlan, FormatNumbered, func(s string) bool { return strings.Contains(s, "1. search(\"capital of France\"\n") }},
		{FaultTruncatedPlan, FormatGraph, func(s string) bool { return !strings.Contains(s, "</graph>") }},
	} {
		t.Run(tc.marker+"/"+tc.format, func(t *testing.T) {
			e := New(Config{Role: RolePlanner, Seed: 1})
			out, err := e.generate(ctx, promptFromText(plannerPromptText(base+tc.marker, tc.format)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(out.text) {
				t.Errorf("plan:\n%s", out.text)
			}
			wantFinish := "stop"
			if tc.marker == FaultTruncatedPlan {
				wantFinish = "length"
			}
			if out.finish != wantFinish {
				t.Errorf("finish %q, want %q", out.finish, wantFinish)
			}
		})
	}
}

func TestCountedMarkerRecovers(t *testing.T) {
	planner := New(Config{Role: RolePlanner, Seed: 1})
	actor := New(Config{Role: RoleActor, Seed: 1})
	ctx := context.Background()
	q := "What is the population of the capital of France? " + FaultTimes(FaultMalformedPlan, 1)
	prompt := plannerPromptText(q, FormatJSON)
	out, _ := planner.generate(ctx, promptFromText(prompt), nil)
	if json.Unmarshal([]byte(thinkPrefixRe.ReplaceAllString(out.text, "")), new(any)) == nil {
		t.Fatalf("first plan is not malformed: %s", out.text)
	}
	prompt += out.text + "\n<observation>\nYour plan could not be used: invalid JSON\n</observation>\n"
	out, _ = planner.generate(ctx, promptFromText(prompt), nil)
	parseTestPlan(t, FormatJSON, out.text) // fails the test if malformed

	// An actor error that fires once: the retry of the same input succeeds.
	in := promptFromText("Tool: search\nInput: capital of France " + FaultTimes(FaultActorError, 1) + "\n")
	if _, err := actor.generate(ctx, in, nil); err != errInjected {
		t.Fatalf("first attempt: %v, want injected error", err)
	}
	if out, err := actor.generate(ctx, in, nil); err != nil || out.text != "Paris" {
		t.Fatalf("retry: %q, %v", out.text, err)
	}
	_ = reward.F1
}

func TestDeterminism(t *testing.T) {
	ctx := context.Background()
	prompt := promptFromText(plannerPromptText("What is the population of the capital of Japan?", FormatGraph))
	a, _ := New(Config{Role: RolePlanner, Seed: 5}).generate(ctx, prompt, nil)
	b, _ := New(Config{Role: RolePlanner, Seed: 5}).generate(ctx, prompt, nil)
	c, _ := New(Config{Role: RolePlanner, Seed: 6}).generate(ctx, prompt, nil)
	if a.text != b.text || fmt.Sprint(a.logprobs) != fmt.Sprint(b.logprobs) || fmt.Sprint(a.ids) != fmt.Sprint(b.ids) {
		t.Error("same seed, different generations")
	}
	if fmt.Sprint(a.logprobs) == fmt.Sprint(c.logprobs) {
		t.Error("log-probs ignore the seed")
	}
	for _, lp := range a.logprobs {
		if lp >= 0 {
			t.Fatalf("non-negative log-prob %v", lp)
		}
	}
	// Fault rates are deterministic too.
	faulty := Config{Role: RoleActor, Seed: 9, Faults: Faults{ErrorRate: 0.5}}
	var x, y []bool
	e1, e2 := New(faulty), New(faulty)
	for i := range 40 {
		in := promptFromText(fmt.Sprintf("Tool: search\nInput: capital of %s\n", DefaultWorld().Countries()[i%20].Name))
		_, err1 := e1.generate(ctx, in, nil)
		_, err2 := e2.generate(ctx, in, nil)
		x, y = append(x, err1 != nil), append(y, err2 != nil)
	}
	if fmt.Sprint(x) != fmt.Sprint(y) || !strings.Contains(fmt.Sprint(x), "true") || !strings.Contains(fmt.Sprint(x), "false") {
		t.Errorf("error pattern %v vs %v", x, y)
	}
}

// TestPlanWidth: with PlanWidth the planner writes one plan of that many
// independent lookups in every format, then answers.
func TestPlanWidth(t *testing.T) {
	for _, width := range []int{1, 4, 28} {
		planner := New(Config{Role: RolePlanner, Seed: 1, PlanWidth: width})
		actor := New(Config{Role: RoleActor, Seed: 1})
		for _, format := range Formats {
			t.Run(fmt.Sprintf("%d/%s", width, format), func(t *testing.T) {
				var nodes int
				ans, turns, transcript := runEpisode(t, planner, actor, "What is the capital of France?", format, 4, func(turn int, n testNode) bool {
					nodes++
					if len(n.deps) != 0 {
						t.Errorf("node %q depends on %v: want independent lookups", n.query, n.deps)
					}
					return false
				})
				if turns != 2 || nodes != width || !strings.Contains(ans, fmt.Sprintf("%d facts", width)) {
					t.Fatalf("%d nodes in %d turns, answer %q: want %d nodes, then the answer\n%s", nodes, turns, ans, width, transcript)
				}
			})
		}
	}
}

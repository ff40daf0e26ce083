package e2e

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestPeerReviewEndToEnd: a peer_review rollout on the simulated world.
// The actor answers each task (wrongly half the time), the planner reviews
// until it accepts; both roles' samples are token-exact (the invariants of
// checkTokenExact), every attempt is one actor sample rewarded with the
// final answer's score, and the planner's one sample per episode holds one
// generated run per review and is rewarded with its verdict's agreement.
func TestPeerReviewEndToEnd(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 5}, actor: sim.Config{Seed: 6, ActorErrorRate: 0.5}})
	const n = 300
	tasks := e.tasks(6, 2, n)
	cfg := schema.Config{Mode: schema.ModePeerReview, MaxTurns: 6}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &cfg, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("planner err %v, actor err %v", o.perr, o.aerr)
	}
	pr, ar := o.planner, o.actor
	if pr.Status != schema.ResultOK || ar.Status != schema.ResultOK {
		t.Fatalf("status planner %q actor %q (%s / %s)", pr.Status, ar.Status, pr.Reason, ar.Reason)
	}
	if len(pr.Samples) != len(tasks) {
		t.Fatalf("%d planner samples for %d episodes", len(pr.Samples), len(tasks))
	}
	attempts := map[string][]schema.Sample{}
	for _, s := range ar.Samples {
		checkTokenExact(t, s)
		if s.Metadata["tool"] != "answer" {
			t.Errorf("actor sample %s: tool %v, want answer", s.RolloutID, s.Metadata["tool"])
		}
		if len(s.WeightVersions) != 1 || s.WeightVersions[0] != "actor-v3" {
			t.Errorf("actor sample %s: weight versions %v", s.RolloutID, s.WeightVersions)
		}
		if !strings.HasPrefix(s.Prompt, "You are the solver.") {
			t.Errorf("actor sample %s: prompt %q", s.RolloutID, s.Prompt)
		}
		attempts[s.RolloutID] = append(attempts[s.RolloutID], s)
	}
	if ar.Stats.Acts != len(ar.Samples) {
		t.Errorf("stats say %d acts, %d actor samples", ar.Stats.Acts, len(ar.Samples))
	}
	revised := 0
	seen := map[string]bool{}
	for _, s := range pr.Samples {
		if seen[s.RolloutID] {
			t.Errorf("two planner samples of episode %s", s.RolloutID)
		}
		seen[s.RolloutID] = true
		checkTokenExact(t, s)
		task := tasks[s.Index]
		if s.Label != task.Label {
			t.Errorf("sample %s: label %q, task's %q", s.RolloutID, s.Label, task.Label)
		}
		if !strings.HasPrefix(s.Prompt, "You are the reviewer.") {
			t.Errorf("planner sample %s: prompt %q", s.RolloutID, s.Prompt)
		}
		if s.Status != schema.EpisodeCompleted {
			t.Errorf("episode %s: %s (%v)", s.RolloutID, s.Status, s.Metadata["end_reason"])
			continue
		}
		turns := asInt(s.Metadata["turns"])
		reviews := generatedRuns(s.LossMask)
		if reviews != turns-1 {
			t.Errorf("episode %s: %d reviews in the loss mask, %d turns (turn 1 is the actor's)", s.RolloutID, reviews, turns)
		}
		if len(s.WeightVersions) != reviews {
			t.Errorf("episode %s: weight versions %v for %d reviews", s.RolloutID, s.WeightVersions, reviews)
		}
		// One attempt per review: the first answer and each revision.
		tries := attempts[s.RolloutID]
		if len(tries) != reviews {
			t.Errorf("episode %s: %d attempts for %d reviews", s.RolloutID, len(tries), reviews)
		}
		if len(tries) > 1 {
			revised++
		}
		answer := joinAnswers(s.Metadata["answers"])
		score := reward.F1(answer, task.Label)
		correct := reward.ExactMatch(answer, task.Label) == 1
		accepted, _ := s.Metadata["accepted"].(bool)
		// The simulated reviewer knows the world: it accepts exactly the
		// right answers, so it always agrees.
		if accepted != correct {
			t.Errorf("episode %s: accepted %v an answer %q whose correctness is %v (label %q)", s.RolloutID, accepted, answer, correct, task.Label)
		}
		wantPlanner := 0.0
		if accepted == correct {
			wantPlanner = 1
		}
		if s.Reward != wantPlanner {
			t.Errorf("episode %s: planner reward %v, want %v (accepted %v, correct %v)", s.RolloutID, s.Reward, wantPlanner, accepted, correct)
		}
		last := ""
		for _, a := range tries {
			if a.Reward != score {
				t.Errorf("episode %s: attempt %v rewarded %v, want the final answer's score %v", s.RolloutID, a.Metadata["key"], a.Reward, score)
			}
			if a.Metadata["turn"] != nil {
				last = fmt.Sprint(a.Response)
			}
		}
		if len(tries) > 0 && strings.TrimSpace(last) != answer && accepted {
			t.Errorf("episode %s: accepted answer %q is not the last attempt %q", s.RolloutID, answer, last)
		}
	}
	if revised == 0 {
		t.Error("no episode needed a revision: the test does not exercise the review loop")
	}
	kinds := checkWire(t, e.url, n)
	if kinds["plan.dag/1"] < len(tasks) || kinds["plan.answer/1"] == 0 || kinds["act.done/1"] != len(ar.Samples) {
		t.Errorf("messages of the rollout: %v", kinds)
	}
	t.Logf("%d episodes, %d revised, accuracy %v, mean turns %.2f", len(pr.Samples), revised, pr.Stats.Accuracy, pr.Stats.MeanTurns)
}

// TestUnknownModeRefused: an arrival naming a mode planact does not know
// is refused, the reason naming the known ones.
func TestUnknownModeRefused(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 1}, actor: sim.Config{Seed: 2}})
	const n = 301
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	planner := e.trainer(t)
	err := planner.Arrive(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7",
		Tasks: e.tasks(1, 1, n), Config: &schema.Config{Mode: "debate"}})
	if err == nil {
		_, err = planner.Result(ctx, n, schema.RolePlanner)
	}
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), `config: mode "debate": want one of plan_act, peer_review, ensemble`) {
		t.Fatalf("arrival with mode debate: %v", err)
	}
}

// TestEnsembleEndToEnd: an ensemble rollout on the simulated world. Every
// act of the actor is asked ensemble_k times and voted on: each candidate
// is an actor sample, token-exact (the invariants of checkResults, which
// every plan_act rollout passes too); per planned act there are K of them,
// exactly one chosen; those agreeing with the pick get the final answer's
// score, the rejected ones 0; and the vote took the most frequent answer.
func TestEnsembleEndToEnd(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 7}, actor: sim.Config{Seed: 8, ActorErrorRate: 0.3}})
	const n, k = 302, 3
	tasks := e.tasks(6, 2, n)
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: k}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &cfg, true)
	checkResults(t, n, tasks, o, false)
	score := map[string]float64{}
	for _, s := range o.planner.Samples {
		score[s.RolloutID] = s.Reward
	}
	type pick struct {
		episode, node string
		turn          int
	}
	cands := map[pick][]schema.Sample{}
	for _, s := range o.actor.Samples {
		id := fmt.Sprint(s.Metadata["node"])
		cut := strings.LastIndex(id, "-c")
		if cut < 0 {
			t.Errorf("actor sample %s: node %s is no candidate", s.RolloutID, id)
			continue
		}
		p := pick{s.RolloutID, id[:cut], asInt(s.Metadata["turn"])}
		cands[p] = append(cands[p], s)
	}
	rejected := 0
	for p, list := range cands {
		if len(list) != k {
			t.Errorf("%v: %d candidates, want %d", p, len(list), k)
		}
		count := map[string]int{}
		for _, s := range list {
			count[reward.Normalize(s.Response)]++
		}
		var chosen *schema.Sample
		for i, s := range list {
			if s.Metadata["ensemble"] == "chosen" {
				if chosen != nil {
					t.Errorf("%v: two candidates chosen", p)
				}
				chosen = &list[i]
			}
		}
		if chosen == nil {
			t.Errorf("%v: no candidate chosen: %v", p, list)
			continue
		}
		for ans, c := range count {
			if c > count[reward.Normalize(chosen.Response)] {
				t.Errorf("%v: chose %q (%d votes) over %q (%d votes)", p, chosen.Response, count[reward.Normalize(chosen.Response)], ans, c)
			}
		}
		for _, s := range list {
			agree := reward.Normalize(s.Response) == reward.Normalize(chosen.Response)
			switch {
			case agree && s.Reward != score[p.episode]:
				t.Errorf("%v: candidate %v (%s) rewarded %v, want the episode's %v", p, s.Metadata["node"], s.Metadata["ensemble"], s.Reward, score[p.episode])
			case !agree && (s.Reward != 0 || s.Metadata["ensemble"] != "rejected"):
				t.Errorf("%v: candidate %v %q against the pick %q: %s rewarded %v, want rejected 0", p, s.Metadata["node"], s.Response, chosen.Response, s.Metadata["ensemble"], s.Reward)
			case !agree:
				rejected++
			}
		}
	}
	if rejected == 0 {
		t.Error("no candidate was rejected: the test does not exercise the vote")
	}
	if kinds := checkWire(t, e.url, n); kinds["act.done/1"] != len(o.actor.Samples)+len(cands) {
		t.Errorf("%d act outcomes for %d candidates and %d votes: %v", kinds["act.done/1"], len(o.actor.Samples), len(cands), kinds)
	}
	t.Logf("%d picks, %d rejected candidates, accuracy %v", len(cands), rejected, o.planner.Stats.Accuracy)
}

// checkWire validates every message of rollout n in the PLAN and ACT
// streams against the schema its header names (as TestHeadersAndDecode
// does for plan_act): a mode's plans and acts are messages like any other.
func checkWire(t *testing.T, url string, n int64) map[string]int {
	t.Helper()
	js, err := jetstream.New(bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schemas := compileSchemas(t)
	kinds := map[string]int{}
	for _, s := range []struct{ stream, filter string }{{bus.StreamPlan, fmt.Sprintf("plan.%d.>", n)}, {bus.StreamAct, fmt.Sprintf("act.%d.>", n)}} {
		c, err := js.OrderedConsumer(ctx, s.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.filter}})
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for left := info.NumPending; left > 0; {
			batch, err := c.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for m := range batch.Messages() {
				kind := m.Headers().Get(schema.HdrSchema)
				kinds[kind]++
				checkDecode(t, captured{subject: m.Subject(), header: m.Headers(), data: m.Data()}, kind, schemas)
				got++
			}
			if got == 0 {
				t.Fatalf("%s: %d messages left, none fetched", s.filter, left)
			}
			left -= uint64(got)
		}
	}
	return kinds
}

// TestModesUnderLeastPrivilege: peer_review and ensemble rollouts on the
// three servers of compose/nats with accounts.conf verbatim, every service
// as its own user: both end ok with no permission violation. (A
// peer_review episode starts with a plan the session-store publishes:
// without its right to plan.*.dag.*, the server refuses it.)
func TestModesUnderLeastPrivilege(t *testing.T) {
	t.Parallel()
	v := &violations{}
	urls := composeCluster(t, v)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pu, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RolePlanner, Seed: 31, WeightVersion: "planner-v7"})
	if err != nil {
		t.Fatal(err)
	}
	au, err := sim.Serve(ctx, "127.0.0.1:0", sim.Config{Role: schema.RoleActor, Seed: 32, WeightVersion: "actor-v3", ActorErrorRate: 0.4})
	if err != nil {
		t.Fatal(err)
	}
	serveCluster(t, ctx, urls, 0)
	trainer := func(i int, role string) *client.Client {
		c, err := client.New(bustest.Conn(t, withUser(urls[i%len(urls)], "trainer-"+role)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	world := &env{world: sim.DefaultWorld()}
	for i, cfg := range []schema.Config{{Mode: schema.ModePeerReview}, {Mode: schema.ModeEnsemble, EnsembleK: 3}} {
		n := int64(310 + i)
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
		pc, ac := trainer(i, schema.RolePlanner), trainer(i+1, schema.RoleActor)
		if err := pc.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: pu, Protocol: "sglang"},
			WeightVersion: "planner-v7", Tasks: world.tasks(3, 2, n), Config: &cfg}); err != nil {
			t.Fatal(err)
		}
		if err := ac.Arrive(rctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: schema.Engine{URL: au, Protocol: "sglang"}, WeightVersion: "actor-v3"}); err != nil {
			t.Fatal(err)
		}
		pr, perr := pc.Result(rctx, n, schema.RolePlanner)
		ar, aerr := ac.Result(rctx, n, schema.RoleActor)
		rcancel()
		if perr != nil || aerr != nil || pr.Status != schema.ResultOK || ar.Status != schema.ResultOK || len(pr.Samples) != 6 || len(ar.Samples) < 6 {
			t.Fatalf("mode %s: planner %v %v, actor %v %v (violations %v)", cfg.Mode, brief(pr), perr, brief(ar), aerr, v.snapshot())
		}
		for _, s := range append(pr.Samples, ar.Samples...) {
			checkTokenExact(t, s)
		}
	}
	if lines := v.take(); len(lines) > 0 {
		t.Errorf("permission violations: %v", lines)
	}
}

// TestEnsemblePlannerPickEndToEnd: an ensemble rollout with ensemble_pick
// planner on the simulated world. No vote runs: the planner's next reply
// picks among each act's candidates (<pick node="X">N</pick>, after the
// observation that listed them), and its sample, token-exact, holds those
// picks as generated tokens. Every candidate is an actor sample (the
// invariants of checkResults); per planned act of a completed episode
// exactly one is chosen, the one the planner picked; those agreeing with
// it get the final answer's score, the others 0, so the chosen and the
// rejected are rewarded differently where their answers differ.
func TestEnsemblePlannerPickEndToEnd(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{planner: sim.Config{Seed: 9, JudgeErrorRate: 0.3}, actor: sim.Config{Seed: 10, ActorErrorRate: 0.3}})
	const n, k = 303, 3
	tasks := e.tasks(6, 2, n)
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: k, EnsemblePick: schema.EnsemblePickPlanner}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, tasks, &cfg, true)
	checkResults(t, n, tasks, o, false)
	type pick struct {
		episode, node string
		turn          int
	}
	planner := map[string]schema.Sample{}
	picked := map[pick]int{} // what the planner's sample says it picked
	candRe := regexp.MustCompile(`<candidates node="([^"]+)" turn="(\d+)">`)
	for _, s := range o.planner.Samples {
		planner[s.RolloutID] = s
		if !strings.Contains(s.Prompt, `<pick node="<id>">N</pick>`) {
			t.Errorf("planner sample %s: not told to pick: %q", s.RolloutID, s.Prompt)
		}
		for _, m := range candRe.FindAllStringSubmatchIndex(s.Response, -1) {
			node := s.Response[m[2]:m[3]]
			turn, _ := strconv.Atoi(s.Response[m[4]:m[5]])
			after := regexp.MustCompile(`<pick node="` + regexp.QuoteMeta(node) + `">(\d+)</pick>`).FindStringSubmatch(s.Response[m[1]:])
			if after == nil {
				continue // never judged: the episode ended first
			}
			picked[pick{s.RolloutID, node, turn}], _ = strconv.Atoi(after[1])
		}
	}
	cands := map[pick][]schema.Sample{}
	for _, s := range o.actor.Samples {
		id := fmt.Sprint(s.Metadata["node"])
		cut := strings.LastIndex(id, "-c")
		if cut < 0 {
			t.Errorf("actor sample %s: node %s is no candidate", s.RolloutID, id)
			continue
		}
		p := pick{s.RolloutID, id[:cut], asInt(s.Metadata["turn"])}
		cands[p] = append(cands[p], s)
	}
	differ, judged := 0, 0
	for p, list := range cands {
		if len(list) != k {
			t.Errorf("%v: %d candidates, want %d", p, len(list), k)
		}
		ep := planner[p.episode]
		var chosen *schema.Sample
		for i, s := range list {
			if s.Metadata["ensemble"] == "chosen" {
				if chosen != nil {
					t.Errorf("%v: two candidates chosen", p)
				}
				chosen = &list[i]
			}
		}
		number, judgedHere := picked[p]
		switch {
		case chosen == nil && judgedHere:
			t.Errorf("%v: the planner picked %d, no candidate chosen", p, number)
			continue
		case chosen == nil && ep.Status == schema.EpisodeCompleted:
			t.Errorf("%v: a completed episode's step was never judged: %q", p, ep.Response)
			continue
		case chosen == nil:
			for _, s := range list {
				if s.Reward != 0 || s.Metadata["ensemble"] != "unpicked" {
					t.Errorf("%v: candidate %v of a step never judged: %v rewarded %v", p, s.Metadata["node"], s.Metadata["ensemble"], s.Reward)
				}
			}
			continue
		case fmt.Sprint(chosen.Metadata["node"]) != fmt.Sprintf("%s-c%d", p.node, number):
			t.Errorf("%v: chosen %v, the planner picked %d", p, chosen.Metadata["node"], number)
		}
		judged++
		for _, s := range list {
			agree := reward.Normalize(s.Response) == reward.Normalize(chosen.Response)
			switch {
			case agree && s.Reward != ep.Reward:
				t.Errorf("%v: candidate %v (%s) rewarded %v, want the episode's %v", p, s.Metadata["node"], s.Metadata["ensemble"], s.Reward, ep.Reward)
			case !agree && (s.Reward != 0 || s.Metadata["ensemble"] != "rejected"):
				t.Errorf("%v: candidate %v %q against the pick %q: %s rewarded %v, want rejected 0", p, s.Metadata["node"], s.Response, chosen.Response, s.Metadata["ensemble"], s.Reward)
			case !agree && chosen.Reward != s.Reward:
				differ++
			}
		}
	}
	if judged == 0 || differ == 0 {
		t.Errorf("%d steps judged, %d rejected candidates rewarded unlike the chosen: the test does not exercise the planner's pick", judged, differ)
	}
	if kinds := checkWire(t, e.url, n); kinds["act.done/1"] != len(o.actor.Samples) {
		t.Errorf("%d act outcomes for %d candidates (no votes): %v", kinds["act.done/1"], len(o.actor.Samples), kinds)
	}
	t.Logf("%d steps judged, %d rejected candidates rewarded unlike the chosen, accuracy %v", judged, differ, o.planner.Stats.Accuracy)
}

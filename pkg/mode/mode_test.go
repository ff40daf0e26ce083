package mode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

func TestFor(t *testing.T) {
	for _, name := range append([]string{""}, schema.Modes...) {
		m, err := mode.For(schema.Config{Mode: name})
		if err != nil {
			t.Fatalf("mode %q: %v", name, err)
		}
		if want := name; want != "" && m.Name() != want {
			t.Errorf("mode %q is %s", name, m.Name())
		}
	}
	if _, err := mode.For(schema.Config{Mode: "debate"}); err == nil || !strings.Contains(err.Error(), "want one of plan_act, peer_review, ensemble") {
		t.Errorf("unknown mode: %v", err)
	}
}

func TestVerdict(t *testing.T) {
	cases := []struct {
		text     string
		accept   bool
		critique string
		ok       bool
	}{
		{"<accept/>", true, "", true},
		{"<think>hmm</think>\n<accept />", true, "", true},
		{"<revise>Paris is not a country.</revise>", false, "Paris is not a country.", true},
		{"<think><accept/></think><revise>wrong</revise>", false, "wrong", true},
		{"<revise>first</revise> then <accept/>", true, "", true},
		{"<accept/> no, <revise>second thoughts</revise>", false, "second thoughts", true},
		{"Looks fine to me.", false, "", false},
		{"<revise>never closed", false, "", false},
	}
	for _, c := range cases {
		accept, critique, ok := mode.Verdict(c.text)
		if accept != c.accept || critique != c.critique || ok != c.ok {
			t.Errorf("Verdict(%q) = %v %q %v, want %v %q %v", c.text, accept, critique, ok, c.accept, c.critique, c.ok)
		}
	}
}

// TestPeerReviewParse: what each review becomes, and what the actor is
// asked for a revision.
func TestPeerReviewParse(t *testing.T) {
	m := mode.PeerReview{}
	cfg := schema.Config{Mode: schema.ModePeerReview}.WithDefaults() // max_turns 4
	obs := m.Observation(&schema.Run{Nodes: []*schema.NodeState{{Node: plan.Node{ID: "attempt"}, Status: schema.NodeDone, Output: "Addis Ababa\n"}}}, schema.Config{})
	failed := m.Observation(&schema.Run{Nodes: []*schema.NodeState{{Node: plan.Node{ID: "attempt"}, Status: schema.NodeFailed, Error: "act timed out"}}}, schema.Config{})
	parse := func(turn int, text, observation string) schema.Message {
		t.Helper()
		msg, err := m.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Episode: 2, Turn: turn, Text: text}, observation, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	if a, ok := parse(2, "<accept/>", obs).(*schema.PlanAnswer); !ok || len(a.Answers) != 1 || a.Answers[0] != "Addis Ababa" || a.Turn != 2 {
		t.Errorf("accept: %#v", parse(2, "<accept/>", obs))
	}
	d, ok := parse(2, "<revise>check the capital</revise>", obs).(*schema.PlanDAG)
	if !ok || len(d.Plan.Nodes) != 1 || d.Plan.Nodes[0].Tool != mode.ReviewTool || d.Plan.Nodes[0].Args["previous"] != "Addis Ababa" || d.Plan.Nodes[0].Args["critique"] != "check the capital" {
		t.Fatalf("revise: %#v", parse(2, "<revise>check the capital</revise>", obs))
	}
	n := d.Plan.Nodes[0]
	prompt := m.ActorPrompt(schema.Task{Prompt: "What is the capital of Ethiopia?"}, schema.Tool{}, mode.Node{ID: n.ID, Tool: n.Tool, Args: n.Args}, n.Input())
	for _, want := range []string{"Your previous answer: Addis Ababa", "A reviewer asked for a revision: check the capital", "Input: What is the capital of Ethiopia?"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("revision prompt %q lacks %q", prompt, want)
		}
	}
	// At max_turns a revision is no longer asked for: the answer reviewed stands.
	if a, ok := parse(4, "<revise>still wrong</revise>", obs).(*schema.PlanAnswer); !ok || a.Answers[0] != "Addis Ababa" {
		t.Errorf("revise at max_turns: %#v", parse(4, "<revise>still wrong</revise>", obs))
	}
	for _, c := range []struct {
		name, text, obs, want string
	}{
		{"no verdict", "It is fine.", obs, "found neither"},
		{"nothing to accept", "<accept/>", failed, "no answer to accept"},
		{"empty critique", "<revise> </revise>", obs, "holds no critique"},
	} {
		pe, ok := parse(2, c.text, c.obs).(*schema.PlanError)
		if !ok || !strings.Contains(pe.Message, c.want) {
			t.Errorf("%s: %#v, want an error saying %q", c.name, parse(2, c.text, c.obs), c.want)
		}
	}
	if pe, ok := parse(3, "", obs).(*schema.PlanError); !ok || pe.ErrorKind != string(plan.ErrEmpty) {
		t.Errorf("empty review: %#v", parse(3, "", obs))
	}
	open, ok := m.Open(7, 1, schema.Task{Prompt: "Q?"}, cfg, "v1").(*schema.PlanDAG)
	if !ok || open.Turn != 1 || len(open.Plan.Nodes) != 1 || open.Plan.Nodes[0].Input() != "Q?" {
		t.Errorf("open: %#v", m.Open(7, 1, schema.Task{Prompt: "Q?"}, cfg, "v1"))
	}
}

// TestPeerReviewRewards: the planner is rewarded for agreeing with the
// final answer's correctness; the attempts keep the answer's score.
func TestPeerReviewRewards(t *testing.T) {
	for _, c := range []struct {
		review  string
		correct bool
		want    float64
	}{
		{"<accept/>", true, 1},
		{"<accept/>", false, 0},
		{"<revise>no</revise>", false, 1},
		{"<revise>no</revise>", true, 0},
	} {
		ep := &mode.Episode{End: &schema.EpisodeEnd{Status: schema.EpisodeCompleted}, Last: &schema.PlanOutput{Text: c.review},
			Score: 0.5, Correct: c.correct, Planner: &schema.Sample{Reward: 0.5}, Actor: []schema.Sample{{Reward: 0.5}}}
		mode.PeerReview{}.Rewards(ep)
		if ep.Planner.Reward != c.want || ep.Actor[0].Reward != 0.5 {
			t.Errorf("%s, correct %v: planner %v (want %v), actor %v", c.review, c.correct, ep.Planner.Reward, c.want, ep.Actor[0].Reward)
		}
	}
}

func TestVote(t *testing.T) {
	for _, c := range []struct {
		answers []string
		want    int
	}{
		{[]string{"Paris", "Lyon", "paris."}, 0},
		{[]string{"Lyon", "Paris", "the Paris"}, 1},
		{[]string{"a", "b", "c"}, 0},
		{[]string{"a", "b", "b", "a"}, 0},
	} {
		if got := mode.Vote(c.answers); got != c.want {
			t.Errorf("Vote(%q) = %d, want %d", c.answers, got, c.want)
		}
	}
}

// TestEnsembleExpand: acts of the actor model become K candidates and a
// vote of the same id; HTTP tools are left as they are; the vote runs
// locally on the candidates' answers.
func TestEnsembleExpand(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 3, Tools: []schema.Tool{{Name: "search"}, {Name: "wiki", Kind: schema.ToolHTTP, URL: "http://w"}}}
	nodes := mode.Expand([]plan.Node{
		{ID: "s1", Tool: "search", Args: map[string]any{"query": "capital of France"}, Deps: []string{}},
		{ID: "s2", Tool: "wiki", Args: map[string]any{"query": "{s1}"}, Deps: []string{"s1"}},
		{ID: "s1-c1", Tool: "search", Args: map[string]any{"query": "x"}, Deps: []string{}}, // a planner's id in the way
	}, cfg)
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.ID+":"+n.Tool)
	}
	want := "s1-c1_:search s1-c2:search s1-c3:search s1:vote s2:wiki s1-c1-c1:search s1-c1-c2:search s1-c1-c3:search s1-c1:vote"
	if got := strings.Join(ids, " "); got != want {
		t.Fatalf("expanded to %s, want %s", got, want)
	}
	if lv := (&plan.Plan{Format: plan.FormatGraph, Nodes: nodes}).Levels(); len(lv) != 3 {
		t.Errorf("expanded plan's levels: %v, want candidates, votes, what needs them", lv)
	}
	vote := nodes[3]
	filled := plan.Substitute(vote, map[string]string{"s1-c1_": "Paris", "s1-c2": "Lyon", "s1-c3": "paris"})
	m := mode.Ensemble{}
	tool, ok := m.Tool(cfg, vote.Tool)
	if !ok || tool.Kind != mode.KindLocal {
		t.Fatalf("vote tool %+v %v", tool, ok)
	}
	out, err := m.RunLocal(tool, mode.Node{ID: filled.ID, Tool: filled.Tool, Args: filled.Args})
	if err != nil || out != "Paris" {
		t.Errorf("vote: %q %v", out, err)
	}
	if filled.Input() != "capital of France" {
		t.Errorf("vote input %q", filled.Input())
	}
}

// TestEnsembleRewards: chosen and agreeing candidates keep the score, the
// rejected ones get 0.
func TestEnsembleRewards(t *testing.T) {
	acts := []*schema.ActDone{
		{Turn: 1, NodeID: "s1-c1", Output: "Lyon", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c2", Output: "Paris", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c3", Output: "paris", Status: schema.ActDoneOK},
	}
	vote := &schema.ActDone{Turn: 1, NodeID: "s1", Tool: mode.VoteTool, Output: "Paris", Status: schema.ActDoneOK}
	ep := &mode.Episode{Score: 1, Acts: acts, Outcomes: append(append([]*schema.ActDone(nil), acts...), vote),
		Actor: []schema.Sample{{Reward: 1}, {Reward: 1}, {Reward: 1}}}
	mode.Ensemble{}.Rewards(ep)
	var got []string
	for _, s := range ep.Actor {
		got = append(got, fmt.Sprintf("%s:%v", s.Metadata["ensemble"], s.Reward))
	}
	if want := "rejected:0 chosen:1 agreed:1"; strings.Join(got, " ") != want {
		t.Errorf("rewards %s, want %s", strings.Join(got, " "), want)
	}
}

// TestEnsembleVoteNumberedIDs: the vote of a step whose id starts with a
// digit (a numbered plan, a JSON "id": 1) is filled with its candidates'
// answers, not with its placeholders' text.
func TestEnsembleVoteNumberedIDs(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 3, Tools: []schema.Tool{{Name: "search"}}}.WithDefaults()
	m := mode.Ensemble{}
	for _, text := range []string{
		"1. search(\"capital of France\")\n2. search(\"population of $1\")\n3. join()",
		`{"nodes":[{"id":1,"tool":"search","args":{"query":"capital of France"}},{"id":2,"tool":"search","args":{"query":"population of {1}"},"depends_on":[1]}]}`,
	} {
		msg, err := m.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Turn: 1, Text: text, FinishReason: "stop"}, "", cfg)
		d, ok := msg.(*schema.PlanDAG)
		if err != nil || !ok {
			t.Fatalf("%s: %#v %v", text, msg, err)
		}
		var vote plan.Node
		for _, n := range d.Plan.Nodes {
			if n.ID == "1" {
				vote = n
			}
		}
		if vote.Tool != mode.VoteTool {
			t.Fatalf("%s: node 1 is %+v, want the vote", text, vote)
		}
		filled := plan.Substitute(vote, map[string]string{"1-c1": "Lyon", "1-c2": "Paris", "1-c3": "paris"})
		tool, _ := m.Tool(cfg, mode.VoteTool)
		out, err := m.RunLocal(tool, mode.Node{ID: filled.ID, Tool: filled.Tool, Args: filled.Args})
		if err != nil || out != "Paris" {
			t.Errorf("%s: vote %q %v, want Paris", text, out, err)
		}
	}
}

// TestStreamPlansOnlyForPlans: stream_plans releases a plan_act plan's
// nodes while the planner writes; a mode whose planner output is not such
// a plan (a review, a plan made into candidates) refuses it, naming itself.
func TestStreamPlansOnlyForPlans(t *testing.T) {
	for _, name := range schema.Modes {
		cfg := schema.Config{Mode: name, StreamPlans: true}.WithDefaults()
		err := cfg.Validate()
		switch {
		case name == schema.ModePlanAct && err != nil:
			t.Errorf("%s: %v", name, err)
		case name != schema.ModePlanAct && (err == nil || !strings.Contains(err.Error(), "stream_plans") || !strings.Contains(err.Error(), "mode "+name)):
			t.Errorf("%s with stream_plans: %v, want an error naming the mode", name, err)
		}
	}
}

// TestVerdictIgnoresMentions: an <accept/> quoted in a critique, or
// written in a <think> the length limit cut off (or before a lone </think>
// that closes the template's), is no verdict.
func TestVerdictIgnoresMentions(t *testing.T) {
	cases := []struct {
		text     string
		accept   bool
		critique string
		ok       bool
	}{
		{"<revise>You should not <accept/> this</revise>", false, "You should not <accept/> this", true},
		{"<revise>do not <accept/> yet</revise> <revise>the year is wrong</revise>", false, "the year is wrong", true},
		{"<accept/> <revise>I would <accept/> it if it named the city</revise>", false, "I would <accept/> it if it named the city", true},
		{"<revise>check it</revise> then <accept/>", true, "", true},
		{"<revise>no <accept/> until", false, "", false},
		{"<think>It looks right, so <accept/>", false, "", false},
		{"<revise>wrong</revise><think>maybe <accept/> after all", false, "wrong", true},
		{"I think I'll <accept/> it </think> <revise>the capital moved</revise>", false, "the capital moved", true},
		{"<THINK>x</THINK><accept/>", true, "", true},
	}
	for _, c := range cases {
		accept, critique, ok := mode.Verdict(c.text)
		if accept != c.accept || critique != c.critique || ok != c.ok {
			t.Errorf("Verdict(%q) = %v %q %v, want %v %q %v", c.text, accept, critique, ok, c.accept, c.critique, c.ok)
		}
	}
}

// TestEnsembleCandidatesMarked: only the candidates Expand made are taken
// for candidates: a planned node whose call has an argument named
// "candidate" is shown to the planner like any node, and a plan may not
// use the argument that marks candidates.
func TestEnsembleCandidatesMarked(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 2, Tools: []schema.Tool{{Name: "search"}, {Name: "poll", Kind: schema.ToolHTTP, URL: "http://p"}}}.WithDefaults()
	m := mode.Ensemble{}
	nodes := mode.Expand([]plan.Node{
		{ID: "s1", Tool: "search", Args: map[string]any{"query": "capital of France"}, Deps: []string{}},
		{ID: "p1", Tool: "poll", Args: map[string]any{"query": "favourite city", "candidate": "Alice"}, Deps: []string{}},
		{ID: "p2-c1", Tool: "poll", Args: map[string]any{"query": "favourite city", "candidate": 1}, Deps: []string{}},
	}, cfg)
	r := &schema.Run{Turn: 1}
	for _, n := range nodes {
		r.Nodes = append(r.Nodes, &schema.NodeState{Node: n, Status: schema.NodeDone, Output: "Paris"})
	}
	// The run as the act-dispatcher reads it back.
	b, err := schema.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	r = &schema.Run{}
	if err := schema.Unmarshal(b, r); err != nil {
		t.Fatal(err)
	}
	obs := m.Observation(r, cfg)
	for _, want := range []string{`s1 search("capital of France") -> Paris`, `p1 poll("favourite city") -> Paris`, `p2-c1 poll("favourite city") -> Paris`} {
		if !strings.Contains(obs, want) {
			t.Errorf("vote observation lacks %q:\n%s", want, obs)
		}
	}
	if strings.Contains(obs, "s1-c1") {
		t.Errorf("vote observation shows a candidate:\n%s", obs)
	}
	pick := cfg
	pick.EnsemblePick = schema.EnsemblePickPlanner
	r.Nodes = nil
	for _, n := range mode.Expand(nodes[3:5], pick) { // p1 and p2-c1 as they were planned
		r.Nodes = append(r.Nodes, &schema.NodeState{Node: n, Status: schema.NodeDone, Output: "Paris"})
	}
	if obs := m.Observation(r, pick); strings.Contains(obs, "<candidates") {
		t.Errorf("pick observation offers an HTTP node as a candidate:\n%s", obs)
	}
	msg, err := m.Parse(context.Background(), &schema.PlanOutput{Turn: 1, FinishReason: "stop",
		Text: `{"nodes":[{"id":"s1","tool":"search","args":{"query":"x","` + mode.CandidateArg + `":1}}]}`}, "", cfg)
	if pe, ok := msg.(*schema.PlanError); err != nil || !ok || !strings.Contains(pe.Message, mode.CandidateArg) {
		t.Errorf("a plan using %s: %#v %v, want an error naming it", mode.CandidateArg, msg, err)
	}
}

// TestEnsembleGoToolsNotMultiplied: only the actor model's acts become
// candidates; a Go tool, like an HTTP one, runs once, and a step of the
// actor model may use its result in the same plan with ensemble_pick
// planner.
func TestEnsembleGoToolsNotMultiplied(t *testing.T) {
	for _, pick := range schema.EnsemblePicks {
		cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 2, EnsemblePick: pick,
			Tools: []schema.Tool{{Name: "search"}, {Name: "kb", Kind: schema.ToolGo}}}.WithDefaults()
		text := `<graph>
<node id="k1">kb("France")</node>
<node id="s1" depends="k1">search("capital of {k1}")</node>
</graph>`
		msg, err := mode.Ensemble{}.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Turn: 1, Text: text, FinishReason: "stop"}, "", cfg)
		d, ok := msg.(*schema.PlanDAG)
		if err != nil || !ok {
			t.Fatalf("%s: %#v %v, want a plan", pick, msg, err)
		}
		var ids []string
		for _, n := range d.Plan.Nodes {
			ids = append(ids, n.ID+":"+n.Tool)
		}
		want := "k1:kb s1-c1:search s1-c2:search s1:vote"
		if pick == schema.EnsemblePickPlanner {
			want = "k1:kb s1-c1:search s1-c2:search"
		}
		if got := strings.Join(ids, " "); got != want {
			t.Errorf("%s: expanded to %s, want %s", pick, got, want)
		}
	}
}

// TestEnsembleToolNamedVote: the votes of mode ensemble are acts of the
// tool "vote", which the mode runs itself. A rollout that declared a tool
// of its own by that name had every act of it taken for a vote (failing
// with "no candidate answers", or counted as one in the rewards), the tool
// never called; such a config is refused at arrival, naming the tool.
func TestEnsembleToolNamedVote(t *testing.T) {
	for _, kind := range []string{schema.ToolActor, schema.ToolHTTP, schema.ToolGo} {
		tl := schema.Tool{Name: mode.VoteTool, Kind: kind}
		if kind == schema.ToolHTTP {
			tl.URL = "http://votes.example/v"
		}
		cfg := schema.Config{Mode: schema.ModeEnsemble, Tools: []schema.Tool{{Name: "search"}, tl}}.WithDefaults()
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), `tool "vote"`) || !strings.Contains(err.Error(), "mode ensemble") {
			got, _ := mode.Ensemble{}.Tool(cfg, mode.VoteTool)
			t.Errorf("kind %s: Validate = %v (the act would run as %+v); want an error naming the tool and the mode", kind, err, got)
		}
		// Other modes have no vote: the name is the rollout's.
		cfg.Mode, cfg.EnsembleK, cfg.EnsemblePick = schema.ModePlanAct, 0, ""
		if err := cfg.Validate(); err != nil {
			t.Errorf("kind %s, plan_act: %v", kind, err)
		}
	}
}

// TestPeerReviewRevisionsAreCallsOfTheirOwn: the act-dispatcher answers a
// call an episode made before (the same tool and arguments) from its
// result, without the engine. A reviewer that repeats its critique of an
// answer the actor repeated used to ask for the very call of the turn
// before: the "revision" was that answer again, no generation and no
// sample, and so every turn after it until max_turns. Each revision is a
// call of its own, its prompt unchanged.
func TestPeerReviewRevisionsAreCallsOfTheirOwn(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModePeerReview, MaxTurns: 6}.WithDefaults()
	m := mode.PeerReview{}
	obs := "\n<observation>\nAnswer: Nairobi\n</observation>\n"
	var calls []string
	var prompts []string
	for _, turn := range []int{2, 3} {
		msg, err := m.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Turn: turn, Text: "<revise>check the capital</revise>", FinishReason: engine.FinishStop}, obs, cfg)
		d, ok := msg.(*schema.PlanDAG)
		if err != nil || !ok || len(d.Plan.Nodes) != 1 {
			t.Fatalf("turn %d: %#v %v", turn, msg, err)
		}
		n := d.Plan.Nodes[0]
		args, err := json.Marshal(n.Args) // the act-dispatcher's call key: tool and arguments
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, n.Tool+" "+string(args))
		prompts = append(prompts, m.ActorPrompt(schema.Task{Prompt: "Capital of Ethiopia?"}, schema.Tool{Name: n.Tool}, mode.Node{ID: n.ID, Tool: n.Tool, Args: n.Args}, n.Input()))
		if n.Input() != "check the capital" {
			t.Errorf("turn %d: input %q", turn, n.Input())
		}
	}
	if calls[0] == calls[1] {
		t.Errorf("the revisions of turns 2 and 3 are one call, %s: the second would replay the first", calls[0])
	}
	if prompts[0] != prompts[1] || strings.Contains(prompts[0], "3") {
		t.Errorf("the actor's prompt changed with the turn:\n%s\n%s", prompts[0], prompts[1])
	}
}

// TestEnsembleChosenCountsCachedCandidates: the vote takes the earliest
// candidate agreeing with it among all that answered. One answered from
// the cache has no sample, and the label "chosen" went to the next agreeing
// candidate with a sample, which the vote did not take.
func TestEnsembleChosenCountsCachedCandidates(t *testing.T) {
	cached := &schema.ActDone{Turn: 1, NodeID: "s1-c1", Output: "Paris", Status: schema.ActCached}
	acts := []*schema.ActDone{
		{Turn: 1, NodeID: "s1-c2", Output: "paris", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c3", Output: "Lyon", Status: schema.ActDoneOK},
	}
	vote := &schema.ActDone{Turn: 1, NodeID: "s1", Tool: mode.VoteTool, Output: "Paris", Status: schema.ActDoneOK}
	ep := &mode.Episode{Score: 1, Acts: acts, Outcomes: []*schema.ActDone{cached, acts[0], acts[1], vote},
		Actor: []schema.Sample{{Reward: 1}, {Reward: 1}}}
	mode.Ensemble{}.Rewards(ep)
	var got []string
	for _, s := range ep.Actor {
		got = append(got, fmt.Sprintf("%s:%v", s.Metadata["ensemble"], s.Reward))
	}
	if want := "agreed:1 rejected:0"; strings.Join(got, " ") != want {
		t.Errorf("rewards %s, want %s (c1, from the cache, is the one the vote took)", strings.Join(got, " "), want)
	}
}

package mode_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

// TestEnsembleVoteEmpty: an empty (or white space) candidate answer is no
// answer: it has no vote and is never picked, however many candidates
// gave it; a vote among empty answers only fails, saying so.
func TestEnsembleVoteEmpty(t *testing.T) {
	for _, c := range []struct {
		answers []string
		want    int
	}{
		{[]string{"", "", "Lyon"}, 2},
		{[]string{" ", "\n\t", "Lyon", "Paris", "paris"}, 3},
		{[]string{"", "Lyon", ""}, 1},
		{[]string{"", " ", "\n"}, -1},
		{[]string{"", "..."}, 1}, // normalised, "..." is empty too, yet it was an answer
	} {
		if got := mode.Vote(c.answers); got != c.want {
			t.Errorf("Vote(%q) = %d, want %d", c.answers, got, c.want)
		}
	}

	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 3, Tools: []schema.Tool{{Name: "search"}}}.WithDefaults()
	m := mode.Ensemble{}
	var vote plan.Node
	for _, n := range mode.Expand([]plan.Node{{ID: "s1", Tool: "search", Args: map[string]any{"query": "capital of France"}, Deps: []string{}}}, cfg) {
		if n.Tool == mode.VoteTool {
			vote = n
		}
	}
	tool, _ := m.Tool(cfg, mode.VoteTool)
	run := func(outs ...string) (string, error) {
		filled := plan.Substitute(vote, map[string]string{"s1-c1": outs[0], "s1-c2": outs[1], "s1-c3": outs[2]})
		return m.RunLocal(tool, mode.Node{ID: filled.ID, Tool: filled.Tool, Args: filled.Args})
	}
	if out, err := run("", " ", "Lyon"); err != nil || out != "Lyon" {
		t.Errorf("vote among two empty answers and Lyon: %q %v, want Lyon", out, err)
	}
	for _, outs := range [][]string{{"", "", ""}, {" ", "\n", "\t "}} {
		out, err := run(outs...)
		if err == nil || !strings.Contains(err.Error(), "vote s1") || !strings.Contains(err.Error(), "answers were empty") {
			t.Errorf("vote among %q: %q %v, want an error naming the vote and the empty answers", outs, out, err)
		}
	}
}

// TestEnsembleRewardsEmpty: an empty candidate never agrees with the
// answer picked, and is never chosen; a step whose vote picked nothing (it
// failed on empty answers, or a vote recorded before an empty answer was
// none "picked" "") leaves every candidate unpicked, none chosen.
func TestEnsembleRewardsEmpty(t *testing.T) {
	for _, c := range []struct {
		name string
		outs []string
		vote *schema.ActDone
		want string
	}{
		{"picked", []string{"", "...", " "}, &schema.ActDone{Output: "...", Status: schema.ActDoneOK}, "rejected:0 chosen:1 rejected:0"},
		{"vote failed", []string{"", " ", ""}, &schema.ActDone{Status: schema.ActFailed, Error: "vote s1: the candidates' answers were empty (all 3): there is no answer to pick"}, "unpicked:0 unpicked:0 unpicked:0"},
		{"empty picked", []string{"", "", "Lyon"}, &schema.ActDone{Output: "", Status: schema.ActDoneOK}, "unpicked:0 unpicked:0 unpicked:0"},
	} {
		var acts []*schema.ActDone
		for i, out := range c.outs {
			acts = append(acts, &schema.ActDone{Turn: 1, NodeID: fmt.Sprintf("s1-c%d", i+1), Tool: "search", Output: out, Status: schema.ActDoneOK})
		}
		c.vote.Turn, c.vote.NodeID, c.vote.Tool = 1, "s1", mode.VoteTool
		ep := &mode.Episode{Score: 1, Acts: acts, Outcomes: append(append([]*schema.ActDone(nil), acts...), c.vote),
			Actor: []schema.Sample{{Reward: 1}, {Reward: 1}, {Reward: 1}}}
		mode.Ensemble{}.Rewards(ep)
		var got []string
		for _, s := range ep.Actor {
			got = append(got, fmt.Sprintf("%s:%v", s.Metadata["ensemble"], s.Reward))
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s: rewards %s, want %s", c.name, strings.Join(got, " "), c.want)
		}
	}
}

// TestEnsemblePickEmpty: with ensemble_pick planner an empty candidate is
// not offered to pick (a step whose candidates all answered nothing is not
// listed), and a pick of one, offered by an observation recorded before,
// chooses nothing.
func TestEnsemblePickEmpty(t *testing.T) {
	cfg := pickConfig()
	m := mode.Ensemble{}
	cand := func(id string, n int, out string) *schema.NodeState {
		return &schema.NodeState{Node: plan.Node{ID: id, Tool: "search", Args: map[string]any{"query": "q", mode.CandidateArg: n}}, Status: schema.NodeDone, Output: out}
	}
	obs := m.Observation(&schema.Run{Turn: 1, Nodes: []*schema.NodeState{
		cand("s1-c1", 1, ""), cand("s1-c2", 2, "Paris"), cand("s1-c3", 3, " \n"),
		cand("s2-c1", 1, ""), cand("s2-c2", 2, "\t"), cand("s2-c3", 3, ""),
	}}, cfg)
	if !strings.Contains(obs, "Pick one candidate of each step: <candidates node=\"s1\" turn=\"1\">2</candidates>\n") || strings.Contains(obs, `node="s2"`) {
		t.Errorf("observation offers empty candidates:\n%s", obs)
	}

	// Recorded before: the observation offered the empty s1-c1, and the
	// planner picked it.
	old := "\n<observation>\nPick one candidate of each step: <candidates node=\"s1\" turn=\"1\">1 2</candidates>\n</observation>\n"
	last := &schema.PlanOutput{Turn: 2, Text: `<pick node="s1">1</pick><answer>x</answer>`, Segments: []schema.Segment{
		{Kind: schema.SegObservation, Turn: 2, Text: old},
		{Kind: schema.SegGenerated, Turn: 2, Text: `<pick node="s1">1</pick><answer>x</answer>`},
	}}
	acts := []*schema.ActDone{
		{Turn: 1, NodeID: "s1-c1", Tool: "search", Output: "", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c2", Tool: "search", Output: "Paris", Status: schema.ActDoneOK},
	}
	ep := &mode.Episode{Config: cfg, Score: 1, Last: last, Acts: acts, Outcomes: acts, Actor: []schema.Sample{{Reward: 1}, {Reward: 1}}}
	m.Rewards(ep)
	var got []string
	for _, s := range ep.Actor {
		got = append(got, fmt.Sprintf("%s:%v", s.Metadata["ensemble"], s.Reward))
	}
	if want := "unpicked:0 unpicked:0"; strings.Join(got, " ") != want {
		t.Errorf("rewards after picking an empty candidate: %s, want %s", strings.Join(got, " "), want)
	}
}

package mode_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/engine"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/schema"
)

// A planned HTTP node whose id reads as a candidate's ("s1-c1" beside the
// candidates s1-c1_, s1-c2, s1-c3) is no candidate: its output, the same
// as the vote's, must not make it the one the vote took.
func TestEnsembleVoteRewardsPlannedLookalike(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 3,
		Tools: []schema.Tool{{Name: "search"}, {Name: "wiki", Kind: schema.ToolHTTP, URL: "http://w"}}}.WithDefaults()
	acts := []*schema.ActDone{
		{Turn: 1, NodeID: "s1-c1_", Tool: "search", Output: "Lyon", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c2", Tool: "search", Output: "Paris", Status: schema.ActDoneOK},
		{Turn: 1, NodeID: "s1-c3", Tool: "search", Output: "paris", Status: schema.ActDoneOK},
	}
	outcomes := append(append([]*schema.ActDone(nil), acts...),
		&schema.ActDone{Turn: 1, NodeID: "s1-c1", Tool: "wiki", Output: "Paris", Status: schema.ActDoneOK},
		&schema.ActDone{Turn: 1, NodeID: "s1", Tool: mode.VoteTool, Output: "Paris", Status: schema.ActDoneOK})
	ep := &mode.Episode{Config: cfg, Score: 1, Acts: acts, Outcomes: outcomes, Actor: []schema.Sample{{Reward: 1}, {Reward: 1}, {Reward: 1}}}
	mode.Ensemble{}.Rewards(ep)
	var got []string
	for _, s := range ep.Actor {
		got = append(got, fmt.Sprintf("%s:%v", s.Metadata["ensemble"], s.Reward))
	}
	if want := "rejected:0 chosen:1 agreed:1"; strings.Join(got, " ") != want {
		t.Errorf("rewards %s, want %s (the wiki node s1-c1 is no candidate)", strings.Join(got, " "), want)
	}
}

// accepted says what the episode ended with: a review whose <accept/> was
// refused (the attempt it accepted failed) accepted nothing.
func TestPeerReviewAcceptedRefused(t *testing.T) {
	for _, c := range []struct {
		status string
		want   bool
	}{
		{schema.EpisodeCompleted, true},
		{schema.EpisodeFailed, false},
		{schema.EpisodeTruncated, false},
	} {
		ep := &mode.Episode{End: &schema.EpisodeEnd{Status: c.status}, Last: &schema.PlanOutput{Text: "<accept/>"},
			Planner: &schema.Sample{}, Actor: []schema.Sample{{}}}
		mode.PeerReview{}.Rewards(ep)
		if got := ep.Planner.Metadata["accepted"]; got != c.want {
			t.Errorf("episode %s ended by an <accept/>: accepted %v, want %v", c.status, got, c.want)
		}
		if ep.Planner.Reward != 0 && c.status != schema.EpisodeCompleted {
			t.Errorf("episode %s: planner reward %v, want 0", c.status, ep.Planner.Reward)
		}
	}
}

// A reviewer whose engine stops on "</revise>" (a stop string, stripped
// from the text) wrote a critique: it is read as one, as plan_act reads an
// answer cut at "</answer>".
func TestPeerReviewStopsOnReviseClose(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModePeerReview, MaxTurns: 4}.WithDefaults()
	cfg.PlannerSampling.Stop = []string{"</revise>"}
	obs := "\n<observation>\nAnswer: Lyon\n</observation>\n"
	for _, c := range []struct {
		text, finish string
		want         string
	}{
		{"<revise>Lyon is not the capital", engine.FinishStop, "revise: Lyon is not the capital"},
		{"<revise>a</revise> no, <revise>b", engine.FinishStop, "revise: b"},
		{"<revise>Lyon is not the capital", engine.FinishLength, "error"},      // cut by the length limit: no stop string was stripped
		{"<revise>Lyon is not the capital", "", "error"},                       // no finish reason said: nothing was stripped
		{"<think><revise>maybe</think><accept/>", engine.FinishStop, "accept"}, // nothing left open outside <think>
	} {
		out := &schema.PlanOutput{Rollout: 1, Episode: 0, Turn: 2, Text: c.text, FinishReason: c.finish}
		msg, err := mode.PeerReview{}.Parse(context.Background(), out, obs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		switch v := msg.(type) {
		case *schema.PlanDAG:
			got = "revise: " + fmt.Sprint(v.Plan.Nodes[0].Args["critique"])
		case *schema.PlanAnswer:
			got = "accept"
		case *schema.PlanError:
			got = "error"
		}
		if got != c.want {
			t.Errorf("%q (finish %q): %s, want %s (%+v)", c.text, c.finish, got, c.want, msg)
		}
	}
}

// A pick the planner weighed in its <think> (a tag opened there, closed
// only by its real pick after the </think>) leaves its reply whole: taking
// the picks out must not swallow the </think>, which would leave the
// answer inside a <think> never closed.
func TestEnsemblePickWeighedInThink(t *testing.T) {
	cfg := pickConfig()
	obs := mode.Ensemble{}.Observation(pickRun(), cfg)
	for _, text := range []string{
		`<think>maybe <pick node="s1">1 or 3</think><pick node="s1">3</pick><answer>Paris</answer>`,
		`<think>I will write <pick node="s1"></think><pick node="s1">3</pick> <answer>Paris</answer>`,
		`<pick node="s1">3</pick><think>then <pick node="s1"></think><answer>Paris</answer>`,
	} {
		msg, err := mode.Ensemble{}.Parse(context.Background(), &schema.PlanOutput{Rollout: 1, Turn: 3, Text: text, FinishReason: engine.FinishStop}, obs, cfg)
		if a, ok := msg.(*schema.PlanAnswer); err != nil || !ok || a.Answers[0] != "Paris" {
			t.Errorf("%q: %+v %v, want the answer Paris", text, msg, err)
		}
	}
}

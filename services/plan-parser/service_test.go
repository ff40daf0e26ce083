package planparser

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
)

func TestParsePartial(t *testing.T) {
	cfg := schema.DefaultConfig()
	const head = `<graph><node id="s1">search("capital of France")</node>`
	cases := []struct {
		name string
		text string
		want []string // node ids of the partial DAG; nil: none is published
	}{
		{"cut inside the second node", head + `<node id="s2" depends="s1">search("population of {s1`, []string{"s1"}},
		{"two complete nodes", head + `<node id="s2" depends="s1">search("population of {s1}")</node>`, []string{"s1", "s2"}},
		{"no complete node yet", `<graph><node id="s1">search("capi`, nil},
		{"nothing yet", ``, nil},
		{"a task list before its tool calls", "<plan>\nT1: Find the capital of France - Dependencies: none\nT2: Find its population - Dependencies: T1\n</plan>\n", nil},
		{"a task list with its first call", "<plan>\nT1: Find the capital of France - Dependencies: none\nT2: Find its population - Dependencies: T1\n</plan>\n<search>capital of France</search>\n", []string{"T1"}},
		{"an answer is for the final output to decide", `<answer>Paris</answer>`, nil},
		{"an error is for the final output to decide", `<graph><node id="s1">fly("to Paris")</node>`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pp := &schema.PlanPartial{Rollout: 7, Episode: 2, Turn: 3, Seq: 4, Text: tc.text}
			d := ParsePartial(pp, cfg)
			if tc.want == nil {
				if d != nil {
					t.Fatalf("published a partial DAG with %d nodes, want none", len(d.Plan.Nodes))
				}
				return
			}
			if d == nil {
				t.Fatal("no partial DAG")
			}
			var ids []string
			for _, n := range d.Plan.Nodes {
				ids = append(ids, n.ID)
			}
			if !reflect.DeepEqual(ids, tc.want) {
				t.Errorf("nodes %v, want %v", ids, tc.want)
			}
			if !d.Partial || d.Seq != 4 || d.Rollout != 7 || d.Episode != 2 || d.Turn != 3 {
				t.Errorf("partial %v seq %d turn %d.%d.%d, want a partial DAG #4 of turn 7.2.3", d.Partial, d.Seq, d.Rollout, d.Episode, d.Turn)
			}
			final := Parse(&schema.PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: tc.text, FinishReason: "stop"}, cfg)
			if final.MsgID() == d.MsgID() {
				t.Errorf("the partial DAG's message id %q is the final one's: the final DAG would be dropped as a duplicate", d.MsgID())
			}
			if want := (&schema.PlanDAG{Rollout: 7, Episode: 2, Turn: 3}).Subject(); d.Subject() != want {
				t.Errorf("subject %s, want the DAG subject %s", d.Subject(), want)
			}
		})
	}
}

func TestParseStopString(t *testing.T) {
	cfg := schema.DefaultConfig()
	cfg.PlannerSampling.Stop = []string{"</answer>"}
	for _, tc := range []struct {
		finish string
		answer bool
	}{
		{"stop", true},    // the engine stopped on "</answer>" and stripped it
		{"length", false}, // cut off: the answer was never closed
	} {
		msg := Parse(&schema.PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: "I know it now.\n<answer>Paris", FinishReason: tc.finish}, cfg)
		a, ok := msg.(*schema.PlanAnswer)
		if ok != tc.answer || ok && !reflect.DeepEqual(a.Answers, []string{"Paris"}) {
			t.Errorf("finish %s: got %#v, want an answer: %v", tc.finish, msg, tc.answer)
		}
	}
}

func TestParseContextStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	text := strings.Repeat(`<node id="s1">search(x{}}}}}}}}}}}}}</node><t1>`, 1<<16)
	msg, err := ParseContext(ctx, &schema.PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: text, FinishReason: "stop"}, schema.DefaultConfig())
	if !errors.Is(err, context.Canceled) || msg != nil {
		t.Fatalf("got %v, %v; want no message and context.Canceled", msg, err)
	}
	d, err := parsePartial(ctx, &schema.PlanPartial{Rollout: 7, Episode: 2, Turn: 3, Text: text}, schema.DefaultConfig())
	if !errors.Is(err, context.Canceled) || d != nil {
		t.Fatalf("partial: got %v, %v; want nothing and context.Canceled", d, err)
	}
}

// TestPeerReviewAfterParseError: a review that follows a parse error (the
// reviewer wrote prose, and was told so under parse_error_policy
// reprompt) reviews the answer shown before the error: <accept/> accepts
// it, <revise> sends it to the actor as the previous answer, and a
// <revise> at max_turns ends the episode with it.
func TestPeerReviewAfterParseError(t *testing.T) {
	cfg := schema.Config{Mode: schema.ModePeerReview, MaxTurns: 3}.WithDefaults()
	md := mode.PeerReview{}
	answer := md.Observation(&schema.Run{Nodes: []*schema.NodeState{{Node: plan.Node{ID: "attempt"}, Status: schema.NodeDone, Output: "Addis Ababa"}}}, cfg)
	segs := []schema.Segment{
		{Kind: schema.SegPrompt, Turn: 2, Text: md.PlannerPrompt(schema.Task{Prompt: "Capital of Ethiopia?"}, cfg)},
		{Kind: schema.SegObservation, Turn: 2, Text: answer},
		{Kind: schema.SegGenerated, Turn: 2, Text: "It looks right to me."},
		{Kind: schema.SegObservation, Turn: 3, Text: mode.ErrorObservation("a review is <accept/> or <revise>what is wrong</revise>; found neither")},
	}
	parse := func(turn int, review string) schema.Message {
		t.Helper()
		out := &schema.PlanOutput{Rollout: 1, Episode: 0, Turn: turn, Text: review, FinishReason: "stop",
			Segments: append(slices.Clone(segs), schema.Segment{Kind: schema.SegGenerated, Turn: turn, Text: review})}
		msg, err := ParseContext(context.Background(), out, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	if a, ok := parse(2, "<accept/>").(*schema.PlanAnswer); !ok || !reflect.DeepEqual(a.Answers, []string{"Addis Ababa"}) {
		t.Errorf("accept: %#v, want the answer Addis Ababa", parse(2, "<accept/>"))
	}
	if d, ok := parse(2, "<revise>check it</revise>").(*schema.PlanDAG); !ok || d.Plan.Nodes[0].Args["previous"] != "Addis Ababa" {
		t.Errorf("revise: %#v, want a revision of Addis Ababa", parse(2, "<revise>check it</revise>"))
	}
	if a, ok := parse(3, "<revise>check it</revise>").(*schema.PlanAnswer); !ok || !reflect.DeepEqual(a.Answers, []string{"Addis Ababa"}) {
		t.Errorf("revise at max_turns: %#v, want the end with Addis Ababa", parse(3, "<revise>check it</revise>"))
	}
	// A failed attempt after the answer is what is under review then.
	failed := md.Observation(&schema.Run{Nodes: []*schema.NodeState{{Node: plan.Node{ID: "revision"}, Status: schema.NodeFailed, Error: "act timed out"}}}, cfg)
	segs = append(segs, schema.Segment{Kind: schema.SegGenerated, Turn: 3, Text: "<revise>x</revise>"}, schema.Segment{Kind: schema.SegObservation, Turn: 4, Text: failed})
	if pe, ok := parse(4, "<accept/>").(*schema.PlanError); !ok || !strings.Contains(pe.Message, "no answer to accept") {
		t.Errorf("accept of a failed attempt: %#v", parse(4, "<accept/>"))
	}
}

// TestParsePartialPlansOnly: a streamed output is parsed for early nodes
// only in a mode whose planner writes plan_act plans (a config from before
// schema.Config.Validate refused stream_plans for the others).
func TestParsePartialPlansOnly(t *testing.T) {
	text := `<graph><node id="s1">search("capital of France")</node>` + "\n"
	for _, c := range []struct {
		mode string
		want bool
	}{{schema.ModePlanAct, true}, {schema.ModePeerReview, false}, {schema.ModeEnsemble, false}} {
		cfg := schema.DefaultConfig()
		cfg.Mode, cfg.StreamPlans = c.mode, true
		if d := ParsePartial(&schema.PlanPartial{Rollout: 7, Turn: 2, Seq: 1, Text: text}, cfg); (d != nil) != c.want {
			t.Errorf("%s: partial DAG %v, want one: %v", c.mode, d, c.want)
		}
	}
}

// TestParsePartialWaitingTasksWithActorTool: a task of a streamed task
// list whose tool call is still to come is not released, even when the
// rollout has a tool named like the default tool ("actor"): the call that
// comes may give it another tool and other arguments.
func TestParsePartialWaitingTasksWithActorTool(t *testing.T) {
	cfg := schema.DefaultConfig()
	cfg.Tools = append(cfg.Tools, schema.Tool{Name: plan.DefaultTool, Kind: schema.ToolActor})
	const tasks = "<plan>\nT1: Find the capital of France - Dependencies: none\nT2: Find its population - Dependencies: T1\n</plan>\n"
	cases := []struct {
		text string
		want []string
	}{
		{tasks, nil},
		{tasks + "<search>capital of France</search>\n", []string{"T1"}},
		{tasks + "<search>capital of France|population of {T1}</search>\n", []string{"T1", "T2"}},
	}
	for _, tc := range cases {
		d := ParsePartial(&schema.PlanPartial{Rollout: 7, Episode: 2, Turn: 3, Seq: 1, Text: tc.text}, cfg)
		var got []string
		if d != nil {
			for _, n := range d.Plan.Nodes {
				if n.Tool != "search" {
					t.Errorf("%q: released %s with tool %q before its call", tc.text, n.ID, n.Tool)
				}
				got = append(got, n.ID)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: released %v, want %v", tc.text, got, tc.want)
		}
	}
	// The final output of a task list without calls runs the tool named
	// like the default tool.
	final := Parse(&schema.PlanOutput{Rollout: 7, Episode: 2, Turn: 3, Text: tasks, FinishReason: "stop"}, cfg)
	if d, ok := final.(*schema.PlanDAG); !ok || len(d.Plan.Nodes) != 2 || d.Plan.Nodes[0].Tool != plan.DefaultTool {
		t.Errorf("final output: %+v, want a DAG of two %s nodes", final, plan.DefaultTool)
	}
}

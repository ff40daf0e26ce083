package actdispatcher

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/mode"
	"github.com/planact/planact/pkg/plan"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// ensembleCfg is an ensemble rollout's config: three candidates per act of
// the actor (tool search; kb is an HTTP tool, asked once), picked as pick
// says, failures handled as policy says.
func ensembleCfg(pick, policy string) schema.Config {
	return schema.Config{Mode: schema.ModeEnsemble, EnsembleK: 3, EnsemblePick: pick, FailurePolicy: policy, Schedule: schema.ScheduleEager,
		MaxTurns: 5, ActTimeoutS: 30, ActRetries: 3, Tools: []schema.Tool{{Name: "search"}, {Name: "kb", Kind: schema.ToolHTTP, URL: "http://kb.invalid"}}}.WithDefaults()
}

// ensembleRun is turn 1 of a plan of step x (expanded as the plan-parser
// does) and, with a vote, a step y that needs x's answer; z, of an HTTP
// tool, stands apart.
func ensembleRun(t *testing.T, cfg schema.Config) *schema.Run {
	t.Helper()
	z := search("z", "capital of Peru")
	z.Tool = "kb"
	nodes := []plan.Node{search("x", "capital of France"), z}
	if cfg.EnsemblePick == schema.EnsemblePickVote {
		nodes = append(nodes, search("y", "population of {x}", "x"))
	}
	return newRun(planDAG(1, false, 1, mode.Expand(nodes, cfg)...), cfg.Schedule)
}

// end records the outcome of node id (failed when status is NodeFailed).
func end(r *schema.Run, id, status, output string) {
	n := byID(r)[id]
	n.Status, n.Output = status, output
	if status == schema.NodeFailed {
		n.Error = "act timed out"
	}
}

// A vote runs among the candidates that answered: one candidate that
// failed does not skip it, and has no vote. Before, the failure skipped
// the vote ("dependency x-c1 failed") and the step that needs it, though
// two candidates had answered. Only when no candidate answers is it
// skipped.
func TestAVoteRunsAmongTheCandidatesThatAnswered(t *testing.T) {
	vote := mode.Ensemble{}
	tool, _ := vote.Tool(ensembleCfg(schema.EnsemblePickVote, schema.PolicySkip), mode.VoteTool)
	for _, c := range []struct {
		name     string
		outcomes [][2]string // x-c1…x-c3: status, output
		want     string      // the vote's answer; "" when it is skipped
		wantErr  string      // what the vote's failure says
	}{
		{"one failed", [][2]string{{schema.NodeFailed, ""}, {schema.NodeDone, "Paris"}, {schema.NodeDone, "paris."}}, "Paris", ""},
		{"a tie among those that answered", [][2]string{{schema.NodeFailed, ""}, {schema.NodeDone, "Lyon"}, {schema.NodeDone, "Paris"}}, "Lyon", ""},
		{"two failed", [][2]string{{schema.NodeFailed, ""}, {schema.NodeFailed, ""}, {schema.NodeCached, "Paris"}}, "Paris", ""},
		{"the others empty", [][2]string{{schema.NodeFailed, ""}, {schema.NodeDone, ""}, {schema.NodeDone, " "}}, "", "(all 2 that answered; 1 failed)"},
		{"all failed", [][2]string{{schema.NodeFailed, ""}, {schema.NodeFailed, ""}, {schema.NodeFailed, ""}}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ensembleRun(t, ensembleCfg(schema.EnsemblePickVote, schema.PolicySkip))
			if got, _ := advance(r, nil); !reflect.DeepEqual(keys(got), []string{"x-c1", "x-c2", "x-c3", "z"}) {
				t.Fatalf("released %v, want the candidates and z", keys(got))
			}
			x := byID(r)["x"]
			for i, o := range c.outcomes[:2] {
				end(r, "x-c"+string(rune('1'+i)), o[0], o[1])
				if got, _ := advance(r, nil); len(got) != 0 || x.Status != schema.NodePending {
					t.Fatalf("after x-c%d %s: released %v, the vote %s (%s); want it pending until every candidate ended", i+1, o[0], keys(got), x.Status, x.Error)
				}
			}
			end(r, "x-c3", c.outcomes[2][0], c.outcomes[2][1])
			got, _ := advance(r, nil)
			if c.want == "" && c.wantErr == "" {
				if len(got) != 0 || x.Status != schema.NodeSkipped || x.Error != "no candidate answered (x-c1 failed, x-c2 failed, x-c3 failed)" {
					t.Fatalf("released %v, the vote %s (%s); want it skipped: no candidate answered", keys(got), x.Status, x.Error)
				}
				if y := byID(r)["y-c1"]; y.Status != schema.NodeSkipped {
					t.Errorf("y-c1 %s: want skipped with x's vote", y.Status)
				}
				return
			}
			if !reflect.DeepEqual(keys(got), []string{"x"}) {
				t.Fatalf("released %v, the vote %s (%s); want the vote", keys(got), x.Status, x.Error)
			}
			out, err := vote.RunLocal(tool, mode.Node{ID: x.Node.ID, Tool: x.Node.Tool, Args: x.Node.Args})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("the vote: %q, %v; want an error saying %q", out, err, c.wantErr)
				}
				return
			}
			if err != nil || out != c.want {
				t.Fatalf("the vote picked %q (%v), want %q: a failed candidate has no vote", out, err, c.want)
			}
			end(r, "x", schema.NodeDone, out)
			if got, _ := advance(r, nil); !reflect.DeepEqual(keys(got), []string{"y-c1", "y-c2", "y-c3"}) || byID(r)["y-c1"].Input != "population of "+c.want {
				t.Fatalf("released %v (y-c1's input %q), want y's candidates with the answer picked", keys(got), byID(r)["y-c1"].Input)
			}
		})
	}
}

// Under a policy that stops a turn at its first failure (replan, fail),
// a candidate that fails stops nothing while its siblings may answer: the
// vote waits for them, and runs among those that answered. Before, the
// first failed candidate skipped the vote, and every node still pending.
// A step left without an answer stops the turn as a failed act does; so
// does a candidate refused as stale. (With a vote, candidates that all
// answered nothing leave the vote to fail.)
func TestACandidatesFailureStopsTheTurnOnlyWhenItsStepHasNoAnswer(t *testing.T) {
	outcome := func(r *schema.Run, id, status string, kind string) *schema.ActDone {
		n := byID(r)[id]
		d := &schema.ActDone{Rollout: 1, Turn: 1, Key: n.Key, NodeID: id, Tool: n.Node.Tool, Status: status, ErrorKind: kind}
		if status == schema.ActFailed {
			d.Error = "act timed out"
		}
		return d
	}
	for _, pick := range []string{schema.EnsemblePickVote, schema.EnsemblePickPlanner} {
		t.Run(pick, func(t *testing.T) {
			cfg := ensembleCfg(pick, schema.PolicyReplan)
			cfg.Schedule = schema.ScheduleSequential // z waits while x's candidates run
			info := testInfo()
			info.Session.Config = cfg
			r := ensembleRun(t, cfg)
			advance(r, nil)
			for _, id := range []string{"x-c2", "x-c3"} {
				byID(r)[id].Status = schema.NodeReleased // as if sequential let them go one by one
			}
			rn := &runner{info: info, known: map[string]*schema.ActDone{}}
			rn.known["t1-x-c1"] = outcome(r, "x-c1", schema.ActFailed, "")
			rn.apply(r)
			for _, n := range r.Nodes {
				if n.Status == schema.NodeSkipped {
					t.Fatalf("after x-c1 failed, %s was skipped (%s): the turn stopped though x-c2 and x-c3 may answer", n.Node.ID, n.Error)
				}
			}
			rn.known["t1-x-c2"] = outcome(r, "x-c2", schema.ActFailed, "")
			rn.known["t1-x-c3"] = outcome(r, "x-c3", schema.ActFailed, "")
			rn.apply(r)
			if z := byID(r)["z"]; z.Status != schema.NodeSkipped || z.Error != "not run: the turn stopped after x-c3 failed" {
				t.Fatalf("z %s (%s): want skipped once no candidate of x answered", z.Status, z.Error)
			}

			// Every candidate answered nothing: the step has no answer to
			// pick, and stops the turn; with a vote, the vote decides (it
			// fails on empty answers).
			r = ensembleRun(t, cfg)
			advance(r, nil)
			rn.known = map[string]*schema.ActDone{}
			for _, id := range []string{"x-c1", "x-c2", "x-c3"} {
				byID(r)[id].Status = schema.NodeReleased
				rn.known["t1-"+id] = outcome(r, id, schema.ActDoneOK, "")
			}
			rn.apply(r)
			z := byID(r)["z"]
			if pick == schema.EnsemblePickVote && z.Status != schema.NodePending {
				t.Fatalf("z %s (%s): want pending, the vote to run", z.Status, z.Error)
			}
			if pick == schema.EnsemblePickPlanner && (z.Status != schema.NodeSkipped || z.Error != "not run: the turn stopped after the candidates of x gave no answer") {
				t.Fatalf("z %s (%s): want skipped, x's candidates having answered nothing", z.Status, z.Error)
			}

			r = ensembleRun(t, cfg)
			advance(r, nil)
			rn.known = map[string]*schema.ActDone{"t1-x-c1": outcome(r, "x-c1", schema.ActFailed, schema.ActErrStale)}
			rn.apply(r)
			if z := byID(r)["z"]; z.Status != schema.NodeSkipped {
				t.Fatalf("z %s: want skipped after a candidate was refused as stale", z.Status)
			}
		})
	}
}

// finishTurn applies failure_policy to the steps that failed. With
// ensemble_pick planner, a step whose candidates all answered nothing is
// one (it has nothing to pick, as one whose candidates all failed): fail
// ends the episode, replan tells the planner. Before, no act of it had
// failed, and the episode went on as if it had answered. A step some of
// whose candidates answered is no failure, with a vote or without: the
// planner picks among them, the vote runs among them. Before, a failed
// candidate ended the episode (fail) however its siblings answered. With
// a vote, a step whose answers are all empty fails by its vote.
func TestFailurePolicyActsOnEnsembleSteps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, pick, policy string
		outcomes           [][2]string // x-c1…x-c3: status, output
		vote               [2]string   // with ensemble_pick vote
		wantEnd            string      // the episode's end reason, "" when it goes on
		wantObs, notObs    string      // what the next turn's observation says, or not
	}{
		{"planner, all empty, fail", schema.EnsemblePickPlanner, schema.PolicyFail,
			[][2]string{{schema.NodeDone, ""}, {schema.NodeDone, " "}, {schema.NodeCached, ""}}, [2]string{},
			"act failed: x-c1: answered nothing; x-c2: answered nothing; x-c3: answered nothing", "", ""},
		{"planner, all empty, replan", schema.EnsemblePickPlanner, schema.PolicyReplan,
			[][2]string{{schema.NodeDone, ""}, {schema.NodeFailed, ""}, {schema.NodeDone, ""}}, [2]string{},
			"", "Some steps failed (x-c1: answered nothing; x-c2: act timed out; x-c3: answered nothing)", "Pick one candidate"},
		{"planner, one failed, fail", schema.EnsemblePickPlanner, schema.PolicyFail,
			[][2]string{{schema.NodeDone, "Paris"}, {schema.NodeFailed, ""}, {schema.NodeDone, ""}}, [2]string{},
			"", `<candidates node="x" turn="1">1</candidates>`, "Some steps failed"},
		{"vote, one failed, fail", schema.EnsemblePickVote, schema.PolicyFail,
			[][2]string{{schema.NodeFailed, ""}, {schema.NodeDone, "Paris"}, {schema.NodeDone, "Paris"}}, [2]string{schema.NodeDone, "Paris"},
			"", `x search("capital of France") -> Paris`, "Some steps failed"},
		{"vote, all empty, fail", schema.EnsemblePickVote, schema.PolicyFail,
			[][2]string{{schema.NodeDone, ""}, {schema.NodeFailed, ""}, {schema.NodeDone, ""}}, [2]string{schema.NodeFailed, ""},
			"act failed: x: act timed out", "", ""}, // the vote's failure is the step's
		{"vote, all failed, replan", schema.EnsemblePickVote, schema.PolicyReplan,
			[][2]string{{schema.NodeFailed, ""}, {schema.NodeFailed, ""}, {schema.NodeFailed, ""}}, [2]string{schema.NodeSkipped, ""},
			"", "Some steps failed (x-c1: act timed out; x-c2: act timed out; x-c3: act timed out)", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, _ := testService(t)
			info := testInfo()
			info.Session.Config = ensembleCfg(c.pick, c.policy)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := ensembleRun(t, info.Session.Config)
			advance(r, nil)
			for i, o := range c.outcomes {
				end(r, "x-c"+string(rune('1'+i)), o[0], o[1])
			}
			if c.pick == schema.EnsemblePickVote {
				advance(r, nil) // the vote released (its arguments the answers), or skipped
				end(r, "x", c.vote[0], c.vote[1])
				for _, id := range []string{"y-c1", "y-c2", "y-c3", "y"} {
					end(r, id, schema.NodeSkipped, "")
				}
			}
			end(r, "z", schema.NodeDone, "Lima")
			r.Finished = true
			if _, err := bus.Create(ctx, s.Bus.Runs, schema.RunKey(1, 0, 1), r); err != nil {
				t.Fatal(err)
			}
			if err := s.finishTurn(ctx, info, r); err != nil {
				t.Fatal(err)
			}
			ended, err := s.Bus.LastMsg(ctx, bus.StreamRollout, subject.EpisodeEnd(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			if c.wantEnd != "" {
				if ended == nil {
					t.Fatalf("the episode goes on; want it ended failed: %s", c.wantEnd)
				}
				if e := episodeEnd(t, s); e.Status != schema.EpisodeFailed || e.Reason != c.wantEnd {
					t.Fatalf("the episode ended %s (%s); want failed (%s)", e.Status, e.Reason, c.wantEnd)
				}
				return
			}
			if ended != nil {
				e := episodeEnd(t, s)
				t.Fatalf("the episode ended %s (%s); want the planner asked again", e.Status, e.Reason)
			}
			obs := nextObservation(t, s)
			if !strings.Contains(obs, c.wantObs) || c.notObs != "" && strings.Contains(obs, c.notObs) {
				t.Fatalf("the next turn's observation:\n%s\nwant it to say %q, and not %q", obs, c.wantObs, c.notObs)
			}
		})
	}
}

// nextObservation is the observation of the plan request of turn 2.
func nextObservation(t *testing.T, s *Service) string {
	t.Helper()
	m, err := s.Bus.LastMsg(context.Background(), bus.StreamPlan, subject.PlanReq(1, 0))
	if err != nil || m == nil {
		t.Fatalf("the plan request: %v, %v", m, err)
	}
	var req schema.PlanRequest
	if err := schema.Unmarshal(m.Data, &req); err != nil {
		t.Fatal(err)
	}
	if req.Turn != 2 {
		t.Fatalf("asked for turn %d, want 2", req.Turn)
	}
	return req.Observation
}

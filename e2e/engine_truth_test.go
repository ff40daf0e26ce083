package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
	"github.com/planact/planact/pkg/telemetry"
)

// Never train on what an engine did not say: engines that leave fields out
// of their replies, played by the simulated engines, through every service.

// TestNoLogProbsNoZeros: engines that return no log-probs give samples
// without rollout_log_probs, their metadata saying why, never zeros; the
// rollout is otherwise what it would be.
func TestNoLogProbsNoZeros(t *testing.T) {
	t.Parallel()
	omit := sim.Omit{LogProbs: true}
	e := startSem(t, semOptions{planner: sim.Config{Seed: 161, Omit: omit}, actor: sim.Config{Seed: 162, Omit: omit}})
	const n = 1601
	o := <-e.start(t, n, e.tasks(2, 1, n), nil)
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %s", o.perr, o.aerr, brief(o.planner))
	}
	if len(o.planner.Samples) != 2 || len(o.actor.Samples) == 0 {
		t.Fatalf("%d planner samples, %d actor samples", len(o.planner.Samples), len(o.actor.Samples))
	}
	for _, r := range []*schema.Result{o.planner, o.actor} {
		for _, s := range r.Samples {
			why, _ := s.Metadata["log_probs_missing"].(string)
			if s.RolloutLogProbs != nil || !strings.Contains(why, "output_token_logprobs") || len(s.LossMask) != s.ResponseLength {
				t.Errorf("%s sample %s: rollout_log_probs %v, log_probs_missing %q; want none, and why", r.Role, s.RolloutID, s.RolloutLogProbs, why)
			}
		}
	}
}

// TestCompletionsWithoutIDsRefused: a /v1/completions server that returns
// no token ids is refused, naming the options that return them: the
// planner's episodes fail (the rollout fails, saying why), and the actor's
// acts fail without giving samples.
func TestCompletionsWithoutIDsRefused(t *testing.T) {
	t.Parallel()
	t.Run("planner", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 163, Omit: sim.Omit{TokenIDs: true}}, actor: sim.Config{Seed: 164}})
		e.planner.Protocol = "openai"
		const n = 1602
		o := <-e.start(t, n, e.tasks(2, 1, n), nil)
		if !errors.Is(o.perr, client.ErrFailed) || !strings.Contains(o.planner.Reason, "return_token_ids") {
			t.Fatalf("rollout: %v %s; want failed, naming return_token_ids", o.perr, brief(o.planner))
		}
		if len(o.planner.Samples) != 0 || len(o.actor.Samples) != 0 {
			t.Errorf("%d planner samples, %d actor samples from a planner that returned no ids", len(o.planner.Samples), len(o.actor.Samples))
		}
	})
	t.Run("actor", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 165}, actor: sim.Config{Seed: 166, Omit: sim.Omit{TokenIDs: true}}})
		e.actor.Protocol = "openai"
		const n = 1603
		o := <-e.start(t, n, e.tasks(1, 1, n), &schema.Config{FailurePolicy: schema.PolicyFail})
		if o.planner == nil || o.planner.Stats.Failures[schema.ActErrInvalid] == 0 {
			t.Fatalf("rollout: %v %s; want the acts failed as invalid", o.perr, brief(o.planner))
		}
		if len(o.actor.Samples) != 0 || !strings.Contains(o.planner.Reason, "return_tokens_as_token_ids") {
			t.Errorf("%d actor samples, reason %q: want none, and the options named", len(o.actor.Samples), o.planner.Reason)
		}
	})
}

// brief is a result as a failing test says it: status, reason, failures.
func brief(r *schema.Result) string {
	if r == nil {
		return "no result"
	}
	return fmt.Sprintf("%s (%s), %d samples, failures %v, episodes %v", r.Status, r.Reason, len(r.Samples), r.Stats.Failures, r.Stats.EpisodeStatus)
}

// TestRetryAfterPastTheDeadline: an engine that is busy and asks to be
// tried again (Retry-After) only after the act's or the turn's deadline is
// not tried again at once: the act (or turn) fails in the engine's words,
// after one request.
func TestRetryAfterPastTheDeadline(t *testing.T) {
	t.Parallel()
	busy := sim.Faults{BusyRate: 1}
	t.Run("actor", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 167}, actor: sim.Config{Seed: 168, Faults: busy, RetryAfter: "30"}})
		const n = 1604
		o := <-e.start(t, n, []schema.Task{e.question(0, population("Chile"))}, &schema.Config{ActTimeoutS: 5, FailurePolicy: schema.PolicyFail})
		if o.planner == nil || o.planner.Stats.EpisodeStatus[schema.EpisodeFailed] != 1 {
			t.Fatalf("rollout: %v %s; want the episode failed", o.perr, brief(o.planner))
		}
		dones := e.dones(t, n)
		if len(dones) == 0 {
			t.Fatal("no act ran")
		}
		for k, d := range dones {
			if d.Status != schema.ActFailed || d.Attempts != 1 || d.ErrorKind != schema.ActErrTransient ||
				!strings.Contains(d.Error, "429 Too Many Requests") || !strings.Contains(d.Error, "Retry-After") {
				t.Errorf("act %s: %s after %d attempts (%s: %s); want failed after one, in the engine's words", k, d.Status, d.Attempts, d.ErrorKind, d.Error)
			}
		}
		if requests, _ := e.actorEngine.Stats(); requests != int64(len(dones)) {
			t.Errorf("%d requests for %d acts: the engine was asked again before it said", requests, len(dones))
		}
	})
	t.Run("planner", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 169, Faults: busy, RetryAfter: "30"}, actor: sim.Config{Seed: 170}})
		const n = 1605
		o := <-e.start(t, n, []schema.Task{e.question(0, population("Chile"))}, &schema.Config{PlannerTimeoutS: 5})
		if !errors.Is(o.perr, client.ErrFailed) || !strings.Contains(o.planner.Reason, schema.PlanErrPlannerUnavailable) ||
			!strings.Contains(o.planner.Reason, "Retry-After") {
			t.Fatalf("rollout: %v %s; want failed, planner_unavailable in the engine's words", o.perr, brief(o.planner))
		}
		if st := simStats(t, e.planner.URL); st.Requests != 1 {
			t.Errorf("%d planner requests for one turn: the engine was asked again before it said", st.Requests)
		}
	})
}

// simStats reads what a simulated engine saw (GET /sim/stats).
func simStats(t *testing.T, url string) sim.Stats {
	t.Helper()
	resp, err := http.Get(url + "/sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st sim.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// resumed has role's trainer announce version with a resume and waits
// until planact holds it as the role's newest.
func (e *semEnv) resumed(t *testing.T, role, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := e.trainer(t).Resume(ctx, role, version); err != nil {
		t.Fatal(err)
	}
	eventually(t, role+" at "+version, func() bool {
		st, _, _, err := bus.Get[schema.RoleState](ctx, e.bus.Sessions, schema.RoleKey(role))
		return err == nil && st.WeightVersion == version
	})
}

// TestStalenessCheckedBeforeEveryGeneration: max_staleness is checked
// against what the engine says it serves right before each generation,
// the first of a rollout included; where an engine cannot say, the
// generations run and the result says so.
func TestStalenessCheckedBeforeEveryGeneration(t *testing.T) {
	t.Parallel()
	t.Run("the first planner turn", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 171}, actor: sim.Config{Seed: 172}})
		e.resumed(t, schema.RolePlanner, "planner-v9") // the engine still serves planner-v7
		const n = 1606
		o := <-e.start(t, n, e.tasks(2, 1, n), &schema.Config{MaxStaleness: 1})
		if o.planner == nil || o.planner.Stats.EpisodeStatus[schema.EpisodeAborted] != 2 {
			t.Fatalf("rollout: %v %s; want both episodes aborted for staleness", o.perr, brief(o.planner))
		}
		for _, task := range o.planner.Tasks {
			if !strings.Contains(task.Reason, "planner-v7, 2 versions behind the trainer's planner-v9 (max_staleness 1)") {
				t.Errorf("task %d: %s (%s), want aborted for staleness, naming the engine's weights", task.Episode, task.State, task.Reason)
			}
		}
		if st := simStats(t, e.planner.URL); st.Requests != 0 {
			t.Errorf("%d planner generations on weights two versions behind", st.Requests)
		}
	})
	t.Run("engines that cannot say", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 173, VersionEndpoint: sim.NoVersionEndpoint},
			actor: sim.Config{Seed: 174, VersionEndpoint: sim.NoVersionEndpoint}})
		const n = 1607
		o := <-e.start(t, n, e.tasks(2, 1, n), &schema.Config{MaxStaleness: 1})
		if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.actor.Samples) == 0 {
			t.Fatalf("rollout: %v %v %s", o.perr, o.aerr, brief(o.planner))
		}
		turns := 0
		for _, r := range []*schema.Result{o.planner, o.actor} {
			for _, s := range r.Samples {
				if r.Role == schema.RolePlanner {
					turns += asInt(s.Metadata["turns"])
				}
				if why, _ := s.Metadata["staleness_unchecked"].(string); !strings.Contains(why, "cannot say which weights it serves") {
					t.Errorf("%s sample %s: staleness_unchecked %q, want why", r.Role, s.RolloutID, why)
				}
			}
		}
		got := o.planner.Stats.StalenessUnchecked
		if got[schema.RolePlanner] != turns || got[schema.RoleActor] != len(o.actor.Samples) {
			t.Errorf("stats.staleness_unchecked %v, want %d planner turns and %d acts", got, turns, len(o.actor.Samples))
		}
	})
}

// roleVersion is the role's newest weight version as planact holds it.
func (e *semEnv) roleVersion(t *testing.T, role string) string {
	t.Helper()
	st, _, _, err := bus.GetFresh[schema.RoleState](context.Background(), e.bus.Sessions, schema.RoleKey(role))
	if err != nil {
		t.Fatal(err)
	}
	return st.WeightVersion
}

// TestRollback: a trainer that goes back to an earlier checkpoint says so
// with a resume naming the older version. planact takes it as the role's
// newest, publishes the rollback, and counts staleness from it, so work
// goes on; arrivals only ever move the version forward.
func TestRollback(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 175}, actor: sim.Config{Seed: 176}}) // the actor engine serves actor-v3
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 1608
	arrive := func(rollout int64, version string) {
		t.Helper()
		a := &schema.Arrive{Rollout: rollout, Role: schema.RoleActor, Engine: e.actor, WeightVersion: version}
		if err := e.trainer(t).Arrive(ctx, a); err != nil {
			t.Fatal(err)
		}
		// The session-store says "arrived" once it has noted the version.
		eventually(t, fmt.Sprintf("the arrival for rollout %d handled", rollout), func() bool {
			m, err := e.bus.LastMsg(ctx, bus.StreamRollout, subject.Status(rollout))
			var st schema.Status
			return err == nil && m != nil && schema.Unmarshal(m.Data, &st) == nil && st.Event == "arrived"
		})
	}
	arrive(n, "actor-v9") // the trainer trained up to step 9 (and its rollout waits for the planner)
	if v := e.roleVersion(t, schema.RoleActor); v != "actor-v9" {
		t.Fatalf("newest %q after an arrival with actor-v9", v)
	}
	e.resumed(t, schema.RoleActor, "actor-v3") // it restarted from the checkpoint of step 3
	var m *bus.StoredMsg
	eventually(t, "the rollback published", func() bool {
		var err error
		m, err = e.bus.LastMsg(ctx, bus.StreamControl, "control.actor.rollback")
		return err == nil && m != nil
	})
	var rb schema.Rollback
	if err := schema.Unmarshal(m.Data, &rb); err != nil || rb.From != "actor-v9" || rb.To != "actor-v3" || rb.ResumeID == "" {
		t.Fatalf("rollback %+v, %v; want from actor-v9 to actor-v3", rb, err)
	}

	// Staleness counts from actor-v3: the engine's acts run, and are fresh.
	o := <-e.start(t, n+1, e.tasks(1, 1, n+1), &schema.Config{MaxStaleness: 1})
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || len(o.actor.Samples) == 0 {
		t.Fatalf("rollout after the rollback: %v %v %s", o.perr, o.aerr, brief(o.planner))
	}
	for _, s := range o.actor.Samples {
		if s.Metadata["stale"] != nil || asInt(s.Metadata["staleness"]) != 0 {
			t.Errorf("actor sample %v: stale %v, staleness %v; want fresh", s.Metadata["key"], s.Metadata["stale"], s.Metadata["staleness"])
		}
	}

	// An arrival with an older version is no rollback; a newer one (the
	// trainer trained up again) moves the version forward.
	arrive(n+2, "actor-v2")
	if v := e.roleVersion(t, schema.RoleActor); v != "actor-v3" {
		t.Errorf("newest %q after an arrival with actor-v2, want actor-v3: an arrival never moves it back", v)
	}
	arrive(n+3, "actor-v9")
	if v := e.roleVersion(t, schema.RoleActor); v != "actor-v9" {
		t.Errorf("newest %q after an arrival with actor-v9, want actor-v9", v)
	}
	// Back again, and forward again to the very version it had before: an
	// arrival is weighed against the role's state as it is now, not as it
	// was when that version was last seen.
	e.resumed(t, schema.RoleActor, "actor-v3")
	arrive(n+4, "actor-v9")
	if v := e.roleVersion(t, schema.RoleActor); v != "actor-v9" {
		t.Errorf("newest %q after a second rollback and an arrival with actor-v9, want actor-v9", v)
	}
}

// truncations reads planact_truncations_total for role and limit.
func truncations(role, limit string) float64 {
	return testutil.ToFloat64(telemetry.Truncations.WithLabelValues(role, limit))
}

// TestTruncatedSaysWhy: an episode or act cut short by a limit ends
// truncated with a reason that names the limit, and a metric counts it; a
// prompt the engine itself cut is refused, in its words. Not parallel: the
// counters are the test process's, and parallel tests truncate too (in one
// hunt's run the planner's max_context_tokens count grew by 3, not 1, as
// TestSemanticsGuards ran its own context limit); Go runs a sequential
// test while no parallel one runs.
func TestTruncatedSaysWhy(t *testing.T) {
	t.Run("a prompt longer than max_context_tokens", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 177}, actor: sim.Config{Seed: 178}})
		before := truncations(schema.RolePlanner, "max_context_tokens")
		const n = 1610
		cfg := &schema.Config{MaxContextTokens: 64, PlannerSampling: schema.Sampling{MaxNewTokens: 64}}
		o := <-e.start(t, n, e.tasks(1, 1, n), cfg)
		s, ok := sampleOf(o.planner, n, 0)
		reason, _ := s.Metadata["end_reason"].(string)
		why, _ := s.Metadata["truncated"].(string)
		if !ok || s.Status != schema.EpisodeTruncated || !strings.Contains(reason, "more than max_context_tokens 64") || !strings.Contains(why, "more than max_context_tokens 64") {
			t.Fatalf("episode: %s (end_reason %q, truncated %q), want truncated, naming the limit", s.Status, reason, why)
		}
		if got := truncations(schema.RolePlanner, "max_context_tokens") - before; got != 1 {
			t.Errorf("planact_truncations_total{role=planner,limit=max_context_tokens} grew by %v, want 1", got)
		}
	})
	t.Run("acts cut by max_new_tokens", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 179}, actor: sim.Config{Seed: 180}})
		before := truncations(schema.RoleActor, "max_new_tokens")
		const n = 1611
		o := <-e.start(t, n, e.tasks(1, 1, n), &schema.Config{ActorSampling: schema.Sampling{MaxNewTokens: 2}})
		if o.actor == nil || len(o.actor.Samples) == 0 {
			t.Fatalf("rollout: %v %s", o.aerr, brief(o.planner))
		}
		for _, s := range o.actor.Samples {
			if why, _ := s.Metadata["truncated"].(string); s.Status != schema.EpisodeTruncated || why != "actor_sampling.max_new_tokens 2: the act's generation was cut there" {
				t.Errorf("actor sample %v: %s (truncated %q), want truncated, naming the limit", s.Metadata["key"], s.Status, why)
			}
		}
		if got := truncations(schema.RoleActor, "max_new_tokens") - before; got != float64(len(o.actor.Samples)) {
			t.Errorf("planact_truncations_total{role=actor,limit=max_new_tokens} grew by %v for %d acts", got, len(o.actor.Samples))
		}
	})
	t.Run("a prompt the engine cut", func(t *testing.T) {
		e := startSem(t, semOptions{planner: sim.Config{Seed: 181, ContextLength: 100}, actor: sim.Config{Seed: 182}})
		before := truncations(schema.RolePlanner, "engine_context")
		const n = 1612
		o := <-e.start(t, n, e.tasks(1, 1, n), nil)
		s, ok := sampleOf(o.planner, n, 0)
		reason, _ := s.Metadata["end_reason"].(string)
		why, _ := s.Metadata["truncated"].(string)
		if !ok || s.Status != schema.EpisodeTruncated || !strings.Contains(reason, "it took 100 of the") || !strings.Contains(why, "it took 100 of the") || s.ResponseLength != 0 {
			t.Fatalf("episode: %s (end_reason %q, truncated %q, %d response tokens), want truncated in the engine's words, nothing generated",
				s.Status, reason, why, s.ResponseLength)
		}
		if got := truncations(schema.RolePlanner, "engine_context") - before; got != 1 {
			t.Errorf("planact_truncations_total{role=planner,limit=engine_context} grew by %v, want 1", got)
		}
	})
}

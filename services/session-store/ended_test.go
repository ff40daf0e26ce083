package sessionstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/subject"
)

// splitRollout stores rollout n, finished with one episode that completed
// (a planner and an actor sample), its results still to publish, on a
// session-store that can publish the planner's result (to the object
// store: an inline limit of one byte) and never the actor's (no result
// store for it); and settles it. The planner's result is ok, the actor's
// failed.
func splitRollout(t *testing.T, s *Service, n int64) {
	t.Helper()
	ctx := context.Background()
	for _, m := range []schema.Message{
		&schema.PlanOutput{Rollout: n, Episode: 0, Turn: 1, FinishReason: "stop", Segments: []schema.Segment{
			{Kind: schema.SegPrompt, Turn: 1, Text: "q", IDs: []int{1, 2}},
			{Kind: schema.SegGenerated, Turn: 1, Text: "a", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
		}},
		&schema.ActDone{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActDoneOK,
			Generation: &schema.Generation{Prompt: "p", PromptIDs: []int{4}, OutputIDs: []int{5, 6}, LogProbs: []float64{-1, -2}, FinishReason: "stop"}},
		&schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}, Acts: []string{"t1-s1"}},
	} {
		if err := s.Bus.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	s.InlineLimit = 1
	delete(s.Bus.Results, schema.RoleActor)
	sess := finishedRollout(t, s, n, schema.DefaultConfig(), schema.EffectResults, schema.EffectCleanup)
	tl := &schema.TaskList{Tasks: []schema.Task{{Prompt: "q", Label: "a"}}, From: schema.RolePlanner}
	if _, err := bus.Create(ctx, s.Bus.Sessions, schema.TasksKey(n), tl); err != nil {
		t.Fatal(err)
	}
	if err := s.settle(ctx, sess, 0); err != nil {
		t.Fatal(err)
	}
	p, a := resultOf(t, s, n, schema.RolePlanner), resultOf(t, s, n, schema.RoleActor)
	if p == nil || p.Status != schema.ResultOK || a == nil || a.Status != schema.ResultFailed {
		t.Fatalf("results: planner %+v, actor %+v; want the planner's ok, the actor's failed", p, a)
	}
}

// TestAnEndedRolloutIsToldForEachRole: the session's status is the first
// role's result's, and the answers to a cancel of a rollout that had
// ended, and to an arrival after it ended, gave it as the rollout's: "ok"
// where the actor's result said failed. Now the session records each
// role's result, and the answers name each role's status and why.
func TestAnEndedRolloutIsToldForEachRole(t *testing.T) {
	_, url := bustest.Server(t)
	b := bustest.Bus(t, url, "ss")
	s := newTestService(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 161
	splitRollout(t, s, n)

	sess, _, _, err := bus.GetFresh[schema.Session](ctx, b.Sessions, schema.SessionKey(n))
	if err != nil {
		t.Fatal(err)
	}
	if p, a := sess.Roles[schema.RolePlanner], sess.Roles[schema.RoleActor]; p.ResultStatus != schema.ResultOK ||
		a.ResultStatus != schema.ResultFailed || !strings.Contains(a.ResultReason, "samples could not be delivered") {
		t.Errorf("the session records the planner's result %q (%q), the actor's %q (%q); want ok, and failed saying why",
			p.ResultStatus, p.ResultReason, a.ResultStatus, a.ResultReason)
	}

	actorFailed := "the actor's result: failed (samples could not be delivered: "
	plannerOK := "the planner's result: ok"
	if err := s.handle(ctx, cancelOf(t, b, n, schema.RoleActor)); err != nil {
		t.Fatal(err)
	}
	st := lastStatus(t, b, n)
	if st.Event != "rejected" || !strings.Contains(st.Detail, "had already ended") || !strings.Contains(st.Detail, actorFailed) ||
		!strings.Contains(st.Detail, plannerOK) || strings.Index(st.Detail, actorFailed) > strings.Index(st.Detail, plannerOK) {
		t.Errorf("answer to the actor's cancel: %s %q; want rejected, naming the actor's failed result, then the planner's ok", st.Event, st.Detail)
	}

	again := delivered(t, b, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: schema.Engine{URL: "http://planner:30000"}, AtMs: time.Now().UnixMilli()})
	if err := s.handle(ctx, again); err != nil {
		t.Fatal(err)
	}
	m, err := b.LastMsg(ctx, bus.StreamRollout, subject.Rejected(n, schema.RolePlanner))
	if err != nil || m == nil {
		t.Fatalf("the planner's arrival after the end is not answered: %v", err)
	}
	var r schema.Result
	if err := schema.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	if r.ArrivalID != again.ID() || !strings.Contains(r.Reason, "already ended") || !strings.Contains(r.Reason, actorFailed) ||
		!strings.Contains(r.Reason, plannerOK) || strings.Index(r.Reason, plannerOK) > strings.Index(r.Reason, actorFailed) {
		t.Errorf("answer to the planner's arrival after the end: %+v; want it refused, naming the planner's ok result, then the actor's failed", r)
	}
}

// TestEndedAsTellsEachRole: how an ended rollout is told, from sessions
// as they are recorded: each role's result, the asking role's first; a
// role that never arrived; results not out yet; and a session recorded
// before each role's result was, whose status is the first role's.
func TestEndedAsTellsEachRole(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := func(roles map[string]schema.RoleInfo, outbox ...string) *schema.Session {
		return &schema.Session{Rollout: 7, State: schema.SessionDone, Status: schema.ResultOK, Reason: "planner's reason",
			FinishedMs: at.UnixMilli(), ResultsMs: at.UnixMilli(), Roles: roles, Outbox: outbox}
	}
	both := map[string]schema.RoleInfo{
		schema.RolePlanner: {ArrivalID: "p", ResultStatus: schema.ResultOK},
		schema.RoleActor:   {ArrivalID: "a", ResultStatus: schema.ResultFailed, ResultReason: "no act ran"},
	}
	old := map[string]schema.RoleInfo{schema.RolePlanner: {ArrivalID: "p"}, schema.RoleActor: {ArrivalID: "a"}}
	notOut := base(old, schema.EffectResults, schema.EffectCleanup)
	notOut.ResultsMs = 0
	for _, c := range []struct {
		what  string
		sess  *schema.Session
		asker string
		want  string
	}{
		{"the planner asks", base(both), schema.RolePlanner,
			"at 2026-01-01T00:00:00Z; the planner's result: ok; the actor's result: failed (no act ran)"},
		{"the actor asks", base(both), schema.RoleActor,
			"at 2026-01-01T00:00:00Z; the actor's result: failed (no act ran); the planner's result: ok"},
		{"the actor never arrived", base(map[string]schema.RoleInfo{schema.RolePlanner: {ResultStatus: schema.ResultTimeout, ResultReason: "barrier time-out"}}), schema.RoleActor,
			"at 2026-01-01T00:00:00Z; the actor had not arrived; the planner's result: timeout (barrier time-out)"},
		{"results not recorded as out yet", notOut, schema.RolePlanner,
			"ok at 2026-01-01T00:00:00Z: planner's reason; each role's result has a status of its own: rollout.7.result.planner, rollout.7.result.actor"},
		{"a session recorded before each role's result was", base(old), schema.RoleActor,
			"at 2026-01-01T00:00:00Z; the actor's result: not recorded in the session (rollout.7.result.actor has it); the planner's result: ok (planner's reason)"},
	} {
		if got := endedAs(c.sess, c.asker); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.what, got, c.want)
		}
	}
}

// TestAnUndeliverableResultListsItsTasks: a result whose samples could
// never be delivered went out failed with no task: its trainer could not
// tell which tasks ended how. Now it says how each ended for its role
// (those whose samples it was to hold failed), and counts what it holds.
func TestAnUndeliverableResultListsItsTasks(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	const n = 162
	splitRollout(t, s, n)
	r := resultOf(t, s, n, schema.RoleActor)
	if len(r.Tasks) != 1 || r.Tasks[0].State != schema.TaskFailed || !strings.Contains(r.Tasks[0].Reason, "could not be delivered") {
		t.Fatalf("the actor's failed result lists tasks %+v; want its one task, failed: its samples could not be delivered", r.Tasks)
	}
	// It holds no sample and no score: its stats claim no episode's
	// figures (acts, one actor sample each; ended; accuracy).
	if err := countsOwnContents(r, 0, schema.Stats{}); err != nil {
		t.Error(err)
	}
}

// TestAnUndeliverableResultTooLargeForItsTasksSaysSo: when even the list
// of tasks does not fit in a message, the failed result lists none, and
// its reason says so.
func TestAnUndeliverableResultTooLargeForItsTasksSaysSo(t *testing.T) {
	_, url := bustest.Server(t)
	s := newTestService(bustest.Bus(t, url, "ss"))
	s.maxResultBody = 300
	const n = 163
	splitRollout(t, s, n)
	r := resultOf(t, s, n, schema.RoleActor)
	if len(r.Tasks) != 0 || !strings.Contains(r.Reason, "the list of its 1 tasks does not fit in a message either") {
		t.Fatalf("the actor's failed result, its task list too large: tasks %+v, reason %q; want none, the reason saying why", r.Tasks, r.Reason)
	}
	if err := countsOwnContents(r, 0, schema.Stats{}); err != nil {
		t.Error(err)
	}
}

// TestUndeliverableResultsCountWhatTheyHold: over random rollouts, the
// failed result that goes out for one whose samples could not be delivered
// lists every task, trained only when the samples of it are in a group it
// leaves out, and counts what it holds; the other role's result is left
// as it was.
func TestUndeliverableResultsCountWhatTheyHold(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 3))
	s := &Service{maxResultBody: 1 << 30}
	for i := range 2000 {
		w := randomWorld(r)
		bp, ba := buildResults(w.sess, w.tasks, w.eps, w.asRead())
		for _, pair := range [][2]result{{bp, ba}, {ba, bp}} {
			b, other := pair[0], pair[1]
			otherTokens := fmt.Sprint(other.Stats.Tokens)
			res, body, err := s.undeliverable(b, fmt.Errorf("the store refuses it"))
			if err != nil {
				t.Fatal(err)
			}
			var decoded schema.Result
			if err := schema.Unmarshal(body, &decoded); err != nil {
				t.Fatal(err)
			}
			if res.Status != schema.ResultFailed || !strings.Contains(res.Reason, "the store refuses it") || len(res.Tasks) != len(w.tasks) || len(decoded.Tasks) != len(w.tasks) {
				t.Fatalf("seed %d, rollout %d, %s: %s (%q) with %d tasks of %d; want failed, saying why, every task", seed, i, b.Role, res.Status, res.Reason, len(res.Tasks), len(w.tasks))
			}
			inGroups, tokens := map[string]bool{}, 0
			for _, g := range res.DeliveredGroups {
				for _, h := range w.delivered[b.Role][g] {
					inGroups[h.sample.RolloutID] = true
					tokens += h.tokens
				}
			}
			if err := countsOwnContents(res, tokens, b.Stats); err != nil {
				t.Fatalf("seed %d, rollout %d, %s: %v", seed, i, b.Role, err)
			}
			for e, out := range res.Tasks {
				was := b.Tasks[e]
				switch {
				case out.State == schema.TaskTrained && !inGroups[episodeID(w.sess.Rollout, e)]:
					t.Fatalf("seed %d, rollout %d, %s: task %d trained, and none of its samples is delivered", seed, i, b.Role, e)
				case out.State != was.State && (was.State != schema.TaskTrained || out.State != schema.TaskFailed || out.Reason == ""):
					t.Fatalf("seed %d, rollout %d, %s: task %d was %s, now %s (%q)", seed, i, b.Role, e, was.State, out.State, out.Reason)
				}
			}
			if fmt.Sprint(other.Stats.Tokens) != otherTokens {
				t.Fatalf("seed %d, rollout %d: the %s's tokens changed with the %s's failed result", seed, i, other.Role, b.Role)
			}
		}
	}
}

// countsOwnContents checks that every count of r, a failed result that
// holds none of its samples, is of what it holds: no sample (and a sample
// count of 0), as many episodes as tasks, the task states those of its
// tasks, its role's tokens those of the groups it leaves out
// (groupTokens), the rollout's times; and every other field of its stats
// zero, for it holds nothing they count (no acts, one actor sample each;
// no ended episode, no accuracy), but of an evaluation that holds its
// episodes, scored: theirs, as the result it replaces (was) has them.
func countsOwnContents(r *schema.Result, groupTokens int, was schema.Stats) error {
	if len(r.Samples) != 0 || r.SamplesObject != "" || r.SampleCount != 0 {
		return fmt.Errorf("%d samples, object %q, sample_count %d; want none", len(r.Samples), r.SamplesObject, r.SampleCount)
	}
	want := schema.Stats{StartedMs: r.Stats.StartedMs, FinishedMs: r.Stats.FinishedMs, WallMs: r.Stats.WallMs}
	if r.Evaluation && len(r.Episodes) > 0 {
		want = was
		if want.StartedMs != r.Stats.StartedMs || want.FinishedMs != r.Stats.FinishedMs || want.WallMs != r.Stats.WallMs {
			return fmt.Errorf("times %d..%d (%d ms), the rollout's %d..%d (%d ms)", r.Stats.StartedMs, r.Stats.FinishedMs, r.Stats.WallMs, want.StartedMs, want.FinishedMs, want.WallMs)
		}
	}
	want.Episodes, want.TaskStates, want.Tokens = len(r.Tasks), nil, nil
	for _, out := range r.Tasks {
		if want.TaskStates == nil {
			want.TaskStates = map[string]int{}
		}
		want.TaskStates[out.State]++
	}
	if groupTokens > 0 {
		want.Tokens = map[string]int{r.Role: groupTokens}
	}
	if !reflect.DeepEqual(r.Stats, want) {
		return fmt.Errorf("stats %+v; what it holds counts %+v", r.Stats, want)
	}
	return nil
}

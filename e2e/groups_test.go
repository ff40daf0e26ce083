package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// copyOf is copy i of group g: the question of the group, with markers.
func (e *semEnv) copyOf(g, i int, q string, markers ...string) schema.Task {
	t := e.question(g, q, markers...)
	t.GroupIndex, t.Index = g, g*10+i
	return t
}

// tasksByState counts a result's tasks by state, checking that every task
// of the rollout is there exactly once.
func tasksByState(t *testing.T, r *schema.Result, tasks int) map[string][]schema.TaskOutcome {
	t.Helper()
	out := map[string][]schema.TaskOutcome{}
	seen := map[int]bool{}
	for _, o := range r.Tasks {
		if seen[o.Episode] {
			t.Errorf("task of episode %d reported twice", o.Episode)
		}
		seen[o.Episode] = true
		out[o.State] = append(out[o.State], o)
	}
	if len(seen) != tasks {
		t.Errorf("%d tasks reported, want every one of %d: %+v", len(seen), tasks, r.Tasks)
	}
	for state, os := range out {
		if r.Stats.TaskStates[state] != len(os) {
			t.Errorf("stats.task_states[%s] = %d, tasks say %d", state, r.Stats.TaskStates[state], len(os))
		}
	}
	return out
}

// waitEpisodeEnded waits until the session of rollout n records that
// episode ep ended: a test that cancels a rollout once that episode has
// ended does not rest on which of its episodes a loaded machine finishes
// first, nor on whether the end or the cancel is handled first (an end
// recorded after the rollout ended is not one of its episodes').
func waitEpisodeEnded(ctx context.Context, t *testing.T, e *semEnv, n int64, ep int) {
	t.Helper()
	for {
		if sess, _ := e.session(t, n); slices.Contains(sess.Ended, ep) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("episode %d of rollout %d never recorded ended", ep, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestGroupsStreamBeforeTheEnd: a group whose tasks all ended is delivered
// while another group still runs (its act hangs); the Go client's Groups
// stream yields it with its samples, the rollout then ends (cancelled), the
// stream ends, and the result holds the delivered group's samples and says
// how every task ended.
func TestGroupsStreamBeforeTheEnd(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 101}, actor: sim.Config{Seed: 102}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 1010
	tasks := []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain"), sim.FaultActorHang), e.copyOf(1, 1, population("Spain")),
	}
	results := e.start(t, n, tasks, &schema.Config{ActTimeoutS: 300, StreamGroups: true})
	trainer := e.trainer(t)
	var got []*schema.Group
	for g, err := range trainer.Groups(ctx, n, schema.RolePlanner) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, g)
		if len(got) == 1 {
			// The other group hangs: the rollout is still running.
			if sess, _ := e.session(t, n); sess.Final() {
				t.Fatalf("group %d came only after the rollout ended", g.GroupIndex)
			}
			// Spain's copy that does not hang ends first, whatever the
			// machine's load: then the cancel.
			waitEpisodeEnded(ctx, t, e, n, 3)
			if err := trainer.Cancel(ctx, n, schema.RolePlanner, "enough"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(got) != 1 || got[0].GroupIndex != 0 {
		t.Fatalf("groups streamed: %+v, want group 0 alone", got)
	}
	g := got[0]
	if g.SampleCount != 2 || len(g.Samples) != 2 || g.Groups != 2 || len(g.Delivered) != 1 || g.Delivered[0] != 0 {
		t.Errorf("group 0: %d samples (count %d), groups %d, delivered %v", len(g.Samples), g.SampleCount, g.Groups, g.Delivered)
	}
	for _, s := range g.Samples {
		if s.GroupIndex != 0 || len(s.Tokens) == 0 {
			t.Errorf("group 0 sample: group %d, %d tokens", s.GroupIndex, len(s.Tokens))
		}
	}
	o := <-results
	if o.planner == nil || o.planner.Status != schema.ResultAborted {
		t.Fatalf("result: %v %+v", o.perr, o.planner)
	}
	states := tasksByState(t, o.planner, len(tasks))
	// Group 0 was delivered; Spain's hung copy was stopped (aborted); its
	// other copy ended, and with no group filter its sample is delivered
	// with the result (trained).
	if len(states[schema.TaskTrained]) != 3 || len(states[schema.TaskAborted]) != 1 || states[schema.TaskAborted][0].Episode != 2 {
		t.Errorf("task states %+v: want episodes 0, 1 and 3 trained, 2 (hung) aborted", states)
	}
	var fromGroup []schema.Sample
	for _, s := range o.planner.Samples {
		if s.GroupIndex == 0 {
			fromGroup = append(fromGroup, s)
		}
	}
	if !slices.Equal(o.planner.StreamedGroups, []int{0}) || len(o.planner.DeliveredGroups) != 0 {
		t.Errorf("result: streamed_groups %v, delivered_groups %v; want group 0 named streamed, none left out", o.planner.StreamedGroups, o.planner.DeliveredGroups)
	}
	if len(fromGroup) != 2 {
		t.Errorf("the result holds %d samples of the delivered group, want 2", len(fromGroup))
	} else if !reflect.DeepEqual(fromGroup, g.Samples) {
		t.Errorf("the result's samples of the delivered group differ from the group's:\n%+v\nwant\n%+v", fromGroup, g.Samples)
	}
	// A trainer that took group 0 from the stream reads the rest only:
	// Spain's copy that ended, delivered with the result alone.
	rest, err := trainer.Result(ctx, n, schema.RolePlanner, client.WithoutGroups(g.GroupIndex))
	if err != nil {
		t.Fatal(err)
	}
	var want []schema.Sample
	for _, s := range o.planner.Samples {
		if s.GroupIndex != 0 {
			want = append(want, s)
		}
	}
	if len(want) != 1 || !reflect.DeepEqual(rest.Samples, want) || rest.SampleCount != o.planner.SampleCount {
		t.Errorf("result without group 0: %d samples (count %d), want the %d of group 1 (count %d)", len(rest.Samples), rest.SampleCount, len(want), o.planner.SampleCount)
	}
	// The actor's stream, read after the end, yields the same group.
	var actorGroups []int
	for g, err := range trainer.Groups(ctx, n, schema.RoleActor) {
		if err != nil {
			t.Fatal(err)
		}
		actorGroups = append(actorGroups, g.GroupIndex)
		if len(g.Samples) == 0 {
			t.Errorf("actor group %d has no samples", g.GroupIndex)
		}
	}
	if len(actorGroups) != 1 || actorGroups[0] != 0 {
		t.Errorf("actor groups after the end: %v, want [0]", actorGroups)
	}
}

// TestResultWithoutTheGroupsTaken: the result of a rollout that streams
// groups holds every delivered group's samples again; a trainer that took
// them all from the stream asks for the result without them, and the
// samples object (a large result's) is not read at all. Here it is gone
// before the result is asked for: the plain Result cannot be answered
// without it, the one without the groups is, and still counts every sample.
func TestResultWithoutTheGroupsTaken(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 107}, actor: sim.Config{Seed: 108}, inline: 1024})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	const n = 1014
	tasks := []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain")), e.copyOf(1, 1, population("Spain")),
	}
	o := <-e.start(t, n, tasks, &schema.Config{StreamGroups: true})
	if o.perr != nil || o.aerr != nil || o.actor.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %v %+v", o.perr, o.aerr, o.actor)
	}
	trainer := e.trainer(t)
	var taken []int
	streamed := 0
	for g, err := range trainer.Groups(ctx, n, schema.RoleActor) {
		if err != nil {
			t.Fatal(err)
		}
		taken, streamed = append(taken, g.GroupIndex), streamed+len(g.Samples)
	}
	if len(taken) != 2 || streamed != o.actor.SampleCount || o.actor.SamplesObject == "" {
		t.Fatalf("streamed groups %v with %d samples; the result has %d in object %q: want both groups, every sample, in an object",
			taken, streamed, o.actor.SampleCount, o.actor.SamplesObject)
	}
	if err := e.bus.Results[schema.RoleActor].Delete(ctx, o.actor.SamplesObject); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	if _, err := trainer.Result(short, n, schema.RoleActor); err == nil {
		t.Fatal("the whole result was read without its samples object")
	}
	r, err := trainer.Result(ctx, n, schema.RoleActor, client.WithoutGroups(taken...))
	if err != nil {
		t.Fatalf("the result without the groups taken: %v", err)
	}
	if len(r.Samples) != 0 || r.SampleCount != streamed || r.Status != schema.ResultOK || r.Stats.TaskStates[schema.TaskTrained] != len(tasks) {
		t.Errorf("result without the groups: %d samples, count %d (streamed %d), status %s, tasks %v", len(r.Samples), r.SampleCount, streamed, r.Status, r.Stats.TaskStates)
	}
}

// TestResultsLeaveTheGroupsOut: with result_samples undelivered, a
// rollout's results hold only the samples of tasks outside the delivered
// groups, name the groups left out and count their samples; every other
// count and claim is what it is with every sample in. The client's Result
// is still whole (it reads the groups' messages), or without the groups a
// trainer took.
func TestResultsLeaveTheGroupsOut(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 109}, actor: sim.Config{Seed: 110}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	trainer := e.trainer(t)
	stored := func(n int64, role string) *schema.Result {
		t.Helper()
		m, err := e.bus.LastMsg(ctx, bus.StreamRollout, subject.Result(n, role))
		if err != nil || m == nil {
			t.Fatalf("no %s result of rollout %d stored: %v", role, n, err)
		}
		var r schema.Result
		if err := schema.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	tokens := func(samples []schema.Sample) (n int) {
		for _, s := range samples {
			n += len(s.Tokens)
		}
		return n
	}

	// Group 0 delivered; group 1 cut short by a cancel, its copy that
	// ended delivered with the result alone.
	const n = 1015
	tasks := []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain"), sim.FaultActorHang), e.copyOf(1, 1, population("Spain")),
	}
	results := e.start(t, n, tasks, &schema.Config{ActTimeoutS: 300, StreamGroups: true, ResultSamples: schema.ResultSamplesUndelivered})
	var group *schema.Group
	for g, err := range trainer.Groups(ctx, n, schema.RolePlanner) {
		if err != nil {
			t.Fatal(err)
		}
		group = g
		waitEpisodeEnded(ctx, t, e, n, 3) // Spain's copy that does not hang: then the cancel
		if err := trainer.Cancel(ctx, n, schema.RolePlanner, "enough"); err != nil {
			t.Fatal(err)
		}
	}
	o := <-results
	if group == nil || group.GroupIndex != 0 || o.planner == nil || o.planner.Status != schema.ResultAborted {
		t.Fatalf("group %+v, result %v %+v", group, o.perr, o.planner)
	}
	r := stored(n, schema.RolePlanner)
	if len(r.Samples) != 1 || r.Samples[0].GroupIndex != 1 || r.SampleCount != 1 || r.GroupSamples != len(group.Samples) ||
		!reflect.DeepEqual(r.DeliveredGroups, []int{0}) {
		t.Errorf("stored result: %d samples (count %d), group samples %d of groups %v; want Spain's one, 2 of group [0] left out",
			len(r.Samples), r.SampleCount, r.GroupSamples, r.DeliveredGroups)
	}
	if got, want := r.Stats.Tokens[schema.RolePlanner], tokens(group.Samples)+tokens(r.Samples); got != want {
		t.Errorf("stats.tokens %d, the group's and the result's samples hold %d", got, want)
	}
	if r.Stats.TaskStates[schema.TaskTrained] != 3 || r.Stats.TaskStates[schema.TaskAborted] != 1 {
		t.Errorf("task states %v, want 3 trained, 1 aborted", r.Stats.TaskStates)
	}
	if whole := append(slices.Clone(group.Samples), r.Samples...); !reflect.DeepEqual(o.planner.Samples, whole) {
		t.Errorf("the client's result holds %d samples, want group 0's %d and the result's %d", len(o.planner.Samples), len(group.Samples), len(r.Samples))
	}
	rest, err := trainer.Result(ctx, n, schema.RolePlanner, client.WithoutGroups(0))
	if err != nil || !reflect.DeepEqual(rest.Samples, r.Samples) {
		t.Errorf("the result without group 0: %v, %d samples; want the result's %d", err, len(rest.Samples), len(r.Samples))
	}

	// Over-sampling: the results hold no sample at all, and are ok.
	const m = 1016
	tasks = []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain")), e.copyOf(1, 1, population("Spain")),
	}
	o = <-e.start(t, m, tasks, &schema.Config{TargetGroups: 1, ResultSamples: schema.ResultSamplesUndelivered})
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("over-sampled rollout: %v %v", o.perr, o.aerr)
	}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		r := stored(m, role)
		var inGroups []schema.Sample
		for _, g := range r.DeliveredGroups {
			gm, err := e.bus.LastMsg(ctx, bus.StreamRollout, subject.Group(m, role, g))
			var grp schema.Group
			if err != nil || gm == nil || schema.Unmarshal(gm.Data, &grp) != nil {
				t.Fatalf("group %d of the %s: %v", g, role, err)
			}
			inGroups = append(inGroups, grp.Samples...)
		}
		if r.Status != schema.ResultOK || strings.Contains(r.Reason, "sample") || len(r.Samples) != 0 || r.SampleCount != 0 || r.SamplesObject != "" || len(r.DeliveredGroups) != 1 ||
			r.GroupSamples == 0 || r.GroupSamples != len(inGroups) || r.Stats.Tokens[role] != tokens(inGroups) {
			t.Errorf("%s result: %s (%s), %d samples (count %d, object %q), groups %v holding %d (counted %d), tokens %d (the groups hold %d)",
				role, r.Status, r.Reason, len(r.Samples), r.SampleCount, r.SamplesObject, r.DeliveredGroups, len(inGroups), r.GroupSamples,
				r.Stats.Tokens[role], tokens(inGroups))
		}
		whole := o.planner
		if role == schema.RoleActor {
			whole = o.actor
		}
		if !reflect.DeepEqual(whole.Samples, inGroups) {
			t.Errorf("the client's %s result holds %d samples, want the group's %d", role, len(whole.Samples), len(inGroups))
		}
	}
}

// TestOverSampling: with target_groups 2 of 4, the rollout ends once two
// groups were delivered: the stragglers (acts that hang on the engine) are
// stopped at once (their engine requests end, nothing waits for their act
// time-out), their tasks say they were aborted, and exactly the two groups
// are delivered.
func TestOverSampling(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 103}, actor: sim.Config{Seed: 104}})
	const n = 1011
	tasks := []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain"), sim.FaultActorHang), e.copyOf(1, 1, population("Spain")),
		e.copyOf(2, 0, population("Germany")), e.copyOf(2, 1, population("Germany")),
		e.copyOf(3, 0, population("Italy"), sim.FaultActorHang), e.copyOf(3, 1, population("Italy"), sim.FaultActorHang),
	}
	start := time.Now()
	o := <-e.start(t, n, tasks, &schema.Config{ActTimeoutS: 600, RolloutTimeoutS: 900, TargetGroups: 2})
	if o.perr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("over-sampled rollout: %v %+v", o.perr, o.planner)
	}
	if !strings.Contains(o.planner.Reason, "2 groups delivered (target_groups 2)") {
		t.Errorf("reason %q: want it to say the target was reached", o.planner.Reason)
	}
	states := tasksByState(t, o.planner, len(tasks))
	var trainedGroups []int
	for _, tk := range states[schema.TaskTrained] {
		if !contains(trainedGroups, tk.GroupIndex) {
			trainedGroups = append(trainedGroups, tk.GroupIndex)
		}
	}
	if len(trainedGroups) != 2 || len(states[schema.TaskTrained]) != 4 {
		t.Errorf("trained: %+v, want the tasks of two groups", states[schema.TaskTrained])
	}
	for _, tk := range states[schema.TaskAborted] {
		if tk.Reason == "" {
			t.Errorf("aborted task %d without a reason", tk.Episode)
		}
	}
	if got := len(states[schema.TaskAborted]); got != 4 {
		t.Errorf("aborted tasks: %d (%v), want the 4 of the two groups not needed", got, o.planner.Stats.TaskStates)
	}
	for _, s := range o.planner.Samples {
		if !contains(trainedGroups, s.GroupIndex) {
			t.Errorf("sample of group %d, which was not delivered", s.GroupIndex)
		}
	}
	// The hung acts are stopped on the engine, not left to their time-out.
	eventually(t, "the stopped acts to leave the engine", func() bool { return e.actorEngine.InFlight() == 0 })
	// ... aborted: by SGLang's own abort endpoint, or the closed connection
	// when that came first (the engine saw the caller go).
	stopped, byEndpoint := map[string]bool{}, 0
	for _, a := range e.actorEngine.Aborts() {
		if a.Running {
			stopped[a.RID] = true
		}
		if a.By == "abort_request" {
			byEndpoint++
		}
	}
	if len(stopped) != 3 || byEndpoint < 3 {
		t.Errorf("aborts seen by the engine %+v: want the 3 hung acts aborted, each sent /abort_request", e.actorEngine.Aborts())
	}
	if took := time.Since(start); took > 5*time.Minute {
		t.Errorf("the rollout took %v: the stragglers were waited for", took)
	}
	if sess, _ := e.session(t, n); len(sess.Delivered()) != 2 {
		t.Errorf("session: delivered %v, want 2 groups", sess.Delivered())
	}
}

// TestGroupFilters: the built-in spread filter drops a group whose rewards
// all equal and delivers one with spread; a remote filter decides by its
// answer, and a filter that cannot be asked keeps the group, saying so.
func TestGroupFilters(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 105}, actor: sim.Config{Seed: 106}})
	tasks := func() []schema.Task {
		return []schema.Task{
			e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
			e.copyOf(1, 0, population("Spain"), sim.FaultActorWrong), e.copyOf(1, 1, population("Spain")),
		}
	}
	t.Run("spread", func(t *testing.T) {
		o := <-e.start(t, 1020, tasks(), &schema.Config{GroupFilter: "spread"})
		if o.perr != nil {
			t.Fatal(o.perr)
		}
		states := tasksByState(t, o.planner, 4)
		for _, tk := range states[schema.TaskFiltered] {
			if tk.GroupIndex != 0 || !strings.HasPrefix(tk.Reason, "spread: all 2 rewards are") {
				t.Errorf("filtered %+v: want group 0 (both right), with the filter's reason", tk)
			}
		}
		if len(states[schema.TaskFiltered]) != 2 || len(states[schema.TaskTrained]) != 2 {
			t.Fatalf("task states %v, want group 0 filtered and group 1 trained", o.planner.Stats.TaskStates)
		}
		for _, s := range append(o.planner.Samples, o.actor.Samples...) {
			if s.GroupIndex != 1 {
				t.Errorf("a sample of filtered group %d was delivered", s.GroupIndex)
			}
		}
		if len(o.planner.Samples) != 2 {
			t.Errorf("%d planner samples, want group 1's 2", len(o.planner.Samples))
		}
	})
	t.Run("remote", func(t *testing.T) {
		var mu sync.Mutex
		var asked []int
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				GroupIndex int       `json:"group_index"`
				Rewards    []float64 `json:"rewards"`
				Prompt     string    `json:"prompt"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Rewards) != 2 || req.Prompt == "" {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			mu.Lock()
			asked = append(asked, req.GroupIndex)
			mu.Unlock()
			if req.GroupIndex == 1 {
				http.Error(w, "judge is down", http.StatusServiceUnavailable)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"keep": false, "reason": "too easy"})
		}))
		defer srv.Close()
		o := <-e.start(t, 1021, tasks(), &schema.Config{GroupFilter: srv.URL})
		if o.perr != nil {
			t.Fatal(o.perr)
		}
		states := tasksByState(t, o.planner, 4)
		if len(states[schema.TaskFiltered]) != 2 || states[schema.TaskFiltered][0].Reason != "filter: too easy" {
			t.Errorf("filtered: %+v, want group 0 with the filter's reason", states[schema.TaskFiltered])
		}
		if len(states[schema.TaskTrained]) != 2 || states[schema.TaskTrained][0].GroupIndex != 1 {
			t.Errorf("trained: %+v, want group 1 (the filter could not be asked: kept)", states[schema.TaskTrained])
		}
		mu.Lock()
		if len(asked) != 2 {
			t.Errorf("the filter was asked about groups %v, want each of 2 once", asked)
		}
		mu.Unlock()
		sess, _ := e.session(t, 1021)
		if gs, ok := sess.Group(1); !ok || !strings.Contains(gs.Reason, "could not be asked") {
			t.Errorf("group 1 state %+v: want it kept, saying the filter could not be asked", gs)
		}
	})
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestTargetGroupsBeyondTheBatch: asking for more groups than the batch has
// is refused at once, naming the field.
func TestTargetGroupsBeyondTheBatch(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 107}, actor: sim.Config{Seed: 108}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	tasks := []schema.Task{e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France"))}
	_, err := e.trainer(t).Rollout(ctx, &schema.Arrive{Rollout: 1030, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks,
		Config: &schema.Config{TargetGroups: 2}}, 0)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "target_groups 2: the batch has only 1 groups") {
		t.Fatalf("target_groups beyond the batch: %v, want ErrRejected naming target_groups", err)
	}
}

// TestRemoteRewardAskedOncePerEpisode: with streamed groups, a group is
// decided, delivered and counted again in the result; a reward server is
// asked once per ended episode all the same, and every place says the
// reward it gave. The server here answers each request with a new random
// number (an LLM judge is not bound to answer the same twice): it was once
// asked three times per episode, so that the filter, the group's samples
// and the result's stats each rested on another answer.
func TestRemoteRewardAskedOncePerEpisode(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 107}, actor: sim.Config{Seed: 108}})
	judge := startJudge(t)
	tasks := []schema.Task{
		e.copyOf(0, 0, population("France")), e.copyOf(0, 1, population("France")),
		e.copyOf(1, 0, population("Spain")), e.copyOf(1, 1, population("Spain")),
		e.copyOf(2, 0, population("Germany")), e.copyOf(2, 1, population("Germany")),
	}
	const n = 1041
	o := <-e.start(t, n, tasks, &schema.Config{StreamGroups: true, GroupFilter: "spread", Reward: judge.URL})
	if o.perr != nil || o.planner.Status != schema.ResultOK {
		t.Fatalf("rollout: %v %+v", o.perr, o.planner)
	}
	left := judge.check(t, o.planner.Stats)
	for _, s := range o.planner.Samples {
		if left[s.Reward] == 0 {
			t.Errorf("sample %s has reward %v, which is not an answer of the reward server's left for it", s.RolloutID, s.Reward)
			continue
		}
		left[s.Reward]--
	}
	if len(o.planner.Samples) != len(tasks) {
		t.Errorf("%d planner samples, want %d (every group has spread: random rewards)", len(o.planner.Samples), len(tasks))
	}
}

// TestRemoteRewardRecordedBeforeResults: without groups, the rewards are
// asked for when the results are assembled. The planner's result goes out
// and the actor's cannot (its object store is gone); the session-store
// restarts and publishes the actor's. The reward server was asked once per
// episode all the same, and both results count its answers: before, each
// try at the results asked it again, so that the actor's result rested on
// other rewards than the planner's.
func TestRemoteRewardRecordedBeforeResults(t *testing.T) {
	t.Parallel()
	e := startSem(t, semOptions{planner: sim.Config{Seed: 109}, actor: sim.Config{Seed: 110}, inline: 1})
	judge := startJudge(t)
	ctx := context.Background()
	waitServices(t, bustest.Conn(t, e.url))
	if err := e.bus.JS.DeleteObjectStore(ctx, bus.ObjectResults(schema.RoleActor)); err != nil {
		t.Fatal(err)
	}
	const n = 1042
	tasks := e.tasks(4, 1, n)
	results := e.start(t, n, tasks, &schema.Config{Reward: judge.URL})
	eventually(t, "the planner's result out, the actor's owed", func() bool {
		m, err := e.bus.LastMsg(ctx, bus.StreamRollout, subject.Result(n, schema.RolePlanner))
		s, found := e.session(t, n)
		return err == nil && m != nil && found && s.Owes(schema.EffectResults)
	})
	e.stop()
	e.serve(t) // provisioning creates the actor's object store again
	o := <-results
	if o.perr != nil || o.aerr != nil || o.planner.Status != schema.ResultOK || o.actor.Status != schema.ResultOK {
		t.Fatalf("after the restart: %v %v %+v %+v", o.perr, o.aerr, o.planner, o.actor)
	}
	judge.check(t, o.planner.Stats)
	if o.actor.Stats.MeanReward != o.planner.Stats.MeanReward {
		t.Errorf("the actor's result has mean reward %v, the planner's %v: they rest on different answers", o.actor.Stats.MeanReward, o.planner.Stats.MeanReward)
	}
	s, _ := e.session(t, n)
	if len(s.EndScores) != o.planner.Stats.EpisodeStatus[schema.EpisodeCompleted] {
		t.Errorf("the session records %d rewards (%+v), want one per completed episode (%d)", len(s.EndScores), s.EndScores, o.planner.Stats.EpisodeStatus[schema.EpisodeCompleted])
	}
}

// judge is a reward server that answers each request with a new random
// number (an LLM judge is not bound to answer the same twice), and keeps
// every answer it gave.
type judge struct {
	URL   string
	mu    sync.Mutex
	asked map[string][]float64 // by prompt and response
}

func startJudge(t *testing.T) *judge {
	t.Helper()
	j := &judge{asked: map[string][]float64{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct{ Prompt, Response string }
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		v := rand.Float64()
		j.mu.Lock()
		j.asked[q.Prompt+"\x00"+q.Response] = append(j.asked[q.Prompt+"\x00"+q.Response], v)
		j.mu.Unlock()
		fmt.Fprintf(w, `{"reward": %v}`, v)
	}))
	t.Cleanup(srv.Close)
	j.URL = srv.URL
	return j
}

// check requires one request per completed episode and st's mean reward to
// be the mean of the answers, and returns the answers as a multiset (the
// copies of a task may answer alike: the server cannot tell them apart).
func (j *judge) check(t *testing.T, st schema.Stats) map[float64]int {
	t.Helper()
	j.mu.Lock()
	defer j.mu.Unlock()
	left := map[float64]int{}
	var sum float64
	calls := 0
	for _, answers := range j.asked {
		for _, v := range answers {
			calls++
			left[v]++
			sum += v
		}
	}
	if completed := st.EpisodeStatus[schema.EpisodeCompleted]; calls != completed || completed == 0 {
		t.Errorf("%d requests to the reward server for %d completed episodes, want one each", calls, completed)
	}
	if want := sum / float64(st.Ended); math.Abs(st.MeanReward-want) > 1e-9 {
		t.Errorf("stats.mean_reward %v, want %v: the mean of the answers the server gave", st.MeanReward, want)
	}
	return left
}

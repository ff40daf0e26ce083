package sessionstore

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/planact/planact/pkg/schema"
)

// world is one random rollout as assembly sees it: its session, tasks,
// episodes and delivered groups, with every episode's end, trajectory and
// acts drawn at random.
type world struct {
	sess      *schema.Session
	tasks     []schema.Task
	eps       map[int]*episode
	delivered map[string]map[int][]heldSample // as assembly reads them back
}

var (
	endStatuses = []string{schema.EpisodeCompleted, schema.EpisodeTruncated, schema.EpisodeFailed, schema.EpisodeAborted, schema.EpisodeQuarantined}
	failKinds   = []string{schema.ActErrTransient, schema.ActErrTimeout, schema.ActErrStale, schema.ActErrPaused, schema.ActErrUnavailable, schema.ActErrDuplicate}
)

func randomWorld(r *rand.Rand) world {
	const n = 77
	cfg := schema.DefaultConfig()
	cfg.Tools = append(cfg.Tools, schema.Tool{Name: "wiki", Kind: schema.ToolHTTP, URL: "http://retriever:8000"})
	switch r.IntN(4) {
	case 1:
		cfg.StreamGroups = true
	case 2:
		cfg.GroupFilter = schema.FilterSpread
	case 3:
		cfg.TargetGroups = 1
	default:
		cfg.Evaluation = r.IntN(3) == 0
	}
	if cfg.Grouped() && r.IntN(2) == 0 {
		cfg.ResultSamples = schema.ResultSamplesUndelivered
	}
	if r.IntN(2) == 0 {
		cfg.MaxStaleness = 2 // generations may have run with their weights unchecked
	}
	unchecked := func() string {
		if cfg.MaxStaleness > 0 && r.IntN(3) == 0 {
			return "the engine names no weight version"
		}
		return ""
	}
	w := world{tasks: make([]schema.Task, 1+r.IntN(10)), eps: map[int]*episode{}, delivered: map[string]map[int][]heldSample{
		schema.RolePlanner: {}, schema.RoleActor: {}}}
	groups := 1 + r.IntN(len(w.tasks))
	for e := range w.tasks {
		w.tasks[e] = schema.Task{GroupIndex: r.IntN(groups), Index: e, Prompt: fmt.Sprintf("q%d", e), Label: "a", Dataset: []string{"", "hotpot", "nq"}[r.IntN(3)]}
	}
	w.sess = &schema.Session{Rollout: n, Config: cfg, Episodes: len(w.tasks), StartedMs: 1000, FinishedMs: 5000}
	switch r.IntN(4) {
	case 0, 1:
		w.sess.State, w.sess.Status = schema.SessionDone, schema.ResultOK
	case 2:
		w.sess.State, w.sess.Status, w.sess.Reason = schema.SessionTimeout, schema.ResultPartial, "rollout time-out"
	case 3:
		w.sess.State, w.sess.Status, w.sess.Reason = schema.SessionAborted, schema.ResultAborted, "aborted by the planner trainer"
	}
	// Every episode of a rollout that ended ok ended, unless it stopped at
	// target_groups.
	allEnd := w.sess.Status == schema.ResultOK && cfg.TargetGroups == 0
	for e, task := range w.tasks {
		ep := &episode{task: task}
		w.eps[e] = ep
		if !allEnd && r.IntN(3) == 0 {
			continue // did not end
		}
		ep.end = &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1 + r.IntN(3), Status: endStatuses[r.IntN(len(endStatuses))], Reason: "why " + fmt.Sprint(r.IntN(3))}
		// As gather builds them: no sample of an evaluation, or of a
		// quarantined episode.
		sampled := !cfg.Evaluation && ep.end.Status != schema.EpisodeQuarantined
		if ep.end.Status == schema.EpisodeCompleted {
			ep.reward = float64(r.IntN(3)) / 2
			ep.correct = ep.reward == 1
			if r.IntN(8) == 0 {
				ep.reward, ep.rewardErr = 0, "reward server down"
			}
		}
		if r.IntN(5) > 0 && (!cfg.Evaluation || cfg.MaxStaleness > 0) { // the planner's trajectory is there (an evaluation's is read only when max_staleness counts its unchecked turns)
			gen := make([]int, 1+r.IntN(20))
			ep.last = &schema.PlanOutput{Rollout: n, Episode: e, FinishReason: []string{"stop", "length", "abort"}[r.IntN(3)], Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "p", IDs: make([]int, 1+r.IntN(10))},
				{Kind: schema.SegGenerated, Turn: 1, Text: "g", IDs: gen, LogProbs: make([]float64, len(gen)), Version: "v1", StalenessUnchecked: unchecked()},
			}}
			if smp, ok := plannerSample(n, e, ep); ok && sampled {
				ep.planner = &smp
			}
		}
		for k := range r.IntN(5) {
			d := &schema.ActDone{Rollout: n, Episode: e, Turn: 1, Key: fmt.Sprintf("t1-s%d", k), NodeID: fmt.Sprintf("s%d", k), Tool: "search"}
			switch r.IntN(6) {
			case 0, 1:
				d.Status, d.Generation = schema.ActDoneOK, &schema.Generation{Prompt: "a", PromptIDs: make([]int, 1+r.IntN(5)),
					OutputIDs: make([]int, 1+r.IntN(5)), FinishReason: "stop", StalenessUnchecked: unchecked()}
				d.Generation.LogProbs = make([]float64, len(d.Generation.OutputIDs))
			case 2:
				d.Status, d.ErrorKind, d.Error = schema.ActFailed, failKinds[r.IntN(len(failKinds))], "engine said no"
			case 3:
				d.Status = schema.ActCached
			case 4:
				d.Status = schema.ActSkip
			case 5:
				d.Tool = "wiki"
				if r.IntN(2) == 0 {
					d.Status, d.Output = schema.ActDoneOK, "passage"
				} else {
					d.Status, d.ErrorKind, d.Error = schema.ActFailed, schema.ActErrTransient, "HTTP 500"
				}
			}
			ep.acts = append(ep.acts, d)
			if modelRan(d) {
				ep.ran++
			}
			if smp, ok := actorSample(n, e, ep, d); ok && sampled {
				ep.actor = append(ep.actor, smp)
			}
		}
	}
	// Groups whose tasks all ended are decided, as the session-store does
	// as they complete: delivered (their samples published as groupShare
	// makes them), or filtered.
	if cfg.Grouped() {
		for g := range groups {
			members := groupMembers(w.tasks, g)
			complete := len(members) > 0
			for _, e := range members {
				complete = complete && w.eps[e].end != nil
			}
			if !complete {
				continue
			}
			gs := schema.GroupState{Index: g, State: schema.GroupDelivered}
			if cfg.Filtering() && r.IntN(3) == 0 {
				gs.State, gs.Reason = schema.GroupFiltered, "spread: all rewards equal"
			}
			w.sess.Groups = append(w.sess.Groups, gs)
			if gs.State == schema.GroupDelivered {
				for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
					samples, _ := groupShare(w.sess, w.eps, members, role)
					w.delivered[role][g] = asDelivered(samples)
				}
			}
		}
	}
	return w
}

// asDelivered holds a group's samples as assembly reads them back from
// the group's message: encoded, each read as it was encoded.
func asDelivered(samples []schema.Sample) []heldSample {
	if len(samples) == 0 {
		return nil // a group message without samples holds none
	}
	data, err := schema.Marshal(samples)
	if err != nil {
		panic(err)
	}
	held, err := splitSamples(data)
	if err != nil {
		panic(err)
	}
	return held
}

// asRead are the delivered groups as assembly takes them: their samples
// as they were encoded, or, when the results leave them out, what they
// count.
func (w world) asRead() map[string]map[int]groupCounts {
	out := map[string]map[int]groupCounts{}
	for role, groups := range w.delivered {
		out[role] = map[int]groupCounts{}
		for g, held := range groups {
			c := countHeld(held)
			if !w.sess.Config.LeavesOutGroups() {
				c.held = held
			}
			out[role][g] = c
		}
	}
	return out
}

// asTrainersRead are both results as a trainer reads them: their samples
// in them, those of delivered groups decoded from their encoding, as
// publishResult puts them in a result's body; and, when a result leaves
// the delivered groups out, theirs from the groups, as the client adds
// them (its sample_count counting its own, group_samples the groups').
func asTrainersRead(t *testing.T, w world, planner, actor result) (*schema.Result, *schema.Result) {
	t.Helper()
	out := make([]*schema.Result, 2)
	for i, r := range []result{planner, actor} {
		res := *r.Result
		var err error
		if res.Samples, err = samplesOf(r.samples); err != nil {
			t.Fatal(err)
		}
		if res.SampleCount != len(res.Samples) {
			t.Fatalf("%s result: sample_count %d, %d samples", res.Role, res.SampleCount, len(res.Samples))
		}
		var fromGroups []schema.Sample
		for _, g := range res.DeliveredGroups {
			samples, err := samplesOf(w.delivered[res.Role][g])
			if err != nil {
				t.Fatal(err)
			}
			fromGroups = append(fromGroups, samples...)
		}
		if leaveOut := w.sess.Config.LeavesOutGroups(); res.GroupSamples != len(fromGroups) || leaveOut != (res.DeliveredGroups != nil) && len(w.sess.Delivered()) > 0 {
			t.Fatalf("%s result (result_samples %q): group_samples %d, groups %v holding %d", res.Role, w.sess.Config.ResultSamples, res.GroupSamples, res.DeliveredGroups, len(fromGroups))
		}
		res.Samples = append(res.Samples, fromGroups...)
		sort.SliceStable(res.Samples, func(i, j int) bool { return res.Samples[i].GroupIndex < res.Samples[j].GroupIndex })
		out[i] = &res
	}
	return out[0], out[1]
}

// TestResultsTellTheTruth: over random rollouts (random episode ends,
// trajectories, act outcomes, groups and filters), every count in each
// role's stats is a count of what its result holds, a task is trained for
// a role only when the role's samples of it are in its result, and a
// result claims ok only when it delivers samples to train on or says why
// it has none.
func TestResultsTellTheTruth(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range 3000 {
		w := randomWorld(r)
		bp, ba := buildResults(w.sess, w.tasks, w.eps, w.asRead())
		planner, actor := asTrainersRead(t, w, bp, ba)
		for _, res := range []*schema.Result{planner, actor} {
			if err := checkTruth(w, res); err != nil {
				t.Fatalf("seed %d, rollout %d, %s result: %v\nstatus %s (%s)\nstats %+v\ntasks %+v", seed, i, res.Role, err, res.Status, res.Reason, res.Stats, res.Tasks)
			}
		}
		if planner.Stats.Tokens[schema.RoleActor] != actor.Stats.Tokens[schema.RoleActor] {
			t.Fatalf("seed %d, rollout %d: the roles count the actor's tokens differently", seed, i)
		}
	}
}

// TestResultsNeedNoSampleTheyDoNotHold: over random rollouts, results
// built from episodes read as assembly reads them (no sample built, and no
// trajectory read unless max_staleness makes it count, for an episode
// whose samples come from its delivered group or are not delivered at
// all) are those built from every episode read whole.
func TestResultsNeedNoSampleTheyDoNotHold(t *testing.T) {
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 2))
	skipped := 0
	for i := range 1500 {
		w := randomWorld(r)
		bp, ba := buildResults(w.sess, w.tasks, w.eps, w.asRead())
		wantP, wantA := asTrainersRead(t, w, bp, ba)
		own, counted := ownSamples(w.sess), w.sess.Config.MaxStaleness > 0
		read := map[int]*episode{}
		for e, ep := range w.eps {
			cp := *ep
			if !own(ep.task) {
				cp.planner, cp.actor = nil, nil
				if !counted {
					cp.last = nil
				}
				skipped++
			}
			read[e] = &cp
		}
		bp, ba = buildResults(w.sess, w.tasks, read, w.asRead())
		gotP, gotA := asTrainersRead(t, w, bp, ba)
		if !reflect.DeepEqual(gotP, wantP) || !reflect.DeepEqual(gotA, wantA) {
			t.Fatalf("seed %d, rollout %d (config %+v): results differ when only the samples they hold are built\nplanner %+v\nwant    %+v\nactor %+v\nwant  %+v",
				seed, i, w.sess.Config, gotP.Stats, wantP.Stats, gotA.Stats, wantA.Stats)
		}
	}
	if skipped == 0 {
		t.Fatal("no episode's samples were left unbuilt: the test shows nothing")
	}
}

// checkEvaluation checks an evaluation's result: no samples, every
// episode scored as it ended, tasks evaluated only when their episode
// ended and was not failed, aborted or quarantined, the numbers of each
// dataset those of its episodes; and a training result has none of that.
func checkEvaluation(w world, res *schema.Result) error {
	if !w.sess.Config.Evaluation {
		if res.Evaluation || len(res.Episodes) > 0 || res.Stats.TaskStates[schema.TaskEvaluated] > 0 {
			return fmt.Errorf("a training result says evaluation %v, %d episodes, %d tasks evaluated", res.Evaluation, len(res.Episodes), res.Stats.TaskStates[schema.TaskEvaluated])
		}
		return nil
	}
	if !res.Evaluation || len(res.Samples) > 0 || len(res.Episodes) != len(w.tasks) {
		return fmt.Errorf("evaluation result: evaluation %v, %d samples, %d episodes for %d tasks", res.Evaluation, len(res.Samples), len(res.Episodes), len(w.tasks))
	}
	type sum struct {
		n, ended, correct, acts int
		reward                  float64
	}
	sums := map[string]*sum{}
	for e, o := range res.Episodes {
		ep, out := w.eps[e], res.Tasks[e]
		if o.Episode != e || o.GroupIndex != w.tasks[e].GroupIndex || o.Dataset != w.tasks[e].Dataset {
			return fmt.Errorf("episode %d reported as %+v, its task is %+v", e, o, w.tasks[e])
		}
		if w.tasks[e].Dataset != "" {
			if sums[o.Dataset] == nil {
				sums[o.Dataset] = &sum{}
			}
			sums[o.Dataset].n++
		}
		if ep.end == nil {
			if o.Reward != 0 || o.Turns != 0 || o.Status != out.State || out.State == schema.TaskEvaluated {
				return fmt.Errorf("episode %d did not end: reported %+v, task %+v", e, o, out)
			}
			continue
		}
		if o.Status != ep.end.Status || o.Reward != ep.reward || o.Turns != ep.end.Turns || o.Acts != ep.ran || o.Correct != ep.correct {
			return fmt.Errorf("episode %d ended %s (reward %v, %d turns, %d acts): reported %+v", e, ep.end.Status, ep.reward, ep.end.Turns, ep.ran, o)
		}
		evaluated := ep.end.Status == schema.EpisodeCompleted || ep.end.Status == schema.EpisodeTruncated
		if (out.State == schema.TaskEvaluated) != evaluated {
			return fmt.Errorf("episode %d ended %s, its task %s", e, ep.end.Status, out.State)
		}
		if s := sums[o.Dataset]; s != nil {
			s.ended++
			s.acts += ep.ran
			s.reward += ep.reward
			if ep.correct {
				s.correct++
			}
		}
	}
	if len(sums) != len(res.Stats.Datasets) {
		return fmt.Errorf("datasets %v, the tasks name %d", res.Stats.Datasets, len(sums))
	}
	for name, s := range sums {
		ds := res.Stats.Datasets[name]
		if ds.Episodes != s.n || ds.Ended != s.ended || ds.Correct != s.correct || ds.Acts != s.acts ||
			(s.ended > 0 && math.Abs(ds.MeanReward-s.reward/float64(s.ended)) > 1e-12) {
			return fmt.Errorf("dataset %s: %+v, its episodes: %+v", name, ds, *s)
		}
	}
	if res.Status == schema.ResultFailed {
		failed := 0
		for _, ep := range w.eps {
			if ep.end != nil && ep.end.Status == schema.EpisodeFailed {
				failed++
			}
		}
		if failed != len(w.tasks) {
			return fmt.Errorf("evaluation failed with %d of %d episodes failed: %s", failed, len(w.tasks), res.Reason)
		}
	}
	return nil
}

// checkTruth checks one role's result against the rollout it reports.
func checkTruth(w world, res *schema.Result) error {
	st := res.Stats
	if st.Episodes != len(w.tasks) || len(res.Tasks) != len(w.tasks) {
		return fmt.Errorf("%d episodes, %d task outcomes, for %d tasks", st.Episodes, len(res.Tasks), len(w.tasks))
	}
	states := map[string]int{}
	for i, out := range res.Tasks {
		if out.Episode != i {
			return fmt.Errorf("task %d reports episode %d", i, out.Episode)
		}
		states[out.State]++
	}
	if fmt.Sprint(states) != fmt.Sprint(st.TaskStates) {
		return fmt.Errorf("task_states %v, the tasks say %v", st.TaskStates, states)
	}
	episodes, failures := map[string]int{}, map[string]int{}
	ended := 0
	for e := range w.tasks {
		ep := w.eps[e]
		if ep.end == nil {
			episodes[schema.TaskUnfinished]++
			continue
		}
		ended++
		episodes[ep.end.Status]++
		if ep.rewardErr != "" {
			failures["reward"]++
		}
		for _, d := range ep.acts {
			if d.Status == schema.ActFailed && d.ErrorKind != schema.ActErrDuplicate {
				failures[d.ErrorKind]++
			}
		}
	}
	if fmt.Sprint(episodes) != fmt.Sprint(st.EpisodeStatus) || st.Ended != ended || st.Completed != episodes[schema.EpisodeCompleted] {
		return fmt.Errorf("episode_status %v, ended %d, completed %d; the episodes say %v, %d ended", st.EpisodeStatus, st.Ended, st.Completed, episodes, ended)
	}
	if fmt.Sprint(failures) != fmt.Sprint(st.Failures) {
		return fmt.Errorf("failures %v, the acts and rewards say %v", st.Failures, failures)
	}
	tokens := 0
	has := map[string]int{}
	for _, smp := range res.Samples {
		tokens += len(smp.Tokens)
		has[smp.RolloutID]++
	}
	if st.Tokens[res.Role] != tokens {
		return fmt.Errorf("tokens %d, the samples hold %d", st.Tokens[res.Role], tokens)
	}
	quarantinedActs := 0
	for _, ep := range w.eps {
		if ep.end != nil && ep.end.Status == schema.EpisodeQuarantined {
			quarantinedActs += ep.ran
		}
	}
	if !w.sess.Config.Grouped() && !w.sess.Config.Evaluation && res.Role == schema.RoleActor && st.Acts != len(res.Samples)+quarantinedActs {
		return fmt.Errorf("acts %d, %d actor samples and %d acts of quarantined episodes", st.Acts, len(res.Samples), quarantinedActs)
	}
	if err := checkEvaluation(w, res); err != nil {
		return err
	}
	for e, out := range res.Tasks {
		id := episodeID(w.sess.Rollout, e)
		switch {
		case out.State == schema.TaskTrained && has[id] == 0:
			return fmt.Errorf("task %d is trained, and the result has no sample of it", e)
		case has[id] > 0 && !slices.Contains([]string{schema.TaskTrained, schema.TaskFailed, schema.TaskAborted}, out.State):
			return fmt.Errorf("task %d is %s, and the result has %d samples of it", e, out.State, has[id])
		case out.State == schema.TaskQuarantined && (has[id] > 0 || w.eps[e].end == nil || w.eps[e].end.Status != schema.EpisodeQuarantined):
			return fmt.Errorf("task %d is quarantined, with %d samples, its episode ended %+v", e, has[id], w.eps[e].end)
		case w.eps[e].end != nil && w.eps[e].end.Status == schema.EpisodeQuarantined && out.State != schema.TaskQuarantined:
			return fmt.Errorf("task %d is %s, its episode quarantined", e, out.State)
		case out.State != schema.TaskTrained && out.State != schema.TaskEvaluated && out.Reason == "":
			return fmt.Errorf("task %d is %s, with no reason", e, out.State)
		case out.State == schema.TaskEmpty && res.Role == schema.RolePlanner:
			return fmt.Errorf("task %d is empty for the planner", e)
		}
	}
	for _, smp := range res.Samples {
		var e int
		fmt.Sscanf(smp.RolloutID[strings.LastIndex(smp.RolloutID, "-")+1:], "%d", &e)
		if ep := w.eps[e]; res.Role == schema.RolePlanner && smp.Status == schema.EpisodeCompleted && ep.end.Status != schema.EpisodeCompleted {
			return fmt.Errorf("planner sample of episode %d is completed, the episode %s", e, ep.end.Status)
		}
	}
	training := !w.sess.Config.Evaluation // an evaluation has no samples, by design
	// The samples to train on: those of tasks trained for the role (not
	// those of failed or aborted episodes, which say so in their status).
	trainable := 0
	for _, smp := range res.Samples {
		var e int
		fmt.Sscanf(smp.RolloutID[strings.LastIndex(smp.RolloutID, "-")+1:], "%d", &e)
		if res.Tasks[e].State == schema.TaskTrained {
			trainable++
		}
	}
	switch res.Status {
	case schema.ResultOK:
		if trainable == 0 && training && (st.TaskStates[schema.TaskFailed] > 0 || st.TaskStates[schema.TaskQuarantined] > 0) {
			return fmt.Errorf("ok with no sample to train on (%d samples), %d tasks failed", len(res.Samples), st.TaskStates[schema.TaskFailed])
		}
		if len(res.Samples) == 0 && training && res.Reason == "" && len(w.tasks) > 0 {
			return fmt.Errorf("ok with no sample and no reason")
		}
		if trainable == 0 && training && episodes[schema.EpisodeAborted] > 0 {
			return fmt.Errorf("ok with no sample to train on (%d samples), %d episodes aborted", len(res.Samples), episodes[schema.EpisodeAborted])
		}
		if w.sess.Status != schema.ResultOK {
			return fmt.Errorf("ok, the rollout ended %s", w.sess.Status)
		}
	case schema.ResultPartial:
		if trainable == 0 && training && (st.TaskStates[schema.TaskFailed] > 0 || episodes[schema.EpisodeAborted] > 0) {
			return fmt.Errorf("partial with no sample to train on (%d samples), %d tasks failed", len(res.Samples), st.TaskStates[schema.TaskFailed])
		}
	case schema.ResultFailed:
		if trainable > 0 && episodes[schema.EpisodeFailed] != len(w.tasks) {
			return fmt.Errorf("failed with %d samples to train on, and not every episode failed", trainable)
		}
		if res.Reason == "" {
			return fmt.Errorf("failed, saying nothing")
		}
	}
	if res.Status != w.sess.Status && res.Status != schema.ResultFailed {
		return fmt.Errorf("status %s, the rollout ended %s", res.Status, w.sess.Status)
	}
	return nil
}

// TestToolFailuresAreNotTheActorsLoss: an act of a tool the actor model
// does not run (a Go function, a mode's own vote) gives no actor sample
// whether it fails or not: its failure costs the actor nothing, so the
// actor's task is empty, not failed, and the actor's result does not
// fail for it.
func TestToolFailuresAreNotTheActorsLoss(t *testing.T) {
	for _, c := range []struct {
		name, mode, tool string
		tools            []schema.Tool
	}{
		{"go tool", "", "calc", []schema.Tool{{Name: "calc", Kind: schema.ToolGo}}},
		{"ensemble vote", schema.ModeEnsemble, "vote", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			const n = 5
			cfg := schema.DefaultConfig()
			cfg.Mode = c.mode
			cfg.Tools = append(cfg.Tools, c.tools...)
			task := schema.Task{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}
			sess := &schema.Session{Rollout: n, Config: cfg, Episodes: 1, State: schema.SessionDone, Status: schema.ResultOK}
			ep := &episode{task: task, end: &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 1, Status: schema.EpisodeCompleted}, reward: 1, correct: true}
			ep.last = &schema.PlanOutput{Rollout: n, Episode: 0, FinishReason: "stop", Segments: []schema.Segment{
				{Kind: schema.SegPrompt, Turn: 1, Text: "p", IDs: []int{1, 2}},
				{Kind: schema.SegGenerated, Turn: 1, Text: "g", IDs: []int{3}, LogProbs: []float64{-1}, Version: "v1"},
			}}
			smp, ok := plannerSample(n, 0, ep)
			if !ok {
				t.Fatal("no planner sample")
			}
			ep.planner = &smp
			ep.acts = []*schema.ActDone{{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: c.tool,
				Status: schema.ActFailed, ErrorKind: schema.ActErrInvalid, Error: "the tool said no"}}
			_, actor := buildResults(sess, []schema.Task{task}, map[int]*episode{0: ep}, nil)
			if got := actor.Tasks[0].State; got != schema.TaskEmpty {
				t.Errorf("the actor's task is %s (%s); the actor model was asked for nothing", got, actor.Tasks[0].Reason)
			}
			if actor.Status != schema.ResultOK {
				t.Errorf("the actor's result is %s (%s); nothing of the actor's failed", actor.Status, actor.Reason)
			}
		})
	}
}

// TestDuplicateFailureCountedOnce: a duplicate that failed with the act it
// repeats is that act's failure, counted once, in the task's and the
// result's reasons as in stats.failures.
func TestDuplicateFailureCountedOnce(t *testing.T) {
	const n = 6
	cfg := schema.DefaultConfig()
	task := schema.Task{GroupIndex: 0, Index: 0, Prompt: "q", Label: "a"}
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: 1, State: schema.SessionDone, Status: schema.ResultOK}
	ep := &episode{task: task, end: &schema.EpisodeEnd{Rollout: n, Episode: 0, Turns: 2, Status: schema.EpisodeCompleted}}
	ep.acts = []*schema.ActDone{
		{Rollout: n, Episode: 0, Turn: 1, Key: "t1-s1", NodeID: "s1", Tool: "search", Status: schema.ActFailed, ErrorKind: schema.ActErrTransient, Error: "engine down"},
		{Rollout: n, Episode: 0, Turn: 2, Key: "t2-s1", NodeID: "s1", Tool: "search", Status: schema.ActFailed, ErrorKind: schema.ActErrDuplicate, Error: "engine down"},
	}
	_, actor := buildResults(sess, []schema.Task{task}, map[int]*episode{0: ep}, nil)
	if fmt.Sprint(actor.Stats.Failures) != "map[error:1]" {
		t.Fatalf("failures %v, want one error", actor.Stats.Failures)
	}
	out := actor.Tasks[0]
	if out.State != schema.TaskFailed || !strings.Contains(out.Reason, "1 act(s) failed") {
		t.Errorf("actor task %s (%s); want failed, of one act's failure", out.State, out.Reason)
	}
	if !strings.Contains(actor.Reason, "1 of their acts failed") {
		t.Errorf("actor result reason %q; want one act's failure", actor.Reason)
	}
}

// TestAnEvaluationSaysNothingOfSamples: an evaluation delivers no samples
// by design, so its result does not say it has none, as a training
// result with nothing to train on does: an evaluation whose episodes all
// ended well said "no planner sample: tasks 2 evaluated", as if something
// had been lost.
func TestAnEvaluationSaysNothingOfSamples(t *testing.T) {
	const n = 7
	cfg := schema.DefaultConfig()
	cfg.Evaluation = true
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a", Dataset: "nq"}, {GroupIndex: 1, Index: 1, Prompt: "q1", Label: "a", Dataset: "nq"}}
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK}
	eps := map[int]*episode{}
	for e, task := range tasks {
		eps[e] = &episode{task: task, end: &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}}, reward: 1, correct: true}
	}
	planner, actor := buildResults(sess, tasks, eps, nil)
	for _, r := range []result{planner, actor} {
		if r.Status != schema.ResultOK || r.Reason != "" || !r.Evaluation || r.Stats.TaskStates[schema.TaskEvaluated] != len(tasks) {
			t.Errorf("%s result: %s (%q), evaluation %v, tasks %v; want ok, saying nothing, every task evaluated", r.Role, r.Status, r.Reason, r.Evaluation, r.Stats.TaskStates)
		}
	}
}

// TestFewerGroupsThanTargetSaySo: a rollout that asked for target_groups
// and ended with every episode before that many were delivered (the others
// filtered: nothing to train on, or no spread) was ok with nothing said:
// its trainer, counting on K groups, had fewer. It is ok (everything the
// batch could give was delivered) and its reason says how many and why.
func TestFewerGroupsThanTargetSaySo(t *testing.T) {
	const n = 8
	cfg := schema.DefaultConfig()
	cfg.TargetGroups = 2
	tasks := []schema.Task{{GroupIndex: 0, Index: 0, Prompt: "q0", Label: "a"}, {GroupIndex: 0, Index: 1, Prompt: "q0", Label: "a"},
		{GroupIndex: 1, Index: 2, Prompt: "q1", Label: "a"}, {GroupIndex: 1, Index: 3, Prompt: "q1", Label: "a"}}
	sess := &schema.Session{Rollout: n, Config: cfg, Episodes: len(tasks), State: schema.SessionDone, Status: schema.ResultOK,
		Groups: []schema.GroupState{{Index: 0, State: schema.GroupDelivered}, {Index: 1, State: schema.GroupFiltered, Reason: "nothing to train on: 2 failed"}}}
	eps := map[int]*episode{}
	for e, task := range tasks {
		end := &schema.EpisodeEnd{Rollout: n, Episode: e, Turns: 1, Status: schema.EpisodeCompleted, Answers: []string{"a"}}
		if task.GroupIndex == 1 {
			end.Status, end.Reason = schema.EpisodeFailed, "engine down"
		}
		eps[e] = &episode{task: task, end: end, reward: float64(e % 2), planner: &schema.Sample{RolloutID: episodeID(n, e), GroupIndex: task.GroupIndex, Reward: float64(e % 2)}}
	}
	delivered := map[string]map[int]groupCounts{}
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		samples, _ := groupShare(sess, eps, []int{0, 1}, role)
		delivered[role] = map[int]groupCounts{0: {held: asDelivered(samples), samples: len(samples)}}
	}
	planner, _ := buildResults(sess, tasks, eps, delivered)
	want := "1 of the 2 groups asked for (target_groups) were delivered: every episode had ended (the others: 1 filtered)"
	if planner.Status != schema.ResultOK || !strings.HasSuffix(planner.Reason, want) || !strings.Contains(planner.Reason, "2 of 4 episodes failed") {
		t.Errorf("planner result %s (%q); want ok, saying the episodes that failed and then %q", planner.Status, planner.Reason, want)
	}
	sess.Groups[1].State = schema.GroupDelivered
	delivered[schema.RolePlanner][1] = delivered[schema.RolePlanner][0]
	if planner, _ = buildResults(sess, tasks, eps, delivered); strings.Contains(planner.Reason, "target_groups") {
		t.Errorf("both groups delivered, the reason says %q", planner.Reason)
	}
}

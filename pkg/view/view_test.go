package view_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/internal/bustest"
	"github.com/planact/planact/internal/stacktest"
	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/view"
)

// open opens a Reader on url for the test and waits until it has read the
// history.
func open(t *testing.T, url string) *view.Reader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := view.Open(ctx, bustest.Conn(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// A rollout that finished before the reader opened is there in full.
func TestFinishedRollout(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2, ActorErrorRate: 0.3})
	tasks := stacktest.Tasks(4, 2, 1)
	env.Begin(t, 3, tasks, &schema.Config{MaxTurns: 3})
	res := env.Wait(t, 3)

	r := open(t, env.URL)
	list := r.Rollouts()
	if len(list) != 1 {
		t.Fatalf("rollouts: %+v", list)
	}
	s := list[0]
	if s.Rollout != 3 || s.Status != res.Status || s.Ended != len(tasks) || s.Episodes != len(tasks) {
		t.Errorf("summary %+v, result status %s", s, res.Status)
	}
	if s.Acts.Done == 0 || s.Acts.Running != 0 {
		t.Errorf("acts %+v", s.Acts)
	}
	if s.Accuracy == nil || *s.Accuracy != res.Stats.Accuracy || s.MeanReward == nil || *s.MeanReward != res.Stats.MeanReward {
		t.Errorf("accuracy %v mean reward %v, result's %+v", s.Accuracy, s.MeanReward, res.Stats)
	}
	if !slices.Contains(s.WeightVersions[schema.RolePlanner], stacktest.PlannerVersion) || !slices.Contains(s.WeightVersions[schema.RoleActor], stacktest.ActorVersion) {
		t.Errorf("weight versions %v", s.WeightVersions)
	}
	if s.WallMs <= 0 || s.StartedAt.IsZero() || s.FinishedAt.IsZero() {
		t.Errorf("times %+v", s)
	}

	ro, err := r.Rollout(3, view.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ro.EpisodeList) != len(tasks) || ro.PlanFormat != "graph" || ro.MaxTurns != 3 {
		t.Fatalf("rollout: %+v", ro)
	}
	var rewards float64
	for i, e := range ro.EpisodeList {
		if e.Episode != i || e.Status == view.EpisodeRunning || e.Reward == nil || e.Turns < 1 || e.Question != tasks[i].Prompt {
			t.Errorf("episode %+v", e)
			continue
		}
		rewards += *e.Reward
	}
	if mean := rewards / float64(len(tasks)); mean-res.Stats.MeanReward > 1e-9 || res.Stats.MeanReward-mean > 1e-9 {
		t.Errorf("episodes' mean reward %v, result's %v", mean, res.Stats.MeanReward)
	}

	lowest, err := r.Rollout(3, view.Filter{Lowest: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(lowest.EpisodeList) != 2 || *lowest.EpisodeList[0].Reward > *lowest.EpisodeList[1].Reward {
		t.Errorf("lowest 2: %+v", lowest.EpisodeList)
	}
	for _, e := range lowest.EpisodeList {
		for _, o := range ro.EpisodeList {
			if *o.Reward < *e.Reward && !slices.ContainsFunc(lowest.EpisodeList, func(l view.EpisodeSummary) bool { return l.Episode == o.Episode }) {
				t.Errorf("episode %d (reward %v) is lower than %d (%v) but left out", o.Episode, *o.Reward, e.Episode, *e.Reward)
			}
		}
	}
	completed, _ := r.Rollout(3, view.Filter{Status: schema.EpisodeCompleted})
	for _, e := range completed.EpisodeList {
		if e.Status != schema.EpisodeCompleted {
			t.Errorf("filter completed kept %+v", e)
		}
	}

	checked := 0
	for _, e := range ro.EpisodeList {
		ep, err := r.Episode(3, e.Episode)
		if err != nil {
			t.Fatal(err)
		}
		if len(ep.TurnList) != e.Turns || !strings.Contains(ep.TurnList[0].Prompt, tasks[e.Episode].Prompt) || ep.TurnList[0].Output == "" {
			t.Errorf("episode %d turns %+v", e.Episode, ep.TurnList)
		}
		last := ep.TurnList[len(ep.TurnList)-1]
		if e.Status == schema.EpisodeCompleted && (last.Outcome != view.OutcomeAnswer || len(last.Answers) == 0) {
			t.Errorf("episode %d last turn %+v", e.Episode, last)
		}
		for _, turn := range ep.TurnList {
			if turn.Outcome != view.OutcomePlan {
				continue
			}
			checked++
			if len(turn.Graph.Nodes) == 0 || turn.Observation == "" {
				t.Errorf("episode %d turn %d: graph %+v observation %q", e.Episode, turn.Turn, turn.Graph, turn.Observation)
			}
			deps := 0
			critical := 0
			for _, n := range turn.Graph.Nodes {
				deps += len(n.Deps)
				if n.Critical {
					critical++
				}
				if n.Status == view.ActPending || n.Status == view.ActRunning {
					t.Errorf("episode %d node %s still %s", e.Episode, n.Key, n.Status)
				}
			}
			if len(turn.Graph.Edges) != deps || critical == 0 {
				t.Errorf("episode %d turn %d: %d edges for %d dependencies, %d critical", e.Episode, turn.Turn, len(turn.Graph.Edges), deps, critical)
			}
		}
		if len(ep.Timeline) != e.Acts.Done+e.Acts.Failed+e.Acts.Skipped+e.Acts.Cached || len(ep.CriticalPath) == 0 && len(ep.Timeline) > 0 {
			t.Errorf("episode %d: timeline %d acts, counts %+v, critical %v", e.Episode, len(ep.Timeline), e.Acts, ep.CriticalPath)
		}
		for _, a := range ep.Timeline {
			if a.Status == schema.ActDoneOK && (a.ReleasedMs == 0 || a.StartedMs < a.ReleasedMs || a.EndedMs < a.StartedMs || a.Attempts < 1 || a.Replica == "") {
				t.Errorf("episode %d act %+v", e.Episode, a)
			}
		}
	}
	if checked == 0 {
		t.Error("no turn had a plan")
	}
	if _, err := r.Episode(3, len(tasks)); err == nil {
		t.Error("an episode past the last one was found")
	}
	if _, err := r.Rollout(4, view.Filter{}); err == nil || !strings.Contains(err.Error(), "rollout 4") {
		t.Errorf("unknown rollout: %v", err)
	}
}

// A reader open while a rollout runs sees it progress, and is told so.
func TestLiveRollout(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1, TTFT: 50 * time.Millisecond}, sim.Config{Seed: 2, TTFT: 100 * time.Millisecond})
	r := open(t, env.URL)
	changes, stop := r.Subscribe()
	defer stop()
	tasks := stacktest.Tasks(3, 1, 2)
	env.Begin(t, 9, tasks, nil)

	deadline := time.After(3 * time.Minute)
	var sawRunning, sawActRunning bool
	for {
		select {
		case <-changes:
		case <-deadline:
			t.Fatalf("the rollout did not end in the view; sawRunning %v, list %+v", sawRunning, r.Rollouts())
		}
		list := r.Rollouts()
		if len(list) == 0 {
			continue
		}
		s := list[0]
		if s.Status == view.StatusRunning {
			sawRunning = true
			sawActRunning = sawActRunning || s.Acts.Running > 0
		}
		if s.Status != view.StatusWaiting && s.Status != view.StatusRunning {
			if !sawRunning || !sawActRunning {
				t.Errorf("never saw it running (%v) with an act running (%v)", sawRunning, sawActRunning)
			}
			if s.Ended != len(tasks) || s.Acts.Running != 0 {
				t.Errorf("ended: %+v", s)
			}
			return
		}
	}
}

func TestParseFilter(t *testing.T) {
	for _, c := range []struct {
		query, want string
	}{
		{"", ""},
		{"status=failed&lowest=3", ""},
		{"status=broken", `status "broken"`},
		{"lowest=0", `lowest "0"`},
		{"lowest=x", `lowest "x"`},
	} {
		q, _ := url.ParseQuery(c.query)
		_, err := view.ParseFilter(q)
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.query, err, c.want)
		}
	}
}

// A Reader creates no consumer on what it reads (its user needs no right
// to create one): it reads with direct gets, and reads on after Close.
func TestReaderCreatesNoConsumer(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	nc := bustest.Conn(t, env.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	consumers := func() map[string]int {
		out := map[string]int{}
		for _, name := range []string{bus.StreamRollout, bus.StreamPlan, bus.StreamAct, bus.StreamTrainer(schema.RolePlanner),
			bus.StreamTrainer(schema.RoleActor), "KV_" + bus.BucketRuns} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = info.State.Consumers
		}
		return out
	}
	before := consumers()
	env.Begin(t, 61, stacktest.Tasks(2, 1, 61), nil)
	r := open(t, env.URL)
	env.Wait(t, 61)
	if during := consumers(); fmt.Sprint(during) != fmt.Sprint(before) {
		t.Errorf("consumers %v while the reader reads, %v before", during, before)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ro, err := r.Rollout(61, view.Filter{})
		if err == nil && ro.Status == schema.ResultOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout 61 as the reader sees it: %+v, %v", ro, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Close()
}

// Of the finished rollouts beyond KeepFull, the view keeps only what its
// lists need; an episode of theirs is read again from the streams and is
// the same as one kept in full.
func TestOldRolloutsAreReadAgain(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	tasks := stacktest.Tasks(3, 1, 1)
	for n := int64(1); n <= 3; n++ {
		env.Begin(t, n, tasks, &schema.Config{MaxTurns: 3})
		env.Wait(t, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	full := open(t, env.URL)
	small, err := view.OpenWith(ctx, bustest.Conn(t, env.URL), view.Options{KeepFull: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	if err := small.Synced(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := asJSON(t, small.Rollouts()), asJSON(t, full.Rollouts()); got != want {
		t.Errorf("summaries differ once texts are dropped:\n%s\nwant\n%s", got, want)
	}
	for n := int64(1); n <= 3; n++ {
		a, err := small.Rollout(n, view.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := full.Rollout(n, view.Filter{})
		if asJSON(t, a.EpisodeList) != asJSON(t, b.EpisodeList) {
			t.Errorf("rollout %d: episodes\n%s\nwant\n%s", n, asJSON(t, a.EpisodeList), asJSON(t, b.EpisodeList))
		}
		for e := range tasks {
			got, err := small.Episode(n, e)
			if err != nil {
				t.Fatalf("rollout %d episode %d: %v", n, e, err)
			}
			want, _ := full.Episode(n, e)
			if len(got.TurnList) == 0 || got.TurnList[0].Output == "" {
				t.Errorf("rollout %d episode %d: no turns read again: %+v", n, e, got)
			}
			if asJSON(t, got) != asJSON(t, want) {
				t.Errorf("rollout %d episode %d read again:\n%s\nwant\n%s", n, e, asJSON(t, got), asJSON(t, want))
			}
		}
	}
	if !view.Compacted(small, 1) || view.Compacted(small, 3) || view.Compacted(full, 1) {
		t.Errorf("compacted: rollout 1 %v, rollout 3 %v (KeepFull 1); rollout 1 %v (default)",
			view.Compacted(small, 1), view.Compacted(small, 3), view.Compacted(full, 1))
	}
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A rollout whose arrival was refused says so, with the reason, until a
// corrected arrival comes.
func TestRejectedArrival(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	b := bustest.Bus(t, env.URL, "trainer")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := &schema.Arrive{Rollout: 8, Role: schema.RolePlanner, Engine: env.Planner, Tasks: stacktest.Tasks(1, 1, 1), Config: &schema.Config{MaxTurns: -2}}
	if err := b.Publish(ctx, bad); err != nil {
		t.Fatal(err)
	}
	r := open(t, env.URL)
	var s view.RolloutSummary
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if l := r.Rollouts(); len(l) == 1 {
			s = l[0]
		}
		if s.Status == view.StatusRejected || time.Now().After(deadline) {
			break
		}
	}
	if s.Status != view.StatusRejected || !strings.Contains(s.Reason, "planner arrival refused") || !strings.Contains(s.Reason, "max_turns") {
		t.Fatalf("rollout 8: %+v; want it rejected, naming max_turns", s)
	}
	env.Begin(t, 8, stacktest.Tasks(1, 1, 1), &schema.Config{MaxTurns: 2})
	env.Wait(t, 8)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		s = r.Rollouts()[0]
		if s.Status == schema.ResultOK || time.Now().After(deadline) {
			break
		}
	}
	if s.Status != schema.ResultOK {
		t.Errorf("rollout 8 after a corrected arrival: %+v", s)
	}
}

// The tasks a rollout shows (questions, labels and the rewards scored
// against them) are those of the arrival planact took, not those of a
// refused one read first. Before, the first arrival read gave them.
func TestRefusedArrivalsTasksAreNotShown(t *testing.T) {
	env := stacktest.Start(t, sim.Config{Seed: 1}, sim.Config{Seed: 2})
	b := bustest.Bus(t, env.URL, "trainer")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	poisoned := []schema.Task{{Prompt: "poisoned question", Label: "poisoned label"}, {Prompt: "another", Label: "x"}}
	bad := &schema.Arrive{Rollout: 9, Role: schema.RolePlanner, Engine: env.Planner, Tasks: poisoned, Config: &schema.Config{MaxTurns: -2, Reward: "em"}}
	if err := b.Publish(ctx, bad); err != nil {
		t.Fatal(err)
	}
	tasks := stacktest.Tasks(2, 1, 9)
	env.Begin(t, 9, tasks, &schema.Config{MaxTurns: 2})
	res := env.Wait(t, 9)
	r := open(t, env.URL)
	ro, err := r.Rollout(9, view.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if ro.MaxTurns != 2 || ro.Reward == "em" {
		t.Errorf("rollout 9 shows the refused arrival's config: max turns %d, reward %q", ro.MaxTurns, ro.Reward)
	}
	if len(ro.EpisodeList) != len(tasks) {
		t.Fatalf("rollout 9: %+v", ro)
	}
	var rewards float64
	for i, e := range ro.EpisodeList {
		if e.Question != tasks[i].Prompt || e.Label != tasks[i].Label || e.Reward == nil {
			t.Errorf("episode %d shows %q (label %q, reward %v), want the tasks the rollout ran: %q (%q)", i, e.Question, e.Label, e.Reward, tasks[i].Prompt, tasks[i].Label)
			continue
		}
		rewards += *e.Reward
	}
	if mean := rewards / float64(len(tasks)); mean-res.Stats.MeanReward > 1e-9 || res.Stats.MeanReward-mean > 1e-9 {
		t.Errorf("episodes' mean reward %v, result's %v", mean, res.Stats.MeanReward)
	}
}

package e2e

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/reward"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// TestEvaluationYieldsMetricsNotSamples: an evaluation rollout (config
// evaluation, greedy sampling) of tasks from two datasets runs both roles
// through planact like any rollout, and both trainers' client.Evaluate
// get the same answer: no samples, every episode's outcome (status,
// reward, answers, turns, acts), tasks evaluated, and per dataset the
// episodes, accuracy, mean reward, turns and acts those outcomes make. A
// training rollout of the same tasks, for comparison, holds samples and a
// result many times larger. evaluation with group streaming is refused,
// naming the fields; an actor that evaluates a rollout whose planner asked
// for training is told so.
func TestEvaluationYieldsMetricsNotSamples(t *testing.T) {
	t.Parallel()
	e := start(t, envOptions{actor: sim.Config{ActorErrorRate: 0.3, Seed: 2}})
	tasks := e.tasks(6, 2, 23)
	for i := range tasks {
		tasks[i].Dataset = []string{"hotpotqa", "nq"}[tasks[i].GroupIndex%2]
	}
	greedy := &schema.Config{PlannerSampling: schema.Sampling{Temperature: schema.Float(0)}, ActorSampling: schema.Sampling{Temperature: schema.Float(0)}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	planner, actor := e.trainer(t), e.trainer(t)
	const n = 60
	var pr, ar *schema.Result
	var perr, aerr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		pr, perr = planner.Evaluate(ctx, &schema.Arrive{Rollout: n, Role: schema.RolePlanner, Engine: e.planner, WeightVersion: "planner-v7", Tasks: tasks, Config: greedy}, 0)
	}()
	go func() {
		defer wg.Done()
		ar, aerr = actor.Evaluate(ctx, &schema.Arrive{Rollout: n, Role: schema.RoleActor, Engine: e.actor, WeightVersion: "actor-v3"}, 0)
	}()
	wg.Wait()
	if perr != nil || aerr != nil {
		t.Fatalf("evaluate: planner %v, actor %v", perr, aerr)
	}
	for _, r := range []*schema.Result{pr, ar} {
		if r.Status != schema.ResultOK || !r.Evaluation || len(r.Samples) != 0 || r.SampleCount != 0 || r.SamplesObject != "" {
			t.Fatalf("%s: status %s (%s), evaluation %v, %d samples (%d, object %q): want ok, an evaluation, no samples",
				r.Role, r.Status, r.Reason, r.Evaluation, len(r.Samples), r.SampleCount, r.SamplesObject)
		}
		if len(r.Episodes) != len(tasks) || r.Stats.TaskStates[schema.TaskEvaluated] != len(tasks) {
			t.Fatalf("%s: %d episodes, task states %v, for %d tasks", r.Role, len(r.Episodes), r.Stats.TaskStates, len(tasks))
		}
	}
	type sum struct {
		episodes, correct, acts int
		reward, turns           float64
	}
	sums := map[string]*sum{}
	rewards := map[float64]bool{}
	for i, o := range pr.Episodes {
		task := tasks[i]
		if !reflect.DeepEqual(o, ar.Episodes[i]) || o.Episode != i || o.Dataset != task.Dataset || o.GroupIndex != task.GroupIndex {
			t.Errorf("episode %d: planner says %+v, actor %+v, task %+v", i, o, ar.Episodes[i], task)
		}
		if o.Status != schema.EpisodeCompleted || o.Turns < 1 || o.Acts < 1 {
			t.Errorf("episode %d: %+v: want completed, with turns and acts", i, o)
		}
		if want := reward.F1(joinAnswers(toAny(o.Answers)), task.Label); o.Reward != want {
			t.Errorf("episode %d: reward %v, want F1(%q, %q) = %v", i, o.Reward, o.Answers, task.Label, want)
		}
		s := sums[o.Dataset]
		if s == nil {
			s = &sum{}
			sums[o.Dataset] = s
		}
		s.episodes++
		s.acts += o.Acts
		s.reward += o.Reward
		s.turns += float64(o.Turns)
		if o.Correct {
			s.correct++
		}
		rewards[o.Reward] = true
	}
	if len(rewards) < 2 {
		t.Errorf("every episode scored the same (%v): the evaluation shows nothing", rewards)
	}
	if len(pr.Stats.Datasets) != 2 {
		t.Fatalf("datasets %v, want hotpotqa and nq", pr.Stats.Datasets)
	}
	for name, s := range sums {
		ds := pr.Stats.Datasets[name]
		c := float64(s.episodes)
		if ds.Episodes != s.episodes || ds.Ended != s.episodes || ds.Correct != s.correct || ds.Acts != s.acts ||
			math.Abs(ds.Accuracy-float64(s.correct)/c) > 1e-12 || math.Abs(ds.MeanReward-s.reward/c) > 1e-12 ||
			math.Abs(ds.MeanTurns-s.turns/c) > 1e-12 || math.Abs(ds.ActsPerEpisode-float64(s.acts)/c) > 1e-12 {
			t.Errorf("dataset %s: %+v; its episodes make %+v", name, ds, *s)
		}
		t.Logf("dataset %s: %d episodes, accuracy %.2f, mean reward %.3f, %.2f turns and %.2f acts per episode",
			name, ds.Episodes, ds.Accuracy, ds.MeanReward, ds.MeanTurns, ds.ActsPerEpisode)
	}

	// The same tasks, trained on: samples, and a result many times larger.
	o := e.rollout(t, planner, actor, n+1, tasks, greedy, false)
	if o.perr != nil || o.aerr != nil || len(o.planner.Samples) != len(tasks) {
		t.Fatalf("training rollout: %v / %v, %d planner samples", o.perr, o.aerr, len(o.planner.Samples))
	}
	evalSize, trainSize := len(marshal(t, pr)), len(marshal(t, o.planner))
	t.Logf("the planner's result: %d bytes for the evaluation, %d for training", evalSize, trainSize)
	if evalSize*4 > trainSize {
		t.Errorf("the evaluation's result is %d bytes, the training's %d: want it far smaller", evalSize, trainSize)
	}

	// An evaluation that streams groups is refused.
	bad := &schema.Config{Evaluation: true, StreamGroups: true}
	_, err := planner.Rollout(ctx, &schema.Arrive{Rollout: n + 2, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks, Config: bad}, time.Minute)
	if !errors.Is(err, client.ErrRejected) || !strings.Contains(err.Error(), "evaluation") || !strings.Contains(err.Error(), "stream_groups") {
		t.Errorf("evaluation with stream_groups: %v, want a rejection naming both", err)
	}
	// The planner asks for training: the actor's Evaluate says so.
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, perr = planner.Rollout(ctx, &schema.Arrive{Rollout: n + 3, Role: schema.RolePlanner, Engine: e.planner, Tasks: tasks[:2]}, time.Minute)
	}()
	_, aerr = actor.Evaluate(ctx, &schema.Arrive{Rollout: n + 3, Role: schema.RoleActor, Engine: e.actor}, time.Minute)
	wg.Wait()
	if perr != nil || !errors.Is(aerr, client.ErrRejected) || !strings.Contains(aerr.Error(), "not an evaluation") {
		t.Errorf("actor evaluates a training rollout: planner %v, actor %v: want the actor told it is not an evaluation", perr, aerr)
	}
}

func toAny(ss []string) any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

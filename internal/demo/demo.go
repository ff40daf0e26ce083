// Package demo plays both trainers against a running planact: for each
// rollout the planner job and the actor job arrive on their own
// connections, wait for their results, and the demo sums up what they got.
package demo

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planact/planact/pkg/bus"
	"github.com/planact/planact/pkg/client"
	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
)

// Options configure a demo run.
type Options struct {
	Conn             bus.ConnOptions // how both trainers connect
	PlannerEngine    schema.Engine
	ActorEngine      schema.Engine
	Rollouts         int   // default 3
	FirstRollout     int64 // id of the first rollout
	Tasks            int   // distinct tasks per rollout; default 4
	SamplesPerPrompt int   // copies of each task (a group); default 2
	Concurrent       int   // rollouts in flight at once; default 2
	Seed             int64
	Config           schema.Config
	Timeout          time.Duration // per rollout; default 5m
	Progress         io.Writer     // nil = quiet
	// Kind keeps only questions whose kind starts with it ("compare",
	// "chain2", "chain3"); "" keeps the world's mix.
	Kind string
}

// Summary is what the demo prints (and `--json` emits as one object).
type Summary struct {
	RolloutsCompleted int            `json:"rollouts_completed"`
	RolloutsFailed    int            `json:"rollouts_failed"`
	Episodes          int            `json:"episodes"`
	Acts              int            `json:"acts"`
	Correct           int            `json:"correct"`
	Accuracy          float64        `json:"accuracy"`
	MeanReward        float64        `json:"mean_reward"`
	MeanTurns         float64        `json:"mean_turns"`
	PlannerSamples    int            `json:"planner_samples"`
	ActorSamples      int            `json:"actor_samples"`
	PlannerTokens     int            `json:"planner_tokens"`
	ActorTokens       int            `json:"actor_tokens"`
	EpisodeStatus     map[string]int `json:"episode_status"`
	Example           *Example       `json:"example,omitempty"`
	WallSeconds       float64        `json:"wall_seconds"`
	// EpisodeSeconds are the mean and 95th percentile of the time from a
	// rollout's start to the end of each of its episodes.
	MeanEpisodeSeconds float64  `json:"mean_episode_seconds"`
	P95EpisodeSeconds  float64  `json:"p95_episode_seconds"`
	Errors             []string `json:"errors,omitempty"`
}

// Example is one episode as the planner saw it: plans, observations, answer.
type Example struct {
	Rollout    int64   `json:"rollout"`
	Episode    string  `json:"episode"`
	Question   string  `json:"question"`
	Label      string  `json:"label"`
	Transcript string  `json:"transcript"`
	Reward     float64 `json:"reward"`
}

// Run plays the trainers and returns the summary; when ctx ends first, what
// it has so far and ctx's error.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Rollouts < 1 || o.Tasks < 1 || o.SamplesPerPrompt < 1 {
		return nil, fmt.Errorf("demo: %d rollouts of %d tasks × %d samples: want at least one of each", o.Rollouts, o.Tasks, o.SamplesPerPrompt)
	}
	if o.Concurrent <= 0 {
		o.Concurrent = 2
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	planner, err := trainer(o.Conn, "planact-demo-planner")
	if err != nil {
		return nil, err
	}
	defer planner.nc.Close()
	actor, err := trainer(o.Conn, "planact-demo-actor")
	if err != nil {
		return nil, err
	}
	defer actor.nc.Close()

	world := sim.DefaultWorld()
	sum := &Summary{EpisodeStatus: map[string]int{}}
	var mu sync.Mutex
	var rewardSum, turnSum float64
	var episodeSecs []float64
	start := time.Now()
	sem := make(chan struct{}, o.Concurrent)
	var wg sync.WaitGroup
	for i := 0; i < o.Rollouts && ctx.Err() == nil; i++ {
		n := o.FirstRollout + int64(i)
		tasks := Tasks(world, o.Tasks, o.SamplesPerPrompt, o.Seed+n, o.Kind)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			pr, ar, err := rollout(ctx, planner.c, actor.c, n, tasks, o)
			mu.Lock()
			defer mu.Unlock()
			if ctx.Err() != nil {
				return // interrupted: not a failure of the rollout, and said once by the caller
			}
			if err != nil {
				sum.RolloutsFailed++
				sum.Errors = append(sum.Errors, fmt.Sprintf("rollout %d: %v", n, err))
				progress(o.Progress, "rollout %d: FAILED: %v\n", n, err)
				return
			}
			st := pr.Stats
			sum.RolloutsCompleted++
			sum.Episodes += st.Episodes
			sum.Acts += st.Acts
			sum.Correct += st.Correct
			sum.PlannerSamples += len(pr.Samples)
			sum.ActorSamples += len(ar.Samples)
			sum.PlannerTokens += st.Tokens[schema.RolePlanner]
			sum.ActorTokens += st.Tokens[schema.RoleActor]
			if len(pr.Samples) > 0 && (sum.Example == nil || n < sum.Example.Rollout) {
				s := pr.Samples[0]
				sum.Example = &Example{Rollout: n, Episode: s.RolloutID, Question: tasks[s.Index].Prompt, Label: s.Label, Transcript: s.Response, Reward: s.Reward}
			}
			for _, s := range pr.Samples {
				if ended := asMs(s.Metadata["ended_ms"]); ended > 0 && st.StartedMs > 0 {
					episodeSecs = append(episodeSecs, float64(ended-st.StartedMs)/1000)
				}
			}
			for k, v := range st.EpisodeStatus {
				sum.EpisodeStatus[k] += v
			}
			rewardSum += st.MeanReward * float64(st.Ended)
			turnSum += st.MeanTurns * float64(st.Ended)
			progress(o.Progress, "rollout %d: %s — %d episodes, accuracy %.0f%%, mean reward %.2f, %.1f turns and %.1f acts per episode; planner got %d samples, actor got %d (%.1fs)\n",
				n, pr.Status, st.Episodes, 100*st.Accuracy, st.MeanReward, st.MeanTurns, st.ActsPerEpisode, len(pr.Samples), len(ar.Samples), float64(st.WallMs)/1000)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	sum.WallSeconds = time.Since(start).Seconds()
	if len(episodeSecs) > 0 {
		sort.Float64s(episodeSecs)
		total := 0.0
		for _, s := range episodeSecs {
			total += s
		}
		sum.MeanEpisodeSeconds = total / float64(len(episodeSecs))
		sum.P95EpisodeSeconds = episodeSecs[(len(episodeSecs)*95-1)/100]
	}
	if sum.Episodes > 0 {
		sum.Accuracy = float64(sum.Correct) / float64(sum.Episodes)
		sum.MeanReward = rewardSum / float64(sum.Episodes)
		sum.MeanTurns = turnSum / float64(sum.Episodes)
	}
	return sum, nil
}

// Tasks builds a batch the way a trainer does: each distinct question is a
// group of samplesPerPrompt copies sharing a group_index.
func Tasks(w *sim.World, distinct, samplesPerPrompt int, seed int64, kind string) []schema.Task {
	var picked []sim.Task
	for _, t := range w.Tasks(distinct*16, seed) {
		if len(picked) < distinct && strings.HasPrefix(t.Kind, kind) {
			picked = append(picked, t)
		}
	}
	var tasks []schema.Task
	for g, t := range picked {
		for k := 0; k < samplesPerPrompt; k++ {
			tasks = append(tasks, schema.Task{GroupIndex: g, Index: len(tasks), Prompt: t.Question, Label: t.Label})
		}
	}
	return tasks
}

type job struct {
	nc *nats.Conn
	c  *client.Client
}

func trainer(conn bus.ConnOptions, name string) (*job, error) {
	nc, err := conn.Dial(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c, err := client.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &job{nc: nc, c: c}, nil
}

// rollout has both jobs arrive, each on its own connection, and wait.
func rollout(ctx context.Context, planner, actor *client.Client, n int64, tasks []schema.Task, o Options) (pr, ar *schema.Result, err error) {
	cfg := o.Config
	var wg sync.WaitGroup
	var perr, aerr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		pr, perr = planner.Rollout(ctx, &schema.Arrive{
			Rollout: n, Role: schema.RolePlanner, Engine: o.PlannerEngine, WeightVersion: "planner-v1",
			Tasks: tasks, Config: &cfg,
		}, o.Timeout)
	}()
	go func() {
		defer wg.Done()
		ar, aerr = actor.Rollout(ctx, &schema.Arrive{
			Rollout: n, Role: schema.RoleActor, Engine: o.ActorEngine, WeightVersion: "actor-v1",
		}, o.Timeout)
	}()
	wg.Wait()
	if perr != nil {
		return nil, nil, fmt.Errorf("planner: %w", perr)
	}
	if aerr != nil {
		return nil, nil, fmt.Errorf("actor: %w", aerr)
	}
	return pr, ar, nil
}

// asMs reads a millisecond timestamp from decoded sample metadata.
func asMs(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	case int:
		return int64(x)
	case float64:
		return int64(x)
	}
	return 0
}

func progress(w io.Writer, format string, a ...any) {
	if w != nil {
		fmt.Fprintf(w, format, a...)
	}
}

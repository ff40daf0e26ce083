package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/planact/planact/pkg/schema"
	"github.com/planact/planact/pkg/sim"
	"github.com/planact/planact/pkg/subject"
)

// slimeTrainSide runs, for each global batch size in sys.argv[1] (JSON),
// the actor's rollout function and what slime's RolloutManager does with
// its output before training (the stand-ins of slime/ray/rollout.py and
// slime/utils/dp_schedule.py): rollout_id check, flattening, reward
// post-processing (slime_planact.reward_post_process, or slime's own when
// sys.argv[2] is "default"), train data, and the step split. It prints,
// per batch size, every sample with its reward and advantage, the ranks'
// partitions and steps, or the error. "unfitted" is the split slime would
// make of the same batch with one rollout id per episode, as planact's
// samples come.
const slimeTrainSide = `
from slime.ray.rollout import RolloutManager
from slime.utils.dp_schedule import build_dp_schedule

def train_args(engine, gbs):
    return rollout_args(engine, batch=int(sys.argv[3]), global_batch_size=gbs, advantage_estimator="grpo",
                        rewards_normalization=True, grpo_std_normalization=True, reward_key=None,
                        n_samples_per_prompt=int(sys.argv[4]), use_dynamic_batch_size=False, micro_batch_size=1,
                        max_tokens_per_gpu=None, balance_data=False, balance_by_flops=False,
                        rollout_function_path="slime_planact.generate_rollout", custom_reward_post_process_path=custom,
                        custom_convert_samples_to_train_data_path=None)

custom = None if sys.argv[2] == "default" else "slime_planact.reward_post_process"
report = {}
for gbs in json.loads(sys.argv[1]):
    manager = RolloutManager(train_args("http://slime-router:30000", gbs))
    try:
        samples, metrics, data, split = manager.generate(int(sys.argv[5]))
    except Exception as e:
        report[gbs] = {"error": type(e).__name__ + ": " + str(e)}
        continue
    # slime's --save-debug-rollout-data / --load-debug-rollout-data keep
    # samples as Sample.to_dict and read them back with Sample.from_dict.
    from slime.utils.types import Sample as SlimeSample
    assert [SlimeSample.from_dict(s.to_dict()) for s in samples] == samples, "samples changed by to_dict/from_dict"
    # What slime's own post-processing would make of the same samples.
    own, manager.custom_reward_post_process_func = manager.custom_reward_post_process_func, None
    slime_own = manager._post_process_rewards(samples)[1]
    manager.custom_reward_post_process_func = own
    episodes = {}
    for s in samples:
        episodes.setdefault(s.metadata["planact_rollout_id"], len(episodes))
    unfitted = {"placed": 0}
    try:
        parts, _, _, sizes = build_dp_schedule(manager.args, manager.train_parallel_config, data["total_lengths"],
                                               global_batch_size=gbs,
                                               rollout_indices=[episodes[s.metadata["planact_rollout_id"]] for s in samples])
        unfitted = {"placed": sum(len(p) for p in parts), "steps": len(sizes)}
    except AssertionError as e:
        unfitted = {"placed": 0, "error": str(e)}
    report[gbs] = {
        "samples": [{"episode": s.metadata["planact_rollout_id"], "group_index": s.group_index, "key": s.metadata.get("key"),
                     "rollout_id": rid, "raw": raw, "advantage": adv, "slime_own": own}
                    for s, rid, raw, adv, own in zip(samples, data["rollout_ids"], data["raw_reward"], data["rewards"], slime_own)],
        "partitions": split["partitions"], "steps": split["global_batch_sizes"], "metrics": metrics, "unfitted": unfitted}
print(json.dumps(report))
`

type trainSide struct {
	Error   string `json:"error"`
	Samples []struct {
		Episode    string  `json:"episode"`
		GroupIndex int     `json:"group_index"`
		Key        string  `json:"key"`
		RolloutID  int     `json:"rollout_id"`
		Raw        float64 `json:"raw"`
		Advantage  float64 `json:"advantage"`
		SlimeOwn   float64 `json:"slime_own"` // slime's own post-processing's advantage
	} `json:"samples"`
	Partitions [][]int            `json:"partitions"`
	Steps      []int              `json:"steps"`
	Metrics    map[string]float64 `json:"metrics"`
	Unfitted   struct {
		Placed int    `json:"placed"`
		Steps  int    `json:"steps"`
		Error  string `json:"error"`
	} `json:"unfitted"`
}

// TestPythonSlimeActorAdvantages: over a rollout of the simulated world (6
// tasks × 4 copies, the actor wrong 30% of the time), the actor's samples
// go through slime_planact and through what slime does with them before
// training (the stand-ins). With slime_planact.reward_post_process the
// actor's advantages are group-relative over episodes: non-zero in every
// group whose episode outcomes differ, zero in every group whose outcomes
// are all equal, each the episode's (outcome - mean) / (std + 1e-6)
// computed here again. Whatever the global batch size (one that divides
// the episodes, one that does not, one larger than the episodes), every
// sample lands in exactly one of max(1, episodes // global_batch_size)
// training steps, where one rollout id per episode (planact's samples as
// they come) would leave samples out or fail slime's assertion; a global
// batch size larger than the samples is refused, saying so. slime's own
// post-processing normalizes the actor's batch as one group (its sample
// count is not rollout_batch_size × n_samples_per_prompt), which gives
// groups of equal outcomes non-zero advantages: why the hook is shipped,
// and why a job without it is refused, naming the flag.
func TestPythonSlimeActorAdvantages(t *testing.T) {
	t.Parallel()
	python(t)
	e := start(t, envOptions{actor: sim.Config{ActorErrorRate: 0.3, Seed: 11}, planner: sim.Config{Seed: 5}})
	const n, tasks, copies = 41, 6, 4
	cfg := &schema.Config{PlannerSampling: schema.Sampling{Seed: seed(3)}, ActorSampling: schema.Sampling{Seed: seed(4)}}
	o := e.rollout(t, e.trainer(t), e.trainer(t), n, e.tasks(tasks, copies, 17), cfg, false)
	if o.perr != nil || o.aerr != nil {
		t.Fatalf("rollout: %v / %v", o.perr, o.aerr)
	}
	res := o.actor
	outcome := map[string]float64{} // episode -> reward
	group := map[string]int{}
	for _, s := range res.Samples {
		outcome[s.RolloutID], group[s.RolloutID] = s.Reward, s.GroupIndex
		if r, ok := s.Metadata["episode_reward"].(float64); !ok || r != s.Reward {
			t.Fatalf("actor sample %s %v: metadata episode_reward %v, want its reward %v", s.RolloutID, s.Metadata["key"], s.Metadata["episode_reward"], s.Reward)
		}
	}
	episodes, samples := len(outcome), len(res.Samples)
	// Every group's baseline, from the episodes (each once).
	type stat struct{ mean, std float64 }
	byGroup := map[int][]float64{}
	for ep, r := range outcome {
		byGroup[group[ep]] = append(byGroup[group[ep]], r)
	}
	stats := map[int]stat{}
	spread, flat := 0, 0
	for g, rs := range byGroup {
		sort.Float64s(rs)
		var st stat
		for _, r := range rs {
			st.mean += r / float64(len(rs))
		}
		if len(rs) > 1 {
			for _, r := range rs {
				st.std += (r - st.mean) * (r - st.mean)
			}
			st.std = math.Sqrt(st.std / float64(len(rs)-1))
		}
		stats[g] = st
		if rs[0] != rs[len(rs)-1] {
			spread++
		} else {
			flat++
		}
	}
	t.Logf("rollout %d: %d actor samples of %d episodes in %d groups (%d with outcomes that differ, %d all equal)", n, samples, episodes, len(byGroup), spread, flat)
	if spread == 0 || flat == 0 {
		t.Fatalf("the batch needs groups of both kinds to show anything: %d spread, %d flat (outcomes by group %v)", spread, flat, byGroup)
	}

	var feed slimeFeed
	stored := *res
	// The answer to the module's own arrival, which it names (the Go
	// trainer's arrival made it), its samples inline.
	stored.SamplesObject, stored.ArrivalID = "", ""
	feed.answer(t, subject.Result(n, schema.RoleActor), &stored)
	engine := engineServer(t, "actor-v3")
	env := map[string]string{"PLANACT_ROLE": "actor", "PLANACT_ENGINE_URL": engine, "PLANACT_TIMEOUT_S": "60"}
	sizes := []int{episodes, 4, 5, episodes + 3, samples + 1}
	out, err := slimeRun(t, slimeTrainSide, env, feed, jsonOf(t, sizes), "planact", "6", "4", "41")
	if err != nil {
		t.Fatal(err)
	}
	var report map[int]trainSide
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	for _, gbs := range sizes {
		r := report[gbs]
		if gbs > samples {
			if r.Error == "" || !strings.Contains(r.Error, "too_small") || !strings.Contains(r.Error, "--global-batch-size") {
				t.Errorf("global batch size %d > %d samples: error %q, want PlanactError too_small naming --global-batch-size", gbs, samples, r.Error)
			}
			continue
		}
		if r.Error != "" {
			t.Errorf("global batch size %d: %s", gbs, r.Error)
			continue
		}
		if len(r.Samples) != samples {
			t.Errorf("global batch size %d: slime got %d samples, planact gave %d", gbs, len(r.Samples), samples)
		}
		// Every sample in exactly one step.
		placed := map[int]int{}
		for _, p := range r.Partitions {
			for _, i := range p {
				placed[i]++
			}
		}
		for i := range r.Samples {
			if placed[i] != 1 {
				t.Errorf("global batch size %d: sample %d (%s %s) placed %d times", gbs, i, r.Samples[i].Episode, r.Samples[i].Key, placed[i])
			}
		}
		if want := max(1, episodes/gbs); len(r.Steps) != want || int(r.Metrics["planact/train_steps"]) != want {
			t.Errorf("global batch size %d: %d steps (metric %v), want max(1, %d episodes // %d) = %d", gbs, len(r.Steps), r.Metrics["planact/train_steps"], episodes, gbs, want)
		}
		// One rollout id per episode, as planact's samples come, would
		// have left samples out or failed slime's assertion here.
		if episodes%gbs != 0 && r.Unfitted.Placed >= samples {
			t.Errorf("global batch size %d: one rollout id per episode placed all %d samples too: the case shows nothing", gbs, samples)
		}
		// An episode's samples share a rollout id.
		rid := map[string]int{}
		for _, s := range r.Samples {
			if gbs <= episodes {
				if id, ok := rid[s.Episode]; ok && id != s.RolloutID {
					t.Errorf("global batch size %d: episode %s has rollout ids %d and %d", gbs, s.Episode, id, s.RolloutID)
				}
				rid[s.Episode] = s.RolloutID
			}
			st := stats[s.GroupIndex]
			want := (outcome[s.Episode] - st.mean) / (st.std + 1e-6)
			if math.Abs(s.Advantage-want) > 1e-9 || s.Raw != outcome[s.Episode] {
				t.Errorf("global batch size %d: %s %s: reward %v advantage %v, want %v and %v", gbs, s.Episode, s.Key, s.Raw, s.Advantage, outcome[s.Episode], want)
			}
			// Zero exactly where the group's outcomes are all equal (or
			// the episode's is their mean); non-zero elsewhere.
			rs := byGroup[s.GroupIndex]
			if (rs[0] == rs[len(rs)-1] || outcome[s.Episode] == st.mean) != (s.Advantage == 0) {
				t.Errorf("global batch size %d: %s %s in group %d (outcomes %v): advantage %v", gbs, s.Episode, s.Key, s.GroupIndex, rs, s.Advantage)
			}
		}
		t.Logf("global batch size %d: %d steps, %d rollout ids, %v episodes share one, %v samples split off; one id per episode would place %d of %d samples (%s)",
			gbs, len(r.Steps), int(r.Metrics["planact/train_rollouts"]), r.Metrics["planact/episodes_sharing_rollout_id"], r.Metrics["planact/samples_split_off"],
			r.Unfitted.Placed, samples, r.Unfitted.Error)
	}

	// slime's own post-processing, on the same batch, normalizes it as
	// one group: groups of equal outcomes get non-zero advantages.
	wrong := 0
	for _, s := range report[episodes].Samples {
		if rs := byGroup[s.GroupIndex]; rs[0] == rs[len(rs)-1] && s.SlimeOwn != 0 {
			wrong++
		}
	}
	if wrong == 0 {
		t.Errorf("slime's default post-processing gave every sample of a group of equal outcomes 0: the batch shows nothing")
	}
	t.Logf("slime's default post-processing: %d samples of groups whose outcomes are all equal get a non-zero advantage", wrong)
	// So a job without the hook is refused, before it trains so.
	out, err = slimeRun(t, slimeTrainSide, env, feed, jsonOf(t, []int{episodes}), "default", "6", "4", "41")
	if err != nil {
		t.Fatal(err)
	}
	report = nil
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if e := report[episodes].Error; !strings.HasPrefix(e, "ValueError: --advantage-estimator grpo normalizes rewards within groups") ||
		!strings.Contains(e, "--custom-reward-post-process-path slime_planact.reward_post_process") {
		t.Errorf("no --custom-reward-post-process-path: error %q, want a ValueError naming the flag and the hook", e)
	}
}

func seed(v int64) *int64 { return &v }

// slimeEval is what the evaluation scripts print: slime's eval data (per
// dataset, its rewards, truncated flags and samples), the metrics, what
// the module published, and whether slime's eval contract held
// (assert_eval_rollout_contract of tests/plugin_contracts). eval_args are
// slime's args, their eval datasets (sys.argv[1]: --eval-config's datasets)
// resolved by slime's own build_eval_dataset_configs, as slime's
// arguments.py does.
const slimeEval = `
from slime.rollout.base_types import RolloutFnEvalOutput, call_rollout_fn
from slime.utils.eval_config import build_eval_dataset_configs

def eval_args(engine):
    args = rollout_args(engine, input_key="question", label_key="answer", n_samples_per_eval_prompt=2,
                        eval_temperature=None, rollout_temperature=0.8, eval_top_p=None, rollout_top_p=1.0,
                        eval_top_k=None, rollout_top_k=-1, eval_max_response_len=None, rollout_max_response_len=700)
    args.eval_datasets = build_eval_dataset_configs(args, json.loads(sys.argv[1]), {})
    return args

def assert_eval_rollout_contract(output):
    # slime's tests/plugin_contracts/test_plugin_rollout_contracts.py
    assert isinstance(output, RolloutFnEvalOutput)
    assert output.data
    for dataset_data in output.data.values():
        assert set(dataset_data) >= {"rewards", "truncated", "samples"}
        assert len(dataset_data["rewards"]) == len(dataset_data["truncated"]) == len(dataset_data["samples"])
        for sample in dataset_data["samples"]:
            assert isinstance(sample, Sample)
            assert isinstance(sample.tokens, list)
            assert all(isinstance(token, int) for token in sample.tokens)
            assert isinstance(sample.response, str)
            assert isinstance(sample.response_length, int)
            assert sample.reward is not None
            assert isinstance(sample.status, Sample.Status)
`

// pyEvalArrival is one planact rollout of an evaluation as the planner's
// job would send it (slime_planact.eval_arrivals).
type pyEvalArrival struct {
	Rollout  int64         `json:"rollout"`
	Datasets []string      `json:"datasets"`
	Tasks    []schema.Task `json:"tasks"`
	Config   schema.Config `json:"config"`
	// Sampling is the job's own model's, which its arrival brings.
	Sampling schema.Sampling `json:"sampling"`
}

// TestPythonSlimeEvaluation: slime_planact evaluates through planact.
// The planner's job reads slime's eval datasets (two JSON Lines files,
// hotpotqa with its own temperature 0 and max_response_len 300, nq with
// slime's fallbacks, --rollout-temperature 0.8 and
// --rollout-max-response-len 700) into planact tasks naming their dataset.
// The two datasets are two planact evaluation rollouts (a rollout has one
// config), PLANACT_EVAL_ROLLOUT_OFFSET + 2 * (2 * 7) + 0 and + 1, each
// with its dataset's tasks, its config (the training-only group settings
// of PLANACT_CONFIG left out, result_samples included, which planact
// refuses without groups; PLANACT_EVAL_CONFIG over it) and, in each job's
// arrival, its own model's sampling for the dataset.
// planact runs exactly that (both roles, real services, simulated engines)
// and answers with metrics, no samples; both jobs'
// generate_rollout(evaluation=True) arrive for both rollouts and return
// slime's RolloutFnEvalOutput, which passes slime's eval contract: per
// dataset, one reward, truncated flag and Sample per episode (the
// planner's with its prompt and label), and metrics (accuracy, mean
// reward, turns and acts per episode, episode statuses, failures; per
// dataset and overall) equal to planact's numbers.
func TestPythonSlimeEvaluation(t *testing.T) {
	t.Parallel()
	python(t)
	e := start(t, envOptions{actor: sim.Config{ActorErrorRate: 0.3, Seed: 13}})
	dir := t.TempDir()
	var datasets []map[string]any
	for i, name := range []string{"hotpotqa", "nq"} {
		var lines strings.Builder
		for _, task := range e.tasks(3, 1, int64(31+i)) {
			lines.WriteString(jsonOf(t, map[string]any{"question": task.Prompt, "answer": task.Label, "id": i}) + "\n")
		}
		path := filepath.Join(dir, name+".jsonl")
		if err := os.WriteFile(path, []byte(lines.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		datasets = append(datasets, map[string]any{"name": name, "path": path})
	}
	datasets[0]["temperature"], datasets[0]["max_response_len"] = 0.0, 300
	env := map[string]string{"PLANACT_ENGINE_URL": engineServer(t, "step-3"), "PLANACT_TIMEOUT_S": "60",
		"PLANACT_EVAL_ROLLOUT_OFFSET": "1000",
		"PLANACT_CONFIG":              `{"max_turns": 4, "group_filter": "spread", "result_samples": "undelivered", "planner_sampling": {"temperature": 0.7, "max_new_tokens": 900}, "actor_sampling": {"seed": 4}}`,
		"PLANACT_EVAL_CONFIG":         `{"max_turns": 3}`}
	// What each job will send.
	jobSends := func(role string) []pyEvalArrival {
		env["PLANACT_ROLE"] = role
		out, err := slimeRun(t, slimeEval+`
arrivals = slime_planact.eval_arrivals(eval_args("http://slime-router:30000"), 7, slime_planact.settings_from_env())
print(json.dumps([{"rollout": a.fields["rollout"], "datasets": a.datasets, "tasks": a.fields["tasks"], "config": a.fields["config"],
                   "sampling": a.fields["sampling"]} for a in arrivals]))
`, env, slimeFeed{}, jsonOf(t, datasets))
		if err != nil {
			t.Fatal(err)
		}
		var sent []pyEvalArrival
		if err := json.Unmarshal(out, &sent); err != nil {
			t.Fatalf("python printed %q: %v", out, err)
		}
		return sent
	}
	sent, actorSent := jobSends(schema.RolePlanner), jobSends(schema.RoleActor)
	if len(actorSent) != len(sent) {
		t.Fatalf("the actor's job arrives for %d rollouts, the planner's for %d", len(actorSent), len(sent))
	}
	// planact's rollout ids of the evaluation before training at slime's
	// rollout 7, two rollouts: PLANACT_EVAL_ROLLOUT_OFFSET + 2 * (2 * 7) + part.
	want := []struct {
		rollout     int64
		dataset     string
		temperature float64
		maxTokens   int
		first       int // the first task's group_index
	}{{1028, "hotpotqa", 0, 300, 0}, {1029, "nq", 0.8, 700, 3}}
	if len(sent) != len(want) {
		t.Fatalf("evaluation rollouts %+v: want %d, one per dataset", sent, len(want))
	}
	for i, w := range want {
		s := sent[i]
		if s.Rollout != w.rollout || !slices.Equal(s.Datasets, []string{w.dataset}) || len(s.Tasks) != 6 ||
			s.Tasks[0].GroupIndex != w.first || s.Tasks[5].GroupIndex != w.first+2 {
			t.Fatalf("evaluation rollout %d: %d %v with tasks %+v: want %d, %s's 6 tasks (2 copies of 3 prompts) from group %d",
				i, s.Rollout, s.Datasets, s.Tasks, w.rollout, w.dataset, w.first)
		}
		for _, task := range s.Tasks {
			if task.Dataset != w.dataset {
				t.Fatalf("evaluation rollout %d: task %+v of another dataset than %s", s.Rollout, task, w.dataset)
			}
		}
		c := s.Config
		if !c.Evaluation || c.GroupFilter != "" || c.ResultSamples != "" || c.MaxTurns != 3 {
			t.Fatalf("eval config %+v: want evaluation, no group filter or result_samples (planact refuses result_samples without groups), max_turns 3", c)
		}
		for role, sm := range map[string]schema.Sampling{"planner": s.Sampling, "actor": actorSent[i].Sampling} {
			if sm.Temperature == nil || *sm.Temperature != w.temperature || sm.TopP == nil || *sm.TopP != 1 || sm.MaxNewTokens != w.maxTokens {
				t.Fatalf("evaluation %d (%s): %s sampling %+v: want slime's temperature %v, top_p 1, max_new_tokens %d",
					s.Rollout, w.dataset, role, sm, w.temperature, w.maxTokens)
			}
		}
		if sm := actorSent[i].Sampling; sm.Seed == nil || *sm.Seed != 4 {
			t.Fatalf("evaluation %d: actor sampling %+v: want PLANACT_CONFIG's seed kept", s.Rollout, sm)
		}
	}

	// planact runs them, at once, as the module does.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := map[string][]*schema.Result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(sent))
	for i, s := range sent {
		for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
			a := &schema.Arrive{Rollout: s.Rollout, Role: role, Engine: e.actor, Sampling: &actorSent[i].Sampling}
			if role == schema.RolePlanner {
				cfg := s.Config
				a.Engine, a.Tasks, a.Config, a.Sampling = e.planner, s.Tasks, &cfg, &s.Sampling
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := e.trainer(t).Evaluate(ctx, a, 0)
				if err != nil {
					errs <- fmt.Errorf("evaluation %d (%s): %w", a.Rollout, a.Role, err)
					return
				}
				mu.Lock()
				results[role] = append(results[role], r)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	tasks := map[int]schema.Task{} // by index: numbered across the datasets
	for _, s := range sent {
		for _, task := range s.Tasks {
			tasks[task.Index] = task
		}
	}

	// Both jobs' rollout functions, with evaluation=True.
	for _, role := range []string{schema.RolePlanner, schema.RoleActor} {
		var feed slimeFeed
		for _, r := range results[role] {
			stored := *r
			stored.ArrivalID = ""
			feed.answer(t, subject.Result(r.Rollout, role), &stored)
		}
		env["PLANACT_ROLE"] = role
		out, err := slimeRun(t, slimeEval+`
ds = DataSource([])
output = call_rollout_fn(slime_planact.generate_rollout, eval_args("http://slime-router:30000"), 7, ds, evaluation=True)
assert_eval_rollout_contract(output)
print(json.dumps({"data": {name: {"rewards": d["rewards"], "truncated": d["truncated"], "samples": [sample_json(s) for s in d["samples"]]}
                           for name, d in output.data.items()},
                  "metrics": output.metrics, "published": published(), "asked": ds.asked}))
`, env, feed, jsonOf(t, datasets))
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		var got struct {
			Data map[string]struct {
				Rewards   []float64  `json:"rewards"`
				Truncated []bool     `json:"truncated"`
				Samples   []pySample `json:"samples"`
			} `json:"data"`
			Metrics   map[string]float64 `json:"metrics"`
			Published []pyMsg            `json:"published"`
			Asked     []int              `json:"asked"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: python printed %q: %v", role, out, err)
		}
		if len(got.Published) != len(sent) || len(got.Asked) != 0 {
			t.Fatalf("%s: published %d messages, asked the data source for %v: want %d arrivals, and the data source left alone",
				role, len(got.Published), got.Asked, len(sent))
		}
		for i, m := range got.Published {
			var a schema.Arrive
			if err := schema.UnmarshalStrict(m.body(t), &a); err != nil {
				t.Fatalf("%s: the Go decoder refuses the arrival: %v", role, err)
			}
			s := sent[i]
			if a.Rollout != s.Rollout || (role == schema.RolePlanner) != (a.Config != nil && reflect.DeepEqual(*a.Config, s.Config) && reflect.DeepEqual(a.Tasks, s.Tasks)) ||
				(role == schema.RoleActor && (a.Config != nil || len(a.Tasks) != 0)) {
				t.Errorf("%s: arrival for rollout %d with config %+v and %d tasks: want rollout %d, the planner's with the evaluation's config and tasks",
					role, a.Rollout, a.Config, len(a.Tasks), s.Rollout)
			}
		}
		if len(got.Data) != 2 {
			t.Fatalf("%s: datasets %v, want hotpotqa and nq", role, got.Data)
		}
		var ended int
		var correct, reward, acts float64
		slices.SortFunc(results[role], func(a, b *schema.Result) int { return int(a.Rollout - b.Rollout) })
		for _, r := range results[role] {
			if len(r.Stats.Datasets) != 1 {
				t.Fatalf("%s: evaluation %d has datasets %v: want one", role, r.Rollout, r.Stats.Datasets)
			}
			for name, ds := range r.Stats.Datasets {
				ended += ds.Ended
				correct += ds.Accuracy * float64(ds.Ended)
				reward += ds.MeanReward * float64(ds.Ended)
				acts += ds.ActsPerEpisode * float64(ds.Ended)
				d := got.Data[name]
				var rewards []float64
				var truncated []bool
				for _, o := range r.Episodes {
					rewards = append(rewards, o.Reward)
					truncated = append(truncated, o.Status == schema.EpisodeTruncated)
				}
				if !reflect.DeepEqual(d.Rewards, rewards) || !reflect.DeepEqual(d.Truncated, truncated) || len(d.Samples) != ds.Ended {
					t.Errorf("%s: dataset %s: rewards %v truncated %v (%d samples); planact's episodes %v %v (%d ended)", role, name, d.Rewards, d.Truncated, len(d.Samples), rewards, truncated, ds.Ended)
				}
				for k, want := range map[string]float64{"accuracy": ds.Accuracy, "mean_reward": ds.MeanReward, "mean_turns": ds.MeanTurns,
					"acts_per_episode": ds.ActsPerEpisode, "episodes": float64(ds.Episodes)} {
					if got := got.Metrics["planact_eval/"+name+"/"+k]; math.Abs(got-want) > 1e-12 {
						t.Errorf("%s: metric planact_eval/%s/%s = %v, planact says %v", role, name, k, got, want)
					}
				}
				for _, s := range d.Samples {
					task := tasks[s.Index]
					if s.GroupIndex != task.GroupIndex || len(s.Tokens) != 0 || s.Metadata["dataset"] != name ||
						!strings.HasPrefix(fmt.Sprint(s.Metadata["planact_rollout_id"]), fmt.Sprintf("%d-", r.Rollout)) ||
						(role == schema.RolePlanner) != (s.Prompt == task.Prompt && s.Label == task.Label) {
						t.Errorf("%s: eval sample %+v for task %+v of evaluation %d", role, s, task, r.Rollout)
					}
				}
			}
		}
		for k, want := range map[string]float64{"accuracy": correct / float64(ended), "mean_reward": reward / float64(ended),
			"acts_per_episode": acts / float64(ended), "ended": float64(ended)} {
			if got := got.Metrics["planact_eval/"+k]; math.Abs(got-want) > 1e-9 {
				t.Errorf("%s: metric planact_eval/%s = %v, planact's two evaluations say %v", role, k, got, want)
			}
		}
		t.Logf("%s: %v", role, got.Metrics)
	}
}

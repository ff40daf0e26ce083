package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPythonSlimeStandInsAsStrict: the stand-in of slime's RolloutManager
// (examples/python/testing/slime/ray/rollout.py) refuses what slime's
// refuses (THUDM/slime 624b824a), so that a batch the tests pass through
// it would pass slime too. As slime's __init__, it loads the rollout
// function and the reward post-processing from args (a hook handed to it
// any other way is not the one slime would call, and args without the
// flag's attribute are not slime's). As tensorize_rollout_data_for_training,
// it refuses a batch whose first sample has rollout_log_probs and another
// none (torch.as_tensor(None) raises).
func TestPythonSlimeStandInsAsStrict(t *testing.T) {
	t.Parallel()
	out, err := slimeRun(t, `
from slime.ray.rollout import RolloutManager
from slime.rollout.base_types import RolloutFnTrainOutput

def make(rid, log_probs, reward):
    return Sample(group_index=0, index=rid, rollout_id=rid, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1],
                  rollout_log_probs=log_probs, reward=reward, status=Sample.Status.COMPLETED)

def rollout(args, rollout_id, data_source, evaluation=False):
    return RolloutFnTrainOutput(samples=[[make(0, [-0.1, -0.2], 1.0), make(1, LOG_PROBS, 0.0)]], metrics={})

hooked = []
def hook(args, samples):
    hooked.append(len(samples))
    return [s.reward for s in samples], [s.reward - 0.5 for s in samples]

def args(**more):
    return types.SimpleNamespace(**{**dict(rollout_function_path="__main__.rollout", custom_reward_post_process_path="__main__.hook",
        custom_convert_samples_to_train_data_path=None, advantage_estimator="grpo", rewards_normalization=True,
        grpo_std_normalization=True, reward_key=None, n_samples_per_prompt=2, rollout_batch_size=1, global_batch_size=2,
        use_dynamic_batch_size=False, micro_batch_size=1, max_tokens_per_gpu=None, balance_data=False,
        balance_by_flops=False), **more})

report = {}
for name, log_probs, a in [("uniform", [-0.3, -0.4], args()), ("mixed", None, args()),
                           ("no hook flag", [-0.3, -0.4], types.SimpleNamespace(**{k: v for k, v in vars(args()).items()
                                                                                    if k != "custom_reward_post_process_path"}))]:
    LOG_PROBS, hooked = log_probs, []
    try:
        _, _, data, _ = RolloutManager(a).generate(0)
        report[name] = {"rewards": data["rewards"], "hooked": hooked}
    except Exception as e:
        report[name] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(report))
`, nil, slimeFeed{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]struct {
		Error   string    `json:"error"`
		Rewards []float64 `json:"rewards"`
		Hooked  []int     `json:"hooked"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("python printed %q: %v", out, err)
	}
	if u := got["uniform"]; u.Error != "" || len(u.Hooked) != 1 || u.Hooked[0] != 2 || len(u.Rewards) != 2 || u.Rewards[0] != 0.5 {
		t.Errorf("uniform batch: %+v, want trained with the hook args name called once on both samples", u)
	}
	if e := got["mixed"].Error; !strings.HasPrefix(e, "TypeError: rollout_log_probs[") {
		t.Errorf("log-probs for the first sample, None for the second: error %q, want the TypeError torch.as_tensor raises", e)
	}
	if e := got["no hook flag"].Error; !strings.HasPrefix(e, "AttributeError:") || !strings.Contains(e, "custom_reward_post_process_path") {
		t.Errorf("args without custom_reward_post_process_path: error %q, want the AttributeError slime's args never cause", e)
	}
}

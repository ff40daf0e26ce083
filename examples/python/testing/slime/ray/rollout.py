"""Stand-in of the training-data half of RolloutManager in
slime/ray/rollout.py (THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515):
what happens to a rollout function's output before training, without Ray,
torch or engines. Faithful to _get_rollout_data (call, rollout_id check,
flatten), _post_process_rewards (the custom hook, else group norm by
reshape to n_samples_per_prompt when the batch has exactly
rollout_batch_size * n_samples_per_prompt samples, else over the whole
batch), the parts of _convert_samples_to_train_data the step split and the
loss read (rollout ids, loss masks with remove_sample, rollout_mask_sums,
metadata raw_reward, rollout_log_probs from samples[0], and the top-p
replay assertions under --rollout-top-p below 1) and
_split_train_data_by_dp's call of build_dp_schedule, whose per-rank
partitions it returns instead of Ray object refs. As slime's __init__, it
loads the rollout function and the custom reward post-processing and
train-data conversion from args (rollout_function_path,
custom_reward_post_process_path, custom_convert_samples_to_train_data_path:
every one must be there, as in slime's args), and as
tensorize_rollout_data_for_training
(slime/observability/rollout_data_utils.py) it refuses a per-sample value
torch.as_tensor could not make a tensor of (a None among rollout_log_probs:
slime takes the key from samples[0] alone)."""

import itertools
import math

from slime.observability.rollout_data_utils import validate_rollout_id_annotated
from slime.rollout.base_types import call_rollout_fn
from slime.utils.dp_schedule import build_dp_schedule
from slime.utils.misc import load_function
from slime.utils.types import Sample


class RolloutManager:
    def __init__(self, args, train_parallel_config=None):
        self.args = args
        self.generate_rollout = load_function(self.args.rollout_function_path)
        self.custom_reward_post_process_func = None
        if self.args.custom_reward_post_process_path is not None:
            self.custom_reward_post_process_func = load_function(self.args.custom_reward_post_process_path)
        self.custom_convert_samples_to_train_data_func = None
        if self.args.custom_convert_samples_to_train_data_path is not None:
            self.custom_convert_samples_to_train_data_func = load_function(
                self.args.custom_convert_samples_to_train_data_path
            )
        self.train_parallel_config = train_parallel_config or {
            "dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
        self.data_source = None

    def _get_rollout_data(self, rollout_id):
        data = call_rollout_fn(self.generate_rollout, self.args, rollout_id, self.data_source, evaluation=False)
        metrics = data.metrics
        data = data.samples
        validate_rollout_id_annotated(data)
        while isinstance(data[0], list):
            data = list(itertools.chain.from_iterable(data))
        return data, metrics

    def _post_process_rewards(self, samples):
        if self.custom_reward_post_process_func is not None:
            return self.custom_reward_post_process_func(self.args, samples)

        raw_rewards = [sample.get_reward_value(self.args) for sample in samples]
        if (
            self.args.advantage_estimator in ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"]
            and self.args.rewards_normalization
        ):
            # group norm, as slime does it with torch (reshape, mean, std with n-1)
            if len(raw_rewards) == self.args.n_samples_per_prompt * self.args.rollout_batch_size:
                k = self.args.n_samples_per_prompt
                rows = [raw_rewards[i : i + k] for i in range(0, len(raw_rewards), k)]
            else:
                # when samples count are not equal in each group
                rows = [raw_rewards]
            rewards = []
            for row in rows:
                mean = sum(row) / len(row)
                row = [r - mean for r in row]
                if self.args.advantage_estimator in ["grpo", "gspo", "cispo"] and self.args.grpo_std_normalization:
                    std = math.sqrt(sum(r * r for r in row) / (len(row) - 1)) if len(row) > 1 else math.nan
                    row = [r / (std + 1e-6) for r in row]
                rewards.extend(row)
            return raw_rewards, rewards

        return raw_rewards, raw_rewards

    def _convert_samples_to_train_data(self, samples):
        if self.custom_convert_samples_to_train_data_func is not None:
            return self.custom_convert_samples_to_train_data_func(self.args, samples)

        raw_rewards, rewards = self._post_process_rewards(samples)

        assert len(raw_rewards) == len(samples)
        assert len(rewards) == len(samples)

        rollout_ids = [sample.rollout_id for sample in samples]
        existed_rollout_id_values = set(rid for rid in rollout_ids if rid is not None)
        tmp_id = 0
        for i in range(len(rollout_ids)):
            if rollout_ids[i] is None:
                while tmp_id in existed_rollout_id_values:
                    tmp_id += 1
                rollout_ids[i] = tmp_id
                existed_rollout_id_values.add(tmp_id)

        train_data = {
            "tokens": [sample.tokens for sample in samples],
            "response_lengths": [sample.response_length for sample in samples],
            "rewards": rewards,
            "raw_reward": raw_rewards,
            "truncated": [1 if sample.status == Sample.Status.TRUNCATED else 0 for sample in samples],
            "sample_indices": [sample.index for sample in samples],
            "rollout_ids": rollout_ids,
        }

        loss_masks = []
        for sample in samples:
            if sample.loss_mask is None:
                sample.loss_mask = [1] * sample.response_length
            assert (
                len(sample.loss_mask) == sample.response_length
            ), f"loss mask length {len(sample.loss_mask)} != response length {sample.response_length}"
            if sample.remove_sample:
                sample.loss_mask = [0] * sample.response_length
            loss_masks.append(sample.loss_mask)
        train_data["loss_masks"] = loss_masks

        rollout_id_list = train_data["rollout_ids"]
        mask_sums_per_sample = [sum(m) for m in loss_masks]
        rollout_total_mask = {}
        for rid, ms in zip(rollout_id_list, mask_sums_per_sample, strict=True):
            rollout_total_mask[rid] = rollout_total_mask.get(rid, 0) + ms
        train_data["rollout_mask_sums"] = [rollout_total_mask[rid] for rid in rollout_id_list]

        if any(sample.metadata and "raw_reward" in sample.metadata for sample in samples):
            train_data["raw_reward"] = [
                sample.metadata["raw_reward"] if sample.metadata and "raw_reward" in sample.metadata else sample.reward
                for sample in samples
            ]

        if samples[0].rollout_log_probs is not None:
            train_data["rollout_log_probs"] = [sample.rollout_log_probs for sample in samples]

        if getattr(self.args, "rollout_top_p", 1.0) != 1.0:
            # slime replays the nucleus the engine kept for each response
            # token: every sample must carry it, one offset per token + 1.
            for sample in samples:
                ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
                assert ids is not None and offsets is not None
                assert len(offsets) == sample.response_length + 1, f"{len(offsets)} top-p offsets for {sample.response_length} response tokens"
                assert int(offsets[-1]) == len(ids), f"the last top-p offset {int(offsets[-1])} is not the {len(ids)} ids' end"
            train_data["rollout_top_p_token_ids"] = [s.rollout_top_p_token_ids for s in samples]
            train_data["rollout_top_p_token_offsets"] = [s.rollout_top_p_token_offsets for s in samples]
        return train_data

    def _split_train_data_by_dp(self, data):
        """The per-rank partitions (global sample indices) and step sizes
        build_dp_schedule computes; slime packages them into Ray Boxes."""
        total_lengths = [len(t) for t in data["tokens"]]
        data["total_lengths"] = total_lengths
        partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
            self.args,
            self.train_parallel_config,
            total_lengths,
            global_batch_size=self.args.global_batch_size,
            rollout_indices=data["rollout_ids"],
        )
        for r in range(len(partitions)):
            tensorize_rollout_data_for_training({key: [data[key][j] for j in partitions[r]]
                                                 for key in TENSOR_KEYS if key in data})
        return {"partitions": partitions, "micro_batch_indices": micro_batch_indices,
                "num_microbatches": num_microbatches, "global_batch_sizes": global_batch_sizes}

    def generate(self, rollout_id):
        """RolloutManager.generate without logging and Ray: the rollout's
        samples (flattened), their train data and its split."""
        samples, metrics = self._get_rollout_data(rollout_id=rollout_id)
        data = self._convert_samples_to_train_data(samples)
        return samples, metrics, data, self._split_train_data_by_dp(data)


# The per-sample keys tensorize_rollout_data_for_training makes tensors of
# (_ROLLOUT_DATA_TENSOR_DTYPES, less rollout_routed_experts).
TENSOR_KEYS = ("tokens", "loss_masks", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
               "teacher_log_probs")


def tensorize_rollout_data_for_training(rollout_data):
    """What torch.as_tensor(value, dtype=...) asks of each sample's value in
    slime's tensorize_rollout_data_for_training: a flat list of numbers (it
    raises on None, or on a list holding anything else)."""
    for key, values in rollout_data.items():
        for i, value in enumerate(values):
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, (int, float)) for x in value):
                raise TypeError(f"{key}[{i}] = {value!r:.80}: torch.as_tensor needs a flat list of numbers")

"""Stand-in of slime/utils/dp_schedule.py (THUDM/slime
624b824a898ab0ec1fcb4d373004c7f3852bf515): build_dp_schedule's step split
as slime does it, which is what the tests check planact's batches against.

Faithful: samples grouped by rollout id in first-occurrence order,
num_rollouts // global_batch_size steps of global_batch_size rollouts each
(the trailing rollouts left out), the assertion when there are fewer
rollouts than global_batch_size, the per-step dp_size assertion, the static
micro-batch path with its alignment assertion, and the strided round-robin
over ranks. Not reproduced (NotImplementedError): dynamic batch sizes and
FLOPs balancing, which pack with slime.utils.seqlen_balancing."""

from __future__ import annotations

from typing import Any


def _pack_step_into_mbs(step_lengths, *, args, use_dynamic_batch_size, max_per_bin, micro_batch_size, balance_by_flops=False):
    if use_dynamic_batch_size:
        raise NotImplementedError("stand-in: dynamic batch sizes pack with slime.utils.seqlen_balancing, not reproduced here")
    assert micro_batch_size is not None
    n = len(step_lengths)
    return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]


def build_dp_schedule(
    args: Any,
    train_parallel_config: dict,
    total_lengths: list[int],
    *,
    global_batch_size: int,
    rollout_indices: list[int],
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    dp_size = train_parallel_config["dp_size"]
    cp_size = train_parallel_config["cp_size"]
    vpp_size = train_parallel_config["vpp_size"]
    mb_group = train_parallel_config["microbatch_group_size_per_vp_stage"]

    max_per_bin = None
    if args.use_dynamic_batch_size:
        assert args.max_tokens_per_gpu is not None
        max_per_bin = args.max_tokens_per_gpu * cp_size

    align_to = dp_size * (mb_group if vpp_size > 1 else 1)

    rollout_id_to_samples: dict[int, list[int]] = {}
    for sample_pos, rid in enumerate(rollout_indices):
        rollout_id_to_samples.setdefault(rid, []).append(sample_pos)
    rollout_ids = list(rollout_id_to_samples.keys())

    num_steps = len(rollout_ids) // global_batch_size
    assert num_steps >= 1, (
        f"num_rollouts ({len(rollout_ids)}) < global_batch_size ({global_batch_size}); "
        f"need at least one rollout per step."
    )

    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp_size)]
    num_microbatches: list[int] = []
    global_batch_sizes: list[int] = []

    for step_i in range(num_steps):
        step_rollouts = rollout_ids[step_i * global_batch_size : (step_i + 1) * global_batch_size]
        sample_indices = [pos for rid in step_rollouts for pos in rollout_id_to_samples[rid]]
        step_lengths = [total_lengths[i] for i in sample_indices]
        global_batch_sizes.append(global_batch_size)
        assert len(sample_indices) >= dp_size, (
            f"step {step_i}: {len(sample_indices)} samples < dp_size {dp_size}; "
            f"each step needs at least one sample per rank."
        )

        step_mbs = _pack_step_into_mbs(
            step_lengths,
            args=args,
            use_dynamic_batch_size=args.use_dynamic_batch_size,
            max_per_bin=max_per_bin,
            micro_batch_size=getattr(args, "micro_batch_size", None),
            balance_by_flops=args.balance_by_flops,
        )

        target_K = max(((len(step_mbs) + align_to - 1) // align_to) * align_to, align_to)
        if target_K != len(step_mbs):
            raise AssertionError(
                f"static path: num_mbs ({len(step_mbs)}) is not a multiple of "
                f"dp_size * mb_group ({align_to}); got "
                f"step_size={len(sample_indices)}, micro_batch_size={args.micro_batch_size}, "
                f"dp_size={dp_size}, mb_group={mb_group if vpp_size > 1 else 1}. "
                f"Splitting static mbs would break the fixed-size invariant; adjust the config "
                f"so step_size % (dp_size * micro_batch_size * mb_group) == 0."
            )

        K = len(step_mbs)
        num_mbs_per_rank = K // dp_size
        num_microbatches.append(num_mbs_per_rank)

        if args.balance_data:
            raise NotImplementedError("stand-in: balance_data packs with slime.utils.seqlen_balancing, not reproduced here")
        rank_mbs_idx = [list(range(r, K, dp_size)) for r in range(dp_size)]

        for r in range(dp_size):
            for mbs_idx in rank_mbs_idx[r]:
                mbs_locals = step_mbs[mbs_idx]
                local_start = len(partitions[r])
                partitions[r].extend(sample_indices[i] for i in mbs_locals)
                micro_batch_indices[r].append(list(range(local_start, local_start + len(mbs_locals))))

    return partitions, micro_batch_indices, num_microbatches, global_batch_sizes

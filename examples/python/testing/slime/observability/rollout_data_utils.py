"""Stand-in of validate_rollout_id_annotated from
slime/observability/rollout_data_utils.py (THUDM/slime
624b824a898ab0ec1fcb4d373004c7f3852bf515), written from what it checks:
rollout_id is checked only in a compact rollout's list[Sample] (at depth 2
or more, as in list[list[list[Sample]]], with more than one sample), where
every sample must have one and all must share it; slime's usual
list[list[Sample]] is not checked (a Sample without one then gets a
stand-in id in _convert_samples_to_train_data)."""

from slime.utils.types import Sample


def validate_rollout_id_annotated(node, depth=0):
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"rollout output holds a {type(node).__name__}, not a list or a Sample"
    if not node or not isinstance(node[0], Sample):
        for item in node:
            validate_rollout_id_annotated(item, depth + 1)
        return
    if depth < 2 or len(node) < 2:
        return
    ids = [s.rollout_id for s in node]
    unset = [i for i, rid in enumerate(ids) if rid is None]
    assert not unset, f"a compact rollout of {len(node)} samples has no rollout_id at {unset}: set one on every sample"
    assert len(set(ids)) == 1, f"the samples of one compact rollout have different rollout_ids: {ids}"

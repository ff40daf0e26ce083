"""Stand-in of validate_rollout_id_annotated from
slime/observability/rollout_data_utils.py (THUDM/slime
624b824a898ab0ec1fcb4d373004c7f3852bf515), written from its contract as
its caller states it (RolloutManager._get_rollout_data): any list[Sample]
in the rollout function's nested output must have rollout_id set on every
element."""

from slime.utils.types import Sample


def validate_rollout_id_annotated(data):
    if isinstance(data, list):
        for item in data:
            if isinstance(item, Sample):
                assert item.rollout_id is not None, (
                    f"sample (group_index {item.group_index}, index {item.index}) has no rollout_id: a rollout "
                    "function must set the same rollout_id on every sample of one rollout"
                )
            else:
                validate_rollout_id_annotated(item)

"""Records round-trip through their Arrow schema; invalid steps are refused at construction."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from dart_ray.records import (
    SAMPLE_SCHEMA,
    STEP_SCHEMA,
    Action,
    ActionKind,
    Status,
    Step,
    trajectory_from_table,
    trajectory_to_table,
)
from tests.factories import make_step, make_trajectory


def test_trajectory_round_trips_through_arrow() -> None:
    t = make_trajectory("t1", n_steps=3, reward=0.5, version=7, group_id="task-0#3", group_size=8)
    table = trajectory_to_table(t)
    assert table.schema.equals(STEP_SCHEMA)  # metadata aside, the schema is the one defined
    assert table.num_rows == 3
    # Everything in the factory is exactly representable in float32, so equality is exact.
    assert trajectory_from_table(table) == t


def test_every_action_kind_round_trips() -> None:
    actions = [
        Action(ActionKind.DRAG, point=(1.5, 2.0), end_point=(30.0, 40.0)),
        Action(ActionKind.TYPE, text="hello\n'quoted' \"x\""),
        Action(ActionKind.SCROLL, point=(5.0, 5.0), direction="down"),
        Action(ActionKind.HOTKEY, text="ctrl c"),
        Action(ActionKind.INVALID, error="no Action: line"),
        Action(ActionKind.FINISHED, text="done"),
    ]
    base = make_trajectory("t", n_steps=len(actions))
    steps = tuple(
        Step(
            step_idx=s.step_idx,
            prompt_ids=s.prompt_ids,
            response_ids=s.response_ids,
            behaviour_logprobs=s.behaviour_logprobs,
            entropy=s.entropy,
            weight_version=s.weight_version,
            response_text=s.response_text,
            action=a,
            screenshot=s.screenshot,
        )
        for s, a in zip(base.steps, actions, strict=True)
    )
    t = replace(base, steps=steps)
    back = trajectory_from_table(trajectory_to_table(t))
    assert [s.action for s in back.steps] == actions


def test_trajectory_without_steps_round_trips() -> None:
    t = make_trajectory("env-died", n_steps=0, status=Status.ENV_ERROR).with_status(
        Status.ENV_ERROR, error="reset failed 3 times: browser crashed"
    )
    back = trajectory_from_table(trajectory_to_table(t))
    assert back == t
    assert back.min_version == -1 and back.num_steps == 0


def test_min_and_max_version() -> None:
    t = make_trajectory("t", n_steps=0)
    t = replace(t, steps=(make_step(0, 3), make_step(1, 5)))
    assert (t.min_version, t.max_version) == (3, 5)


def test_status_trainable() -> None:
    assert {s for s in Status if s.trainable} == {Status.OK, Status.TRUNCATED}


def test_step_refuses_mismatched_logprobs() -> None:
    with pytest.raises(ValueError, match="2 log-probs for 3 response tokens"):
        Step(0, (1,), (1, 2, 3), (-1.0, -2.0), 0, "", Action(ActionKind.WAIT))
    with pytest.raises(ValueError, match="1 entropies for 2 response tokens"):
        Step(0, (1,), (1, 2), (-1.0, -2.0), 0, "", Action(ActionKind.WAIT), entropy=(0.1,))


def test_foreign_table_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="not a dart-ray trajectory table"):
        trajectory_from_table(pa.table({"x": [1]}))


def test_sample_schema_carries_what_the_trainer_needs() -> None:
    assert {
        "prompt_ids",
        "response_ids",
        "behaviour_logprobs",
        "advantage",
        "weight_version",
        "loss_mask",
    } <= set(SAMPLE_SCHEMA.names)
    assert SAMPLE_SCHEMA.field("prompt_ids").type == pa.list_(pa.int32())


def test_packed_tasks_round_trip_and_travel_inline() -> None:
    """The shipped suites reach a rollouter inline (kept with its creation spec, so a restart
    gets them back; a pickled list of the 1,000 click-target tasks is 274 KB, over Ray's
    100 KB inline limit, and Ray printed an E line for it: ray#53727)."""
    from dart_ray.envs.minidesk.generate import load_tasks
    from dart_ray.records import PackedTasks

    for split in ("train", "heldout"):
        tasks = load_tasks(split=split)
        packed = PackedTasks.of(tasks)
        assert packed.unpack() == tasks and packed.inline, (split, len(packed.blob))

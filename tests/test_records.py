"""Records round-trip through their Arrow schema; invalid steps are refused at construction."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from dart_ray.arrays import ArraySeq
from dart_ray.data.batches import to_record_batch, token_lags
from dart_ray.data.curation import StepSample
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


def test_a_step_spanning_two_versions_round_trips_and_an_older_blob_still_reads() -> None:
    """Partial rollouts: a step's tokens carry their versions through the blob; a blob
    written before the column existed reads as one version per step."""
    t = make_trajectory("t1", n_steps=2, version=3)
    mixed = replace(t.steps[1], token_versions=(3, 4, 4))
    t = replace(t, steps=(t.steps[0], mixed))
    table = trajectory_to_table(t)
    back = trajectory_from_table(table)
    assert back == t and back.steps[1].token_versions == (3, 4, 4)
    assert back.min_version == 3
    older = table.drop_columns(["token_versions"])
    assert [s.token_versions for s in trajectory_from_table(older).steps] == [(), ()]
    with pytest.raises(ValueError, match="token versions for 3 response tokens"):
        replace(t.steps[0], token_versions=(3, 4))


def test_token_lags_count_each_token_by_its_own_version() -> None:
    """Trainer at version 5: a row of version 4 (3 tokens, lag 1), a row of version 2 whose
    last two tokens came from version 4 after an update landed (lags 3, 1, 1), a row of 5."""
    samples = [
        StepSample("a", "t", 0, 4, (1,), (7, 8, 9), (-1.0,) * 3, 0.5, ()),
        StepSample("b", "t", 0, 2, (1,), (7, 8, 9), (-1.0,) * 3, 0.5, (), token_versions=(2, 4, 4)),
        StepSample("c", "t", 0, 5, (1,), (7,), (-1.0,), 0.5, ()),
    ]
    batch = to_record_batch(samples)
    assert batch.column("token_versions").to_pylist() == [[], [2, 4, 4], []]
    assert token_lags(batch, 5) == {0: 1, 1: 5, 3: 1}
    assert token_lags(batch.slice(1, 1), 5) == {1: 2, 3: 1}
    assert token_lags(batch.slice(0, 0), 5) == {}


def test_a_read_back_step_holds_views_of_the_blob_and_equals_the_written_one() -> None:
    """Token lists are read as views of the table's buffers (no Python object per token),
    and the step still equals, hashes and pickles as the one built from tuples."""
    t = make_trajectory("t1", n_steps=2, version=3)
    t = replace(t, steps=(t.steps[0], replace(t.steps[1], token_versions=(3, 4, 4))))
    table = trajectory_to_table(t)
    back = trajectory_from_table(table)
    s = back.steps[1]
    assert isinstance(s.prompt_ids, ArraySeq) and isinstance(s.behaviour_logprobs, ArraySeq)
    # step 1's prompt follows step 0's 10 ids (40 bytes of int32) in the column's values
    prompts = table.column("prompt_ids").chunk(0).values.buffers()[1]
    assert np.asarray(s.prompt_ids).ctypes.data == prompts.address + 40
    assert hash(s) == hash(t.steps[1]) and set(back.steps) == set(t.steps)
    assert pickle.loads(pickle.dumps(back)) == t
    assert trajectory_to_table(back).equals(table)  # written again: the same table

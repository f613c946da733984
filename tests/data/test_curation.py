"""Curation of one group, grouping, and token-balanced packing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dart_ray.data.batches import batch_tokens, pack, shard_by_tokens, to_record_batch
from dart_ray.data.curation import CurationParams, StepSample, curate_group, split_steps
from dart_ray.data.grouping import GroupBuffer
from dart_ray.records import (
    SAMPLE_SCHEMA,
    Status,
    Trajectory,
    trajectory_from_table,
    trajectory_to_table,
)
from dart_ray.store.log import LogRow
from tests.factories import make_step, make_trajectory


def row_for(t: Trajectory, rid: int) -> LogRow:
    return LogRow(
        id=rid,
        run_id=t.run_id,
        trajectory_id=t.trajectory_id,
        task_id=t.task.task_id,
        trace_id=t.trace_id,
        group_id=t.group_id,
        group_size=t.group_size,
        uri=f"/b/{t.trajectory_id}",
        reward=t.reward,
        num_steps=t.num_steps,
        status=t.status,
        version_num=t.min_version,
        model_version="v0",
        instruction=t.task.instruction,
    )


def group(*rewards: float, n_steps: int = 2) -> list[tuple[LogRow, Trajectory]]:
    ts = [make_trajectory(f"t{i}", reward=r, n_steps=n_steps) for i, r in enumerate(rewards)]
    return [(row_for(t, i + 1), t) for i, t in enumerate(ts)]


def test_samples_carry_their_trajectory_advantage() -> None:
    out = curate_group(group(1.0, 0.0, 0.0, 0.0), CurationParams())
    # rewards [1,0,0,0] -> advantages [1.5, -0.5, -0.5, -0.5] (see test_advantages)
    assert out.trained_rows == [1, 2, 3, 4] and out.dropped == {}
    assert len(out.samples) == 8  # 4 trajectories x 2 steps
    by_traj = {s.trajectory_id: s.advantage for s in out.samples}
    assert by_traj == pytest.approx({"t0": 1.5, "t1": -0.5, "t2": -0.5, "t3": -0.5}, abs=1e-5)


def test_env_error_drops_the_whole_group() -> None:
    members = group(1.0, 0.0)
    bad = make_trajectory("t9", status=Status.ENV_ERROR, n_steps=0)
    members.append((row_for(bad, 9), bad))
    out = curate_group(members, CurationParams())
    assert out.samples == [] and out.dropped == {
        1: "group_env_error",
        2: "group_env_error",
        9: "group_env_error",
    }


def test_aborted_and_policy_errors_drop_alone() -> None:
    members = group(1.0, 0.0)
    ab = make_trajectory("ab", status=Status.ABORTED, n_steps=1)
    pe = make_trajectory("pe", status=Status.POLICY_ERROR, n_steps=1)
    members += [(row_for(ab, 7), ab), (row_for(pe, 8), pe)]
    out = curate_group(members, CurationParams())
    assert out.trained_rows == [1, 2]
    assert out.dropped == {7: "aborted", 8: "policy_error"}


def test_replay_fills_an_all_fail_group() -> None:
    winner = make_trajectory("old-win", reward=1.0, n_steps=3, version=1)
    out = curate_group(group(0.0, 0.0, 0.0), CurationParams(), replay=winner)
    # the oldest member (row 1) makes room; rewards become [1, 0, 0]:
    # mean 1/3, unbiased std sqrt(1/3) = 0.57735 -> A = [1.1547, -0.57735, -0.57735]
    assert out.replayed == "old-win" and out.dropped == {1: "replaced_by_replay"}
    assert out.trained_rows == [2, 3]
    win = [s for s in out.samples if s.trajectory_id == "old-win"]
    assert len(win) == 3 and win[0].advantage == pytest.approx(1.1547, abs=1e-4)
    assert {s.weight_version for s in win} == {1}  # its own behaviour policy, for IS weights


def test_a_replay_never_takes_the_place_of_a_groups_only_sample() -> None:
    """A group with one trainable member (the others aborted) is not replayed into: the
    replay would take its place, and the step would train only on another version's sample,
    with nothing of this group to compare it with (one member: advantage 0 either way)."""
    winner = make_trajectory("old-win", reward=1.0, n_steps=3, version=1)
    members = group(0.0)
    ab = make_trajectory("ab", status=Status.ABORTED, n_steps=1)
    members.append((row_for(ab, 7), ab))
    out = curate_group(members, CurationParams(drop_no_signal=False), replay=winner)
    assert out.replayed is None and out.trained_rows == [1]
    assert {s.trajectory_id for s in out.samples} == {"t0"}


def test_no_signal_groups_are_dropped_with_the_reason() -> None:
    out = curate_group(group(0.0, 0.0), CurationParams(success_replay=False))
    assert out.samples == [] and out.dropped == {1: "no_signal", 2: "no_signal"}
    out = curate_group(group(1.0, 1.0), CurationParams())
    assert out.dropped == {1: "no_signal", 2: "no_signal"}


def test_entropy_selection_keeps_the_top_steps() -> None:
    members = group(1.0, 0.0, n_steps=2)
    # give each of the 4 steps a distinct entropy: t0 steps 0.1, 0.9 ; t1 steps 0.5, 0.7
    ents = {("t0", 0): 0.1, ("t0", 1): 0.9, ("t1", 0): 0.5, ("t1", 1): 0.7}
    new = []
    for r, t in members:
        steps = tuple(
            replace(s, entropy=(ents[(t.trajectory_id, s.step_idx)],) * len(s.response_ids))
            for s in t.steps
        )
        new.append((r, replace(t, steps=steps)))
    out = curate_group(new, CurationParams(entropy_top_fraction=0.5))
    assert {(s.trajectory_id, s.step_idx) for s in out.samples} == {("t0", 1), ("t1", 1)}
    assert out.trained_rows == [1, 2]


def test_split_steps_takes_the_prompt_images() -> None:
    t = make_trajectory("t", n_steps=3)
    t = replace(t, steps=tuple(replace(s, num_images=2) for s in t.steps))
    samples = split_steps(t, 0.5)
    assert [len(s.images) for s in samples] == [1, 2, 2]
    assert samples[2].images == (t.steps[1].screenshot, t.steps[2].screenshot)


def test_group_buffer_completes_by_group_id_and_times_out() -> None:
    buf = GroupBuffer(default_size=8, min_group=2, timeout_s=10)
    g = [make_trajectory(f"g{i}", group_id="task-0#1", group_size=3) for i in range(3)]
    aborted = make_trajectory("g-ab", group_id="task-0#1", group_size=3, status=Status.ABORTED)
    buf.add(row_for(g[0], 1), now=0)
    buf.add(row_for(aborted, 2), now=1)
    buf.add(row_for(g[1], 3), now=2)
    assert buf.pop_ready(now=3) == []  # 2 of 3 final slots; the aborted retry does not count
    buf.add(row_for(g[2], 4), now=4)
    [ready] = buf.pop_ready(now=4)
    assert [r.id for r in ready] == [1, 2, 3, 4]
    # no group id: grouped by task with the default size, released partial after the timeout
    loose = [make_trajectory(f"l{i}", task_id="task-9") for i in range(2)]
    buf.add(row_for(loose[0], 5), now=5)
    buf.add(row_for(loose[1], 6), now=6)
    assert buf.pop_ready(now=14) == []
    assert [r.id for r in buf.pop_ready(now=15)[0]] == [5, 6]
    assert len(buf) == 0


def _sample(n_prompt: int, n_resp: int, tid: str = "t") -> StepSample:
    return StepSample(
        tid,
        "task",
        0,
        0,
        tuple(range(n_prompt)),
        tuple(range(n_resp)),
        (-1.0,) * n_resp,
        0.5,
        (b"png",),
    )


def test_shards_are_token_balanced() -> None:
    # token counts 10, 9, 8, 7, 6, 5 over 2 ranks, LPT: 10->A, 9->B, 8->B(9), 7->A(10),
    # 6->A?(A=17,B=17: tie -> rank 0), 5->B -> A = 10+7+6 = 23, B = 9+8+5 = 22
    samples = [_sample(n - 2, 2, f"t{n}") for n in (10, 9, 8, 7, 6, 5)]
    shards = shard_by_tokens(samples, 2)
    assert sorted(sum(s.num_tokens for s in sh) for sh in shards) == [22, 23]
    assert sorted(s.trajectory_id for sh in shards for s in sh) == sorted(
        s.trajectory_id for s in samples
    )


def test_pack_gives_one_batch_per_rank_even_when_short() -> None:
    batches = pack([_sample(4, 2)], 3)
    assert len(batches) == 3 and [b.num_rows for b in batches].count(1) == 1
    assert all(b.schema.equals(SAMPLE_SCHEMA) for b in batches)
    full = next(b for b in batches if b.num_rows)
    assert batch_tokens(full) == 6
    assert full.column("loss_mask").to_pylist() == [[1, 1]]
    assert full.column("images").to_pylist() == [[b"png"]]


def test_factory_steps_are_float32_exact() -> None:
    s = make_step(0)
    assert list(s.behaviour_logprobs) == [-0.5, -1.0, -1.5]


def test_a_sample_keeps_the_version_of_each_of_its_tokens() -> None:
    t = make_trajectory("t", n_steps=2, version=3)
    t = replace(t, steps=(t.steps[0], replace(t.steps[1], token_versions=(3, 3, 4))))
    a, b = split_steps(t, 1.0)
    assert a.token_versions == () and b.token_versions == (3, 3, 4)
    assert sorted(pack([a, b], 1)[0].column("token_versions").to_pylist()) == [[], [3, 3, 4]]


def test_samples_read_back_from_blobs_pack_as_the_written_ones() -> None:
    """The curator packs samples whose token lists are views of the blobs' buffers: the batch
    is the one the same samples give as tuples, each with its window of 2 screenshots."""
    ts = [
        replace(t, steps=tuple(replace(s, num_images=2) for s in t.steps))
        for t in (make_trajectory("a", n_steps=3), make_trajectory("b", n_steps=1))
    ]
    back = [trajectory_from_table(trajectory_to_table(t)) for t in ts]
    read = [s for t in back for s in split_steps(t, 0.5)]
    batch = to_record_batch(read)
    assert batch.equals(to_record_batch([s for t in ts for s in split_steps(t, 0.5)]))
    a, b = ([s.screenshot for s in t.steps] for t in ts)
    assert batch.column("images").to_pylist() == [[a[0]], [a[0], a[1]], [a[1], a[2]], [b[0]]]
    assert batch.column("prompt_ids").to_pylist()[2] == list(range(12))  # make_step(2)
    assert batch.column("behaviour_logprobs").to_pylist()[3] == [-0.5, -1.0, -1.5]
    assert batch.column("loss_mask").to_pylist() == [[1, 1, 1]] * 4
    assert batch.column("token_versions").to_pylist() == [[]] * 4


# --------------------------------------------------------------------------- step-level credit


def on_screens(tid: str, reward: float, screens: str, version: int = 0) -> Trajectory:
    """A trajectory whose step i acted on screen screens[i] (one letter per screen: the
    same letter is the same PNG bytes, as a reproducible environment renders a repeated
    state)."""
    t = make_trajectory(tid, reward=reward, n_steps=len(screens), version=version)
    steps = tuple(
        replace(s, screenshot=b"\x89PNG screen " + c.encode())
        for s, c in zip(t.steps, screens, strict=True)
    )
    return replace(t, steps=steps)


STEP = CurationParams(credit="step", step_gamma=0.9, step_weight=1.0, step_norm="mean")


def test_step_credit_rewards_the_choice_made_at_a_shared_state() -> None:
    """Both rollouts start on screen s. The success clicks the right thing there (s -> a ->
    done, R = 1); the failure does not (s -> b -> c -> done, R = 0).

    trajectory credit: A^E = [+0.7071, -0.7071] on every step (rewards [1, 0])
    step credit, gamma 0.9: returns success [0.9, 1.0], failure [0, 0, 0]; screen s holds
    {0.9, 0}, mean 0.45 -> the success's first step +0.45, the failure's -0.45; screens a,
    b, c are seen once -> 0. So the step at s gets 0.7071 + 0.45 = 1.1571 (and the failure's
    -1.1571), and the steps after the paths parted keep exactly their trajectory's advantage.
    """
    h = 0.5**0.5
    members = [
        (row_for(t, i + 1), t)
        for i, t in enumerate([on_screens("win", 1.0, "sa"), on_screens("lose", 0.0, "sbc")])
    ]
    traj = curate_group(members, CurationParams())
    assert [(s.trajectory_id, s.step_idx, s.advantage) for s in traj.samples] == [
        ("win", 0, pytest.approx(h, abs=1e-5)),
        ("win", 1, pytest.approx(h, abs=1e-5)),
        ("lose", 0, pytest.approx(-h, abs=1e-5)),
        ("lose", 1, pytest.approx(-h, abs=1e-5)),
        ("lose", 2, pytest.approx(-h, abs=1e-5)),
    ]
    step = curate_group(members, STEP)
    assert [s.advantage for s in step.samples] == pytest.approx(
        [h + 0.45, h, -h - 0.45, -h, -h], abs=1e-5
    )
    assert step.trained_rows == traj.trained_rows == [1, 2] and step.dropped == {}
    # the step that mattered gets more credit than the trajectory level gives it
    assert step.samples[0].advantage > traj.samples[0].advantage
    assert step.samples[2].advantage < traj.samples[2].advantage


def test_trajectory_credit_ignores_the_screens() -> None:
    # the default is trajectory credit, and the step knobs do nothing without credit="step"
    members = [
        (row_for(t, i + 1), t)
        for i, t in enumerate([on_screens("win", 1.0, "sa"), on_screens("lose", 0.0, "sbc")])
    ]
    a = curate_group(members, CurationParams())
    b = curate_group(members, CurationParams(step_gamma=0.5, step_weight=3.0, step_norm="std"))
    assert [s.advantage for s in a.samples] == [s.advantage for s in b.samples]
    assert len({s.advantage for s in a.samples if s.trajectory_id == "win"}) == 1


def test_a_replayed_success_shares_its_states_with_the_members() -> None:
    """An all-fail group of three on screens s -> b; a success replayed from an older
    version (s -> a -> done, R = 1) takes the oldest member's place.

    rewards [1, 0, 0] -> A^E = [1.1547, -0.5774, -0.5774] (test_replay_fills_an_all_fail_group)
    returns: replay [0.9, 1.0], members [0, 0] each; screen s holds {0.9, 0, 0}, mean 0.3
    -> the replay's step at s +0.6, the members' -0.3; a and b: b holds {0, 0} -> 0, a alone.
    """
    winner = on_screens("old-win", 1.0, "sa", version=1)
    members = [
        (row_for(t, i + 1), t)
        for i, t in enumerate(on_screens(f"t{i}", 0.0, "sb") for i in range(3))
    ]
    out = curate_group(members, STEP, replay=winner)
    assert out.replayed == "old-win" and out.dropped == {1: "replaced_by_replay"}
    got = {(s.trajectory_id, s.step_idx): s.advantage for s in out.samples}
    e1, e0 = 2 / 3**0.5, -1 / 3**0.5
    assert got == pytest.approx(
        {
            ("old-win", 0): e1 + 0.6,
            ("old-win", 1): e1,
            ("t1", 0): e0 - 0.3,
            ("t1", 1): e0,
            ("t2", 0): e0 - 0.3,
            ("t2", 1): e0,
        },
        abs=1e-5,
    )


def test_step_credit_still_drops_groups_of_equal_rewards() -> None:
    # two successes of different lengths through screen s: returns at s are 0.9 and 0.81, a
    # length preference only; the group is dropped as in trajectory credit
    members = [
        (row_for(t, i + 1), t)
        for i, t in enumerate([on_screens("a", 1.0, "sa"), on_screens("b", 1.0, "sba")])
    ]
    out = curate_group(members, STEP)
    assert out.samples == [] and out.dropped == {1: "no_signal", 2: "no_signal"}
    kept = curate_group(members, replace(STEP, drop_no_signal=False))
    # kept anyway: the step term alone, s holds {0.9, 0.81}: mean 0.855 -> +0.045, -0.045
    assert [s.advantage for s in kept.samples] == pytest.approx(
        [0.045, 0.0, -0.045, 0.0, 0.0], abs=1e-5
    )


def test_steps_without_a_screenshot_are_never_grouped() -> None:
    members = group(1.0, 0.0)  # steps at the same index share a factory screenshot
    blank = [
        (r, replace(t, steps=tuple(replace(s, screenshot=b"") for s in t.steps)))
        for r, t in members
    ]
    shared = curate_group(members, STEP)
    assert shared.samples[0].advantage != shared.samples[1].advantage
    out = curate_group(blank, STEP)
    h = 0.5**0.5
    assert [s.advantage for s in out.samples] == pytest.approx([h, h, -h, -h], abs=1e-5)


def test_entropy_selection_keeps_the_advantages_of_the_whole_group() -> None:
    # the anchor statistics are over every step; selection only chooses which steps train
    members = [
        (row_for(t, i + 1), t)
        for i, t in enumerate([on_screens("win", 1.0, "sa"), on_screens("lose", 0.0, "sbc")])
    ]
    full = {(s.trajectory_id, s.step_idx): s.advantage for s in curate_group(members, STEP).samples}
    some = curate_group(members, replace(STEP, entropy_top_fraction=0.5))
    assert 0 < len(some.samples) < len(full)
    assert all(s.advantage == full[(s.trajectory_id, s.step_idx)] for s in some.samples)


def test_split_steps_takes_one_advantage_per_step() -> None:
    t = make_trajectory("t", n_steps=3)
    assert [s.advantage for s in split_steps(t, [0.5, -1.0, 2.0])] == [0.5, -1.0, 2.0]
    with pytest.raises(ValueError, match="2 advantages for the 3 steps"):
        split_steps(t, [0.5, 1.0])


def test_rft_keeps_only_the_successes_with_advantage_one_and_never_replays() -> None:
    rft = CurationParams(objective="rft")
    winner = make_trajectory("w", reward=1.0, n_steps=1)
    out = curate_group(group(1.0, 0.0, 1.0, 0.0), rft, replay=winner)
    # rows 1 and 3 succeeded: their 2 + 2 steps train with advantage 1, the others are dropped
    assert out.trained_rows == [1, 3]
    assert out.dropped == {2: "rft_failure", 4: "rft_failure"}
    assert [(s.trajectory_id, s.advantage) for s in out.samples] == [
        ("t0", 1.0),
        ("t0", 1.0),
        ("t2", 1.0),
        ("t2", 1.0),
    ]
    assert out.replayed is None
    # an all-success group trains whole (GRPO would drop it as no_signal) ...
    assert curate_group(group(1.0, 1.0), rft).trained_rows == [1, 2]
    # ... and an all-fail group trains nothing, even with a success to replay
    none = curate_group(group(0.0, 0.0), rft, replay=winner)
    assert none.samples == [] and none.dropped == {1: "no_success", 2: "no_success"}

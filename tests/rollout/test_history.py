"""Back-off's history from the durable log (SQLite and MariaDB): a task's streak of groups
without signal, over the task alone or over its family."""

from __future__ import annotations

from dart_ray.algo.curriculum import Backoff
from dart_ray.config import load_config
from dart_ray.records import Task
from dart_ray.rollout.history import LogHistory
from dart_ray.rollout.scheduler import Scheduler
from dart_ray.store.log import DurableLog
from tests.factories import make_trajectory

# three type-field tasks (family from the config), one menu task (family from its id)
TASKS = [Task(f"tf-{i}", f"type w{i}", "minidesk", {"family": "type-field"}) for i in range(3)] + [
    Task("menu-command-7", "open the menu", "minidesk", {})
]


def group(log: DurableLog, task: str, gid: str, rewards: list[float], version: int = 0) -> None:
    log.append_many(
        [
            (
                make_trajectory(
                    f"{gid}-{i}",
                    task_id=task,
                    reward=r,
                    group_id=gid,
                    group_size=len(rewards),
                    version=version,
                ),
                f"/{gid}/{i}",
            )
            for i, r in enumerate(rewards)
        ]
    )


def histories(log: DurableLog, scope: str, replay: bool = True) -> LogHistory:
    cfg = load_config(
        overrides=[
            "rollout.backoff=true",
            f"rollout.backoff_scope={scope}",
            "rollout.n_rollouts=2",
            f"curation.success_replay={str(replay).lower()}",
        ]
    )
    return LogHistory(log, "run-a", cfg, TASKS, Backoff(after=3, max_skips=8))


def test_a_family_streak_counts_the_groups_of_all_its_tasks(log: DurableLog) -> None:
    group(log, "menu-command-7", "m0", [1.0, 0.0])  # signal: menu is not backed off
    for i in range(3):  # one all-fail group of each type-field task
        group(log, f"tf-{i}", f"g{i}", [0.0, 0.0])
    by_task, by_family = histories(log, "task"), histories(log, "family")
    # alone, each task has one group without signal: it would come round twice more first
    assert [by_task(f"tf-{i}", version=0).no_signal_streak for i in range(3)] == [1, 1, 1]
    # its family has three, whichever task is visited
    assert [by_family(f"tf-{i}", version=0).no_signal_streak for i in range(3)] == [3, 3, 3]
    assert by_family("menu-command-7", version=0).no_signal_streak == 0
    # skips are counted by family, so skipping one type-field task counts for all three
    assert by_family.key(TASKS[0]) == by_family.key(TASKS[2]) == "type-field"
    assert by_family.key(TASKS[3]) == "menu-command"
    assert by_task.key(TASKS[2]) == "tf-2"
    # the budget's inputs stay the task's own
    assert by_family("tf-0", version=0).recent_success == 0.0
    assert by_family("menu-command-7", version=0).recent_success == 0.5


def test_a_group_with_signal_in_the_family_ends_its_streak(log: DurableLog) -> None:
    for i in range(3):
        group(log, f"tf-{i}", f"g{i}", [0.0, 0.0])
    group(log, "tf-1", "g3", [1.0, 0.0])  # newest: signal
    assert histories(log, "family")("tf-0", version=0).no_signal_streak == 0


def test_a_task_with_a_fresh_success_to_replay_is_not_backed_off(log: DurableLog) -> None:
    group(log, "tf-0", "g0", [1.0, 1.0], version=5)  # tf-0 succeeded at version 5
    for i in range(3):
        group(log, f"tf-{i}", f"g{i + 1}", [0.0, 0.0], version=6)
    h = histories(log, "family")
    # tf-0's all-fail group would get its success replayed: it trains, so it counts as signal
    assert h("tf-0", version=6).no_signal_streak == 0
    # tf-1 has nothing to replay: the family's three all-fail groups count
    assert h("tf-1", version=6).no_signal_streak == 3
    # without replay, tf-0 is backed off with its family
    assert histories(log, "family", replay=False)("tf-0", version=6).no_signal_streak == 3


def test_the_scheduler_skips_a_backed_off_family_as_one(log: DurableLog) -> None:
    for r in range(2):  # six all-fail groups of type-field: streak 6 -> 8 skips owed
        for i in range(3):
            group(log, f"tf-{i}", f"g{r}{i}", [0.0, 0.0])
    group(log, "menu-command-7", "m0", [1.0, 0.0])
    h = histories(log, "family")
    s = Scheduler(
        TASKS,
        n_rollouts=2,
        max_steps=5,
        history=lambda t: h(t, version=0),
        backoff=h.backoff,
        backoff_key=h.key,
    )
    got = [s.open_group()[0].task.task_id for _ in range(2)]
    # the family owes 8 skips, more than two epochs visit its tasks (at most 6): menu only
    assert got == ["menu-command-7"] * 2
    assert list(s._skipped) == ["type-field"]
    assert s._skipped["type-field"] == s.visits_skipped >= 3
    # by task, each type-field task has a streak of 2 (< after): nothing is skipped
    t = histories(log, "task")
    s2 = Scheduler(
        TASKS,
        n_rollouts=2,
        max_steps=5,
        history=lambda x: t(x, version=0),
        backoff=t.backoff,
        backoff_key=t.key,
    )
    assert len({s2.open_group()[0].task.task_id for _ in range(4)}) == 4
    assert s2.visits_skipped == 0

"""The scheduler's back-off over a fake history (no Ray, no log)."""

from __future__ import annotations

from dart_ray.algo.curriculum import Backoff
from dart_ray.records import Task
from dart_ray.rollout.scheduler import Scheduler, TaskHistory


def tasks(*ids: str) -> list[Task]:
    return [Task(i, f"do {i}", "minidesk", {}) for i in ids]


def opened(s: Scheduler, n: int) -> list[str]:
    return [s.open_group()[0].task.task_id for _ in range(n)]


def test_without_backoff_every_task_runs_once_per_epoch() -> None:
    streak = {"a": 9, "b": 0, "c": 0}
    s = Scheduler(
        tasks("a", "b", "c"),
        n_rollouts=4,
        max_steps=5,
        history=lambda t: TaskHistory(None, no_signal_streak=streak[t]),
    )
    got = opened(s, 6)
    assert sorted(got[:3]) == sorted(got[3:]) == ["a", "b", "c"]
    assert s.visits_skipped == 0


def test_a_backed_off_task_is_skipped_then_retried() -> None:
    # "a" has 3 groups without signal: after=3 -> skip 1 visit, then a retry group
    streak = {"a": 3, "b": 0, "c": 0}
    reads: list[str] = []

    def history(t: str) -> TaskHistory:
        reads.append(t)
        return TaskHistory(None, no_signal_streak=streak[t])

    s = Scheduler(
        tasks("a", "b", "c"),
        n_rollouts=4,
        max_steps=5,
        history=history,
        backoff=Backoff(after=3, max_skips=8),
    )
    got = opened(s, 8)
    # a's visits alternate: skipped, retried, skipped, retried; b and c run at every visit
    assert got.count("a") == 2 and got.count("b") == 3 and got.count("c") == 3
    assert s.visits_skipped == 2
    # each visit reads the history once, skipped or not (the budget reuses that read)
    assert len(reads) == 8 + 2


def test_skips_follow_the_streak_and_a_signal_group_resets() -> None:
    streak = {"a": 5, "b": 0}  # after=3: streak 5 -> 4 skips before each retry
    visits: list[str] = []

    def history(t: str) -> TaskHistory:
        visits.append(t)
        return TaskHistory(None, no_signal_streak=streak[t])

    s = Scheduler(
        tasks("a", "b"),
        n_rollouts=2,
        max_steps=5,
        history=history,
        backoff=Backoff(after=3, max_skips=8),
        seed=1,
    )
    got: list[str] = []
    while got.count("a") < 2:
        got += opened(s, 1)
    # a ran at its 5th and its 10th visit; b ran at every one of its visits
    assert visits.count("a") == 10
    assert got.count("b") == visits.count("b")
    assert s.visits_skipped == 8
    # a group with signal: streak 0, so a runs at every visit from now on
    streak["a"] = 0
    before = visits.count("a")
    got = opened(s, 6)
    assert got.count("a") == visits.count("a") - before >= 2


def test_never_skips_every_task() -> None:
    # both backed off: a owes 4 skips (streak 5), b owes 1 (streak 3): b runs, its back-off
    # ends soonest; the run never idles
    streak = {"a": 5, "b": 3}
    s = Scheduler(
        tasks("a", "b"),
        n_rollouts=2,
        max_steps=5,
        history=lambda t: TaskHistory(None, no_signal_streak=streak[t]),
        backoff=Backoff(after=3, max_skips=8),
    )
    # first search: a (owes 4, skipped: 3 left), b (owes 1, skipped: 0 left) -> b
    assert opened(s, 1) == ["b"]
    assert s._skipped == {"a": 1}
    # a single task is never skipped
    one = Scheduler(
        tasks("only"),
        n_rollouts=2,
        max_steps=5,
        history=lambda t: TaskHistory(None, no_signal_streak=50),
        backoff=Backoff(),
    )
    assert opened(one, 3) == ["only"] * 3
    assert one.visits_skipped == 0


def test_the_search_is_bounded_by_the_lookahead() -> None:
    reads: list[str] = []

    def history(t: str) -> TaskHistory:
        reads.append(t)
        return TaskHistory(None, no_signal_streak=10)  # all backed off, 8 skips owed each

    s = Scheduler(
        tasks(*[f"t{i}" for i in range(100)]),
        n_rollouts=2,
        max_steps=5,
        history=history,
        backoff=Backoff(after=3, max_skips=8, lookahead=5),
    )
    first = opened(s, 1)
    # five histories read, the first of them opened (all owe the same)
    assert len(reads) == 5 and first == [reads[0]]
    assert s.visits_skipped == 4


def test_backoff_and_budget_share_one_history_read() -> None:
    n_reads = 0

    def history(t: str) -> TaskHistory:
        nonlocal n_reads
        n_reads += 1
        return TaskHistory(1.0, longest_success=2, no_signal_streak=0)

    s = Scheduler(tasks("a"), n_rollouts=8, max_steps=10, history=history, backoff=Backoff())
    slots = s.open_group()
    # a solved task: the dart budget's 2 rollouts, step limit ceil(1.5 * 2) + 2 = 5
    assert len(slots) == 2 and slots[0].max_steps == 5
    assert n_reads == 1

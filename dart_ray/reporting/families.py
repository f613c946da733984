"""Rollouts spent per trained row, by task family: where a run's environment time went.

A GRPO group whose rewards are all equal is dropped (`no_signal`), so a family the policy
never solves (or always solves) can eat rollouts that train nothing. This table, computed from
the durable log, shows it per family: rollouts logged, rows trained, rows dropped as
`no_signal`, and rollouts per trained row.

The family of a task is `task.config["family"]` where the caller knows the tasks (the run
does; MiniDesk and OSWorld task files set it). From the log alone (`dart-ray report` on any
run) it comes from the task id, by `task_family`:

- an id with '/' parts: the last part that is not an index (digits, or one letter and
  digits). MiniDesk ids are `minidesk/<family>/t<tier>/<seed>` and MiniWoB++ ids
  `miniwob/<page>/<seed>`, so this is the family the config names, or the page
  (`miniwob/click-test-2/7` -> `click-test-2`);
- otherwise the part before the first '-' that a digit follows (`type-field-12` ->
  `type-field`), when there is one;
- otherwise the whole id (a task is its own family: OSWorld's UUIDs, say, whose domain only
  the task file knows).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from dart_ray.records import Task

_DASH_DIGIT = re.compile(r"-\d")
_INDEX = re.compile(r"[A-Za-z]?\d+")
"""A part of a task id that numbers rather than names: a seed (`17`), a tier (`t2`)."""


def task_family(task_id: str) -> str:
    """The family of a task from its id alone (see the module docstring)."""
    if "/" in task_id:
        named = [p for p in task_id.split("/") if p and not _INDEX.fullmatch(p)]
        if named:
            return named[-1]
    m = _DASH_DIGIT.search(task_id)
    if m and m.start() > 0:
        return task_id[: m.start()]
    return task_id


def family_of(task: Task) -> str:
    """The family of a task: its `config["family"]`, else the one its id names."""
    return str(task.config.get("family") or task_family(task.task_id))


@dataclass(frozen=True, slots=True)
class FamilyUsage:
    family: str
    tasks: int
    rollouts: int
    """Trajectories logged (every status: what the environments spent)."""
    trained: int
    """Rows trained (CONSUMED)."""
    no_signal: int
    """Rows dropped because their group's rewards were all equal."""

    @property
    def per_trained(self) -> float | None:
        """Rollouts spent per trained row (None when nothing of the family trained)."""
        return self.rollouts / self.trained if self.trained else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def family_usage(
    per_task: Mapping[str, tuple[int, int, int]], families: Mapping[str, str] | None = None
) -> list[FamilyUsage]:
    """Sum `DurableLog.task_usage` (task -> rollouts, trained, no_signal) by family, most
    rollouts first; `families` (task id -> family) wins over the id rule where it has a task."""
    acc: dict[str, list[int]] = {}
    for task_id, (n, k, d) in per_task.items():
        fam = (families or {}).get(task_id) or task_family(task_id)
        a = acc.setdefault(fam, [0, 0, 0, 0])
        a[0] += 1
        a[1] += n
        a[2] += k
        a[3] += d
    rows = [FamilyUsage(f, *a) for f, a in acc.items()]
    return sorted(rows, key=lambda r: (-r.rollouts, r.family))


def family_table(
    rows: list[FamilyUsage], title: str = "rollouts per trained row, by family"
) -> Table:
    """The table `dart-ray report` and the end-of-run report print (a rich `Table`), with a
    total line."""
    t = Table("family", "tasks", "rollouts", "trained", "no_signal", "rollouts / trained",
              title=title)  # fmt: skip
    total = FamilyUsage(
        "all",
        sum(r.tasks for r in rows),
        sum(r.rollouts for r in rows),
        sum(r.trained for r in rows),
        sum(r.no_signal for r in rows),
    )
    for r in [*rows, total]:
        ratio = "-" if r.per_trained is None else f"{r.per_trained:.2f}"
        t.add_row(r.family, str(r.tasks), str(r.rollouts), str(r.trained), str(r.no_signal), ratio)
    return t

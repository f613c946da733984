"""Figures of a run, drawn with matplotlib next to `report.json`, and the interval arithmetic
they show.

`curve.png` has two panels:

- **held-out success** (greedy) at each evaluated version, with 95% Wilson intervals: the
  number a run is judged by;
- **sampled success** per band of weight versions, from the durable log (every trainable
  episode the rollouts played, with its interval), and the mean reward of the curated groups
  of each train step (groups without signal are dropped before training, so this line sits
  above the sampled success).

`dart-ray report RUN` redraws it from the log and the run's `report.json`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Z95 = 1.959964


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sound near 0 and 1)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def delta_interval(before: float, after: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% interval of after - before for two success rates on n tasks each (normal
    approximation, treating the two measurements as independent: conservative when, as in
    a run's report, both are taken on the same tasks)."""
    if n <= 0:
        return -1.0, 1.0
    se = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    d = after - before
    return d - z * se, d + z * se


@dataclass(frozen=True)
class Point:
    """A success rate measured at a weight version: `successes` of `n`."""

    version: float
    successes: int
    n: int

    @property
    def rate(self) -> float:
        return self.successes / self.n if self.n else 0.0


def bands(by_version: dict[int, tuple[int, int]], width: int) -> list[Point]:
    """(successes, episodes) per version -> one Point per band of `width` versions, placed
    at the band's middle version."""
    acc: dict[int, list[int]] = {}
    for v, (k, n) in by_version.items():
        a = acc.setdefault(v // width, [0, 0])
        a[0] += k
        a[1] += n
    return [Point(b * width + (width - 1) / 2, k, n) for b, (k, n) in sorted(acc.items()) if n > 0]


def draw_learning_curve(
    out: Path,
    title: str,
    heldout: Sequence[Point],
    sampled: Sequence[Point],
    rewards: Sequence[tuple[float, float]] = (),
) -> Path:
    """Write the two-panel figure; `rewards` are (version, mean curated reward) per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
    fig.suptitle(title)
    _rates(top, heldout, "held-out success (greedy)", "tab:red", "o-")
    top.set_ylabel("held-out success")
    if not heldout:
        top.text(0.5, 0.5, "no held-out evaluation (run.eval_tasks = 0; see dart-ray report --eval)",
                 ha="center", va="center", transform=top.transAxes, fontsize=9, color="gray")  # fmt: skip
    if heldout:
        n = max(p.n for p in heldout)
        top.set_title(f"held-out, {n} tasks, 95% Wilson intervals", fontsize=9)
    _rates(bottom, sampled, "sampled success (rollouts, from the log)", "tab:blue", "s-")
    if rewards:
        xs, ys = zip(*rewards, strict=True)
        bottom.plot(
            xs, ys, color="tab:gray", lw=0.8, alpha=0.7, label="mean reward, trained groups"
        )
    bottom.set_ylabel("success / reward")
    bottom.set_xlabel("weight version")
    for ax in (top, bottom):
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _rates(ax: object, points: Sequence[Point], label: str, colour: str, style: str) -> None:
    if not points:
        return
    xs = [p.version for p in points]
    ys = [p.rate for p in points]
    ci = [wilson(p.successes, p.n) for p in points]
    low = [max(0.0, y - lo) for y, (lo, _) in zip(ys, ci, strict=True)]
    high = [max(0.0, hi - y) for y, (_, hi) in zip(ys, ci, strict=True)]
    err = [low, high]
    ax.errorbar(xs, ys, yerr=err, fmt=style, color=colour, capsize=3, label=label)  # type: ignore[attr-defined]

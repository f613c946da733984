"""Figures of a run, drawn with matplotlib next to `report.json`, and the interval arithmetic
they show.

`curve.png` has two panels:

- **held-out success** (greedy) at each evaluated version, with 95% Wilson intervals: the
  number a run is judged by;
- **sampled success** per band of weight versions, from the durable log (every trainable
  episode the rollouts played, with its interval), and the mean reward of the curated groups
  of each train step (groups without signal are dropped before training, so this line sits
  above the sampled success).

`system.png` has three panels:

- **utilisation over time** of the environments (the fraction of sessions inside an
  episode, from the log's episode start and end times) and of the trainer (the fraction of
  time in a train step or a weight sync), per time bin;
- **staleness**: claimed rows by how many versions behind the policy they were;
- **weight-sync latency** of each published version.

`dart-ray report RUN` redraws both from the log and the run's `report.json`.
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
    return _save(fig, out)


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


def utilisation(
    intervals: Sequence[tuple[float, float]], capacity: int, t0: float, t1: float, bins: int
) -> list[tuple[float, float]]:
    """(bin middle, busy fraction) for `bins` equal bins of [t0, t1]: the busy time of the
    intervals inside each bin over `capacity` x the bin's length (capacity: how many
    intervals can run at once, e.g. the number of sessions)."""
    if bins < 1 or t1 <= t0 or capacity < 1:
        return []
    width = (t1 - t0) / bins
    busy = [0.0] * bins
    for a, b in intervals:
        a, b = max(a, t0), min(b, t1)
        if b <= a:
            continue
        first, last = int((a - t0) // width), min(bins - 1, int((b - t0) // width))
        for i in range(first, last + 1):
            lo, hi = t0 + i * width, t0 + (i + 1) * width
            busy[i] += max(0.0, min(b, hi) - max(a, lo))
    return [(t0 + (i + 0.5) * width, busy[i] / (capacity * width)) for i in range(bins)]


def draw_system(
    out: Path,
    title: str,
    env: Sequence[tuple[float, float]],
    trainer: Sequence[tuple[float, float]],
    staleness: dict[int, int],
    sync_latency: Sequence[tuple[float, float]],
) -> Path:
    """Write the three-panel figure; `env` and `trainer` are (minute, busy fraction)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (util, stale, sync) = plt.subplots(3, 1, figsize=(7.5, 8.0))
    fig.suptitle(title)
    for series, label, colour in ((env, "environments", "tab:green"), (trainer, "trainer", "tab:purple")):  # fmt: skip
        if series:
            xs, ys = zip(*series, strict=True)
            util.step(xs, ys, where="mid", color=colour, label=label)
    util.set_ylim(-0.02, 1.02)
    util.set_xlabel("minutes since the first episode")
    util.set_ylabel("busy fraction")
    util.set_title("utilisation over time", fontsize=9)
    if staleness:
        lags = sorted(staleness)
        stale.bar(lags, [staleness[k] for k in lags], color="tab:orange")
        stale.set_xticks(lags)
    stale.set_xlabel("versions behind the policy when claimed")
    stale.set_ylabel("rows")
    stale.set_title("staleness of the rows the curator claimed", fontsize=9)
    if sync_latency:
        xs, ys = zip(*sync_latency, strict=True)
        sync.plot(xs, ys, "o-", ms=3, color="tab:blue")
        sync.set_ylim(bottom=0)
    sync.set_xlabel("weight version")
    sync.set_ylabel("seconds")
    sync.set_title("weight-sync latency (publish until every replica serves it)", fontsize=9)
    for ax in (util, stale, sync):
        ax.grid(alpha=0.3)
        if not ax.has_data():
            ax.text(0.5, 0.5, "nothing recorded", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="gray")  # fmt: skip
    if util.has_data():
        util.legend(loc="best", fontsize=8)
    return _save(fig, out)


def _save(fig: object, out: Path) -> Path:
    """Lay the figure out, write it as a PNG (its folder made if needed) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return out

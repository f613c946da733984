"""The figure of a `dart-ray experiment`: each arm's lift per split, every run a dot, the mean
with its 95% interval over seeds and tasks as a bar (`dart_ray.evaluation.stats`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw_experiment(result: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(result["tasks"])
    fig, axes = plt.subplots(1, len(splits), figsize=(4.2 * len(splits), 3.6), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        names = [n for n, a in result["arms"].items() if split in a.get("splits", {})]
        for i, name in enumerate(names):
            arm = result["arms"][name]
            st = arm["splits"][split]
            lo, hi = st["lift_ci95"]
            mean = st["mean_lift"]
            ax.errorbar(
                [i], [100 * mean], yerr=[[100 * (mean - lo)], [100 * (hi - mean)]],
                fmt="s", color="C0" if name == "rl" else "C7", capsize=5, markersize=7,
            )  # fmt: skip
            lifts = [100 * s["lift"][split] for s in arm["seeds"] if split in s.get("lift", {})]
            ax.scatter([i + 0.15] * len(lifts), lifts, s=14, color="k", zorder=3)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(names)), names)
        before = 100 * sum(result["before"][split].values()) / max(1, len(result["tasks"][split]))
        ax.set_title(f"{split}: {len(result['tasks'][split])} tasks, from {before:.1f}%")
        ax.set_ylabel("lift, points (95% over seeds and tasks)")
    fig.suptitle(f"{result['name']} ({result['config']}, {result['commit'][:10]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

"""Decoupled against both synchronous baselines as the session pool grows (timing mode).

Runs `benchmarks/decoupling.py` once per pool size (each size one run of every mode, the
modes back to back: the ratio at a size is measured in one run), then draws samples trained
per modelled hour, environment utilisation and trainer utilisation against the sessions, one
line per mode, and writes every size's JSON and their summary. SIMULATED, as decoupling.py.

    .venv/bin/python benchmarks/decoupling_scaling.py --sizes 8,16,32,64,128 --minutes 4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test imports this file

import decoupling
from harness import RESULTS, Bench, console, parser, table

MODES = ("decoupled", "sync", "sync-dynamic")
FIGURES = {
    "samples_per_hour": "samples trained / modelled hour",
    "env_utilisation": "environment utilisation",
    "trainer_utilisation": "trainer utilisation",
}


def draw(sizes: dict[int, dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4.2 * len(FIGURES), 3.6))
    xs = sorted(sizes)
    for ax, (key, label) in zip(axes, FIGURES.items(), strict=True):
        for mode in MODES:
            ys = [sizes[n]["modes"].get(mode, {}).get(key) for n in xs]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("environment sessions")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("SIMULATED (timing mode): decoupled vs synchronous by pool size", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _measured(r: dict[str, Any], a: Any) -> int:
    """The pool size of a decoupling.py result measured as this run would (every mode, the
    same minutes and scale); 0 if it was not, so it is measured again."""
    args = r.get("args", {})
    same = (
        {m["mode"] for m in r.get("modes", [])} >= set(MODES)
        and float(args.get("minutes", -1)) == a.minutes
        and float(args.get("scale", -1)) == a.scale
    )
    return int(args.get("sessions", 0)) if same else 0


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "decoupling-scaling")
    p.add_argument("--sizes", default="8,16,32,64,128", help="comma-separated session counts")
    p.add_argument("--minutes", type=float, default=4.0, help="wall budget of each mode")
    p.add_argument("--scale", type=float, default=0.1, help="timing.scale")
    p.add_argument("--port", type=int, default=8260, help="first policy port")
    p.add_argument(
        "--reuse",
        nargs="*",
        type=Path,
        default=[],
        help="decoupling.py results to take a size from instead of measuring it again (each "
        "must be of every mode at this --minutes and --scale; its date and commit are kept)",
    )
    bench = Bench.start(p, argv)
    a = bench.args
    reused = {n: (f, r) for f in a.reuse if (n := _measured(r := json.loads(f.read_text()), a))}
    sizes: dict[int, dict[str, Any]] = {}
    for n in (int(s) for s in a.sizes.split(",")):
        out, r = reused.get(n, (RESULTS / f"decoupling-{n}.json", None))
        if r is None:
            argv_n = ["--minutes", str(a.minutes), "--scale", str(a.scale), "--sessions", str(n),
                      "--modes", ",".join(MODES), "--port", str(a.port), "--out", str(out)]  # fmt: skip
            decoupling.main(argv_n)
            r = json.loads(out.read_text())
        sizes[n] = {
            "file": str(out.resolve().relative_to(RESULTS.parents[1])),
            "date": r.get("date"),
            "git_commit": r.get("git_commit"),
            "baseline": r.get("baseline"),
            "samples_per_hour_ratio": r.get("samples_per_hour_ratio"),
            "stale_dropped_frac": r.get("stale_dropped_frac"),
            "modes": {m["mode"]: {k: m[k] for k in FIGURES} for m in r["modes"]},
        }
    t = table(f"SIMULATED: by pool size, {a.minutes} min per mode at timing.scale {a.scale}",
              ("sessions", *(f"{m} samples/h" for m in MODES), "ratio", "baseline", "stale"),
              left={"baseline"})  # fmt: skip
    for n, s in sorted(sizes.items()):
        t.add_row(
            str(n),
            *(f"{s['modes'].get(m, {}).get('samples_per_hour', 0):,.0f}" for m in MODES),
            f"{s['samples_per_hour_ratio'] or 0:.2f}x",
            str(s["baseline"]),
            f"{s['stale_dropped_frac'] or 0:.1%}",
        )
    console().print(t)
    figure = draw(sizes, a.out.with_suffix(".png"))
    bench.write({"simulated": True, "sizes": sizes, "figure": str(figure)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw docs/img/dataflow.svg: dart-ray's data flow, each part named with the modules that
implement it (docs/CONCEPTS.md opens with it).

    .venv/bin/python scripts/draw_dataflow.py [--out docs/img/dataflow.svg]

The SVG keeps its text as text, so `tests/test_docs.py` can check that the checked-in
picture says what this script draws today (every title, label and module, whatever
matplotlib version drew the shapes) and that every module it names exists.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "dataflow.svg"


@dataclass(frozen=True)
class Node:
    key: str
    title: str
    what: str
    modules: tuple[str, ...]
    x: float
    y: float
    colour: str


W, H = 3.2, 1.65
TITLE = "dart-ray: decoupled rollout and training (the run: dart_ray/run/driver.py)"
NODES = (
    Node(
        "tasks", "task suites", "JSONL, per env", ("dart_ray/envs/suites.py",), 0.2, 8.4, "#eeeeee"
    ),
    Node(
        "envs",
        "EnvSession actors",
        "reset / step / evaluate; recover",
        ("actors/env_session.py", "dart_ray/envs/"),
        0.2,
        5.9,
        "#dbe9f6",
    ),
    Node(
        "rollouter",
        "Rollouter actors",
        "K episodes in flight",
        ("actors/rollouter.py", "dart_ray/rollout/"),
        3.7,
        8.4,
        "#dbe9f6",
    ),
    Node(
        "policy",
        "PolicyServer (Ray Serve)",
        "text, token ids, log-probs, version",
        ("serve_apps/policy.py", "dart_ray/engines/"),
        10.7,
        8.4,
        "#fde2c8",
    ),
    Node(
        "blobs",
        "blob storage",
        "one Parquet file per trajectory",
        ("dart_ray/store/blobs.py",),
        3.7,
        5.9,
        "#e8e8e8",
    ),
    Node(
        "log",
        "durable log (SQL)",
        "rollout_run, events, task_stats",
        ("dart_ray/store/log.py", "sql/schema.sql"),
        7.2,
        5.9,
        "#e8e8e8",
    ),
    Node(
        "curator",
        "Curator actor",
        "claim once, staleness, groups,\nreplay, advantages, Arrow shards",
        ("actors/curator.py", "dart_ray/data/", "dart_ray/algo/"),
        5.45,
        3.4,
        "#dff0d8",
    ),
    Node(
        "trainer",
        "Ray Train FSDP2 workers",
        "PPO / GSPO x off-policy weight",
        ("dart_ray/train/", "dart_ray/algo/losses.py"),
        5.45,
        0.9,
        "#fde2c8",
    ),
    Node(
        "checkpoints",
        "checkpoints",
        "registry, versions, lineage",
        ("dart_ray/store/checkpoints.py",),
        10.7,
        0.9,
        "#e8e8e8",
    ),
)
EDGES = (
    ("tasks", "rollouter", "tasks"),
    ("rollouter", "envs", "actions / screenshots"),
    ("rollouter", "policy", "prompts"),
    ("rollouter", "blobs", "trajectory"),
    ("rollouter", "log", "row"),
    ("log", "curator", "claim (lease)"),
    ("blobs", "curator", "read"),
    ("curator", "trainer", "bounded queue"),
    ("trainer", "policy", "weights: ray.put once"),
    ("trainer", "checkpoints", "save, then ACK rows"),
)


def _centre(n: Node) -> tuple[float, float]:
    return n.x + W / 2, n.y + H / 2


def _edge_point(n: Node, towards: tuple[float, float]) -> tuple[float, float]:
    """Where the line from n's centre towards a point leaves n's box."""
    cx, cy = _centre(n)
    dx, dy = towards[0] - cx, towards[1] - cy
    sx = (W / 2) / abs(dx) if dx else float("inf")
    sy = (H / 2) / abs(dy) if dy else float("inf")
    s = min(sx, sy)
    return cx + dx * s, cy + dy * s


def draw(out: Path) -> Path:
    plt.rcParams["svg.hashsalt"] = "dart-ray"
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and checked by tests
    fig, ax = plt.subplots(figsize=(11.0, 8.2))
    ax.set_xlim(0, 14)
    ax.set_ylim(0.6, 10.6)
    ax.axis("off")
    nodes = {n.key: n for n in NODES}
    for n in NODES:
        ax.add_patch(
            FancyBboxPatch(
                (n.x, n.y), W, H, boxstyle="round,pad=0.05", fc=n.colour, ec="#555555", lw=1
            )
        )
        ax.text(n.x + W / 2, n.y + H - 0.22, n.title, ha="center", va="top", fontsize=10,
                weight="bold")  # fmt: skip
        ax.text(n.x + W / 2, n.y + H - 0.5, n.what, ha="center", va="top", fontsize=7.5)
        ax.text(n.x + W / 2, n.y + 0.1, "\n".join(n.modules), ha="center", va="bottom",
                fontsize=6.5, family="monospace", color="#1f4e79")  # fmt: skip
    for a, b, label in EDGES:
        na, nb = nodes[a], nodes[b]
        start = _edge_point(na, _centre(nb))
        end = _edge_point(nb, _centre(na))
        ax.annotate(
            "", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": "#333333", "lw": 1}
        )
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(mx, my, label, fontsize=7, ha="center", va="center", color="#333333",
                bbox={"fc": "white", "ec": "none", "pad": 0.5})  # fmt: skip
    ax.text(
        0.2,
        10.55,
        TITLE,
        fontsize=11,
        va="top",
        weight="bold",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return out


def texts() -> set[str]:
    """Every string the picture shows, one per text element (what a test compares)."""
    out = {t for n in NODES for t in (n.title, n.what, "\n".join(n.modules))}
    return out | {label for _, _, label in EDGES} | {TITLE}


def modules() -> list[str]:
    """Every module or package the picture names (a test checks that each exists)."""
    return sorted({m for n in NODES for m in n.modules} | {"dart_ray/run/driver.py"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="the SVG to write")
    print(draw(p.parse_args().out))


if __name__ == "__main__":
    main()

"""The curator's data path: trajectory blobs -> step samples -> packed Arrow shards.

    .venv/bin/python benchmarks/blobs_to_batch.py [--trajectories 64] [--steps 3] [--history 5]

What the curator does with claimed rows (`dart_ray/data/curator.py`): read each blob
(Parquet -> Arrow table), decode it into a `Trajectory`, split it into step samples (each
with its window of the last `--history` screenshots; `split_steps`, the same code on both
sides) and pack the samples into one `SAMPLE_SCHEMA` batch per trainer rank. Also the
rollouter's side: a `Trajectory` built from the engine's tuples -> the Arrow table it writes.

Baseline, measured in the same run on the same blobs, alternating with the new path: the
previous code, kept below (`pq.read_table`; `Table.to_pylist` and a tuple per token list;
`from_pydict` of nested Python lists). Now: `BlobStore.read_table` (`ParquetFile`), token
lists as numpy views of the blob's buffers (`ArraySeq`), list columns built from offsets and
concatenated buffers (`dart_ray/arrays.py`). Both give equal trajectories, samples and shards
(checked). Also the memory the decoded trajectories hold (Python objects + Arrow buffers).
Screenshots: 112x112 PNGs of a drawn desktop (windows, title bars, labels). Prints a table;
writes benchmarks/results/blobs_to_batch.json.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from harness import Bench, console, parser, table
from PIL import Image, ImageDraw

from dart_ray.data.batches import pack, shard_by_tokens
from dart_ray.data.curation import StepSample, split_steps
from dart_ray.records import (
    SAMPLE_SCHEMA,
    STEP_SCHEMA,
    TRAJECTORY_META_KEY,
    Action,
    ActionKind,
    Status,
    Step,
    Task,
    Trajectory,
    _action_from_dict,
    _action_to_dict,
    _trajectory_meta,
    trajectory_from_table,
    trajectory_to_table,
)
from dart_ray.store.blobs import BlobStore

# ----------------------------------------------------------------- the previous path (baseline)


def pylist_to_table(t: Trajectory) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in STEP_SCHEMA.names}
    for s in t.steps:
        cols["trajectory_id"].append(t.trajectory_id)
        cols["task_id"].append(t.task.task_id)
        cols["step_idx"].append(s.step_idx)
        cols["weight_version"].append(s.weight_version)
        cols["prompt_ids"].append(list(s.prompt_ids))
        cols["response_ids"].append(list(s.response_ids))
        cols["behaviour_logprobs"].append(list(s.behaviour_logprobs))
        cols["entropy"].append(list(s.entropy))
        cols["token_versions"].append(list(s.token_versions))
        cols["num_images"].append(s.num_images)
        cols["response_text"].append(s.response_text)
        cols["action"].append(_action_to_dict(s.action))
        cols["screenshot"].append(s.screenshot)
    meta = {TRAJECTORY_META_KEY: json.dumps(_trajectory_meta(t)).encode()}
    return pa.Table.from_pydict(cols, schema=STEP_SCHEMA.with_metadata(meta))


def pylist_from_table(table: pa.Table) -> Trajectory:
    m = json.loads(table.schema.metadata[TRAJECTORY_META_KEY])
    steps = tuple(
        Step(
            step_idx=row["step_idx"],
            prompt_ids=tuple(row["prompt_ids"]),
            response_ids=tuple(row["response_ids"]),
            behaviour_logprobs=tuple(row["behaviour_logprobs"]),
            entropy=tuple(row["entropy"]),
            token_versions=tuple(row.get("token_versions") or ()),
            num_images=row["num_images"],
            weight_version=row["weight_version"],
            response_text=row["response_text"],
            action=_action_from_dict(row["action"]),
            screenshot=row["screenshot"],
        )
        for row in table.to_pylist()
    )
    task = m.pop("task")
    return Trajectory(task=Task(**task), steps=steps, **{**m, "status": Status(m["status"])})


def pylist_batch(samples: Sequence[StepSample]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "trajectory_id": [s.trajectory_id for s in samples],
            "task_id": [s.task_id for s in samples],
            "step_idx": [s.step_idx for s in samples],
            "weight_version": [s.weight_version for s in samples],
            "prompt_ids": [list(s.prompt_ids) for s in samples],
            "response_ids": [list(s.response_ids) for s in samples],
            "behaviour_logprobs": [list(s.behaviour_logprobs) for s in samples],
            "loss_mask": [[1] * len(s.response_ids) for s in samples],
            "advantage": [s.advantage for s in samples],
            "images": [list(s.images) for s in samples],
            "token_versions": [list(s.token_versions) for s in samples],
        },
        schema=SAMPLE_SCHEMA,
    )


def pylist_pack(samples: Sequence[StepSample], num_ranks: int) -> list[pa.RecordBatch]:
    return [pylist_batch(s) for s in shard_by_tokens(samples, num_ranks)]


# ------------------------------------------------------------------------------- workload


def screenshot(rng: np.random.Generator) -> bytes:
    """A 112x112 desktop: a background, a few windows with a title bar and a label."""
    im = Image.new("RGB", (112, 112), tuple(int(c) for c in rng.integers(150, 230, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 5))):
        x, y = (int(v) for v in rng.integers(0, 80, 2))
        w, h = (int(v) for v in rng.integers(20, 50, 2))
        d.rectangle((x, y, x + w, y + h), fill=(250, 250, 250), outline=(60, 60, 60))
        d.rectangle((x, y, x + w, y + 6), fill=tuple(int(c) for c in rng.integers(0, 200, 3)))
        d.text((x + 3, y + 9), f"OK {int(rng.integers(100))}", fill=(0, 0, 0))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def trajectories(a: argparse.Namespace) -> list[Trajectory]:
    """What the rollouter logs: tuples from the engine, float32-exact log-probs."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(a.trajectories):
        steps = []
        for i in range(a.steps):
            p = int(rng.integers(a.prompt // 2, a.prompt * 3 // 2))
            r = int(rng.integers(a.response // 2, a.response * 3 // 2))
            steps.append(
                Step(
                    step_idx=i,
                    prompt_ids=tuple(rng.integers(10, 150_000, p).tolist()),
                    response_ids=tuple(rng.integers(10, 150_000, r).tolist()),
                    behaviour_logprobs=tuple(np.float32(-rng.random(r)).tolist()),
                    entropy=tuple(np.float32(rng.random(r) * 3).tolist()),
                    weight_version=3,
                    response_text="Thought: the OK button.\nAction: click(start_box='(40,50)')",
                    action=Action(ActionKind.CLICK, point=(40.0, 50.0)),
                    screenshot=screenshot(rng),
                    num_images=min(i + 1, a.history),
                )
            )
        out.append(
            Trajectory(
                f"traj-{k}",
                "bench",
                Task(f"task-{k // 8}", "click OK", "minidesk"),
                tuple(steps),
                float(k % 2),
                Status.OK,
                group_id=f"task-{k // 8}#0",
                group_size=8,
            )
        )
    return out


def timed(old: Callable[[], object], new: Callable[[], object], repeats: int) -> list[float]:
    """Median seconds of each, alternating old and new so that load on the machine hits both."""
    old(), new()  # warm-up
    times: list[list[float]] = [[], []]
    for _ in range(repeats):
        for i, fn in enumerate((old, new)):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def held_bytes(load: Callable[[], object]) -> int:
    """Bytes (Python objects + Arrow buffers) that `load()`'s result keeps alive."""
    gc.collect()
    tracemalloc.start()
    py0, arrow0 = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
    kept = load()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - py0 + pa.total_allocated_bytes() - arrow0
    tracemalloc.stop()
    del kept
    return held


def split(trajs: Sequence[Trajectory], advs: Sequence[float]) -> list[StepSample]:
    return [s for t, v in zip(trajs, advs, strict=True) for s in split_steps(t, v)]


def measure(a: argparse.Namespace, where: Path) -> dict[str, Any]:
    trajs = trajectories(a)
    store = BlobStore(where)
    uris = [store.write(t) for t in trajs]
    advs = [0.5 if t.reward else -0.5 for t in trajs]
    old_tables = [pq.read_table(u, filesystem=store.fs) for u in uris]
    new_tables = [store.read_table(u) for u in uris]
    old_trajs = [pylist_from_table(t) for t in old_tables]
    new_trajs = [trajectory_from_table(t) for t in new_tables]
    old_samples, new_samples = split(old_trajs, advs), split(new_trajs, advs)

    def old_path() -> list[pa.RecordBatch]:
        got = [pylist_from_table(pq.read_table(u, filesystem=store.fs)) for u in uris]
        return pylist_pack(split(got, advs), a.ranks)

    def new_path() -> list[pa.RecordBatch]:
        return pack(split([store.read(u) for u in uris], advs), a.ranks)

    # the same records, samples and shards
    assert new_trajs == old_trajs == trajs and new_samples == old_samples
    assert all(pylist_to_table(t).equals(trajectory_to_table(t)) for t in trajs)
    assert all(x.equals(y) for x, y in zip(old_path(), new_path(), strict=True))

    phases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "write: Trajectory -> Arrow table (rollouter)",
            lambda: [pylist_to_table(t) for t in trajs],
            lambda: [trajectory_to_table(t) for t in trajs],
        ),
        (
            "read: blob -> Arrow table",
            lambda: [pq.read_table(u, filesystem=store.fs) for u in uris],
            lambda: [store.read_table(u) for u in uris],
        ),
        (
            "decode: table -> Trajectory",
            lambda: [pylist_from_table(t) for t in old_tables],
            lambda: [trajectory_from_table(t) for t in new_tables],
        ),
        (
            "split: Trajectory -> StepSamples",
            lambda: split(old_trajs, advs),
            lambda: split(new_trajs, advs),
        ),
        (
            f"pack: StepSamples -> {a.ranks} shards",
            lambda: pylist_pack(old_samples, a.ranks),
            lambda: pack(new_samples, a.ranks),
        ),
        ("curator total: read + decode + split + pack", old_path, new_path),
    ]
    results = []
    for name, old, new in phases:
        base, ours = timed(old, new, a.repeats)
        results.append({"phase": name, "baseline_ms": base * 1e3, "columnar_ms": ours * 1e3})
    memory = {
        "baseline_bytes": held_bytes(lambda: [pylist_from_table(t) for t in old_tables]),
        "columnar_bytes": held_bytes(lambda: [store.read(u) for u in uris]),
    }
    png = statistics.mean(len(s.screenshot) for t in trajs for s in t.steps)
    return {"results": results, "memory": memory, "png_bytes_mean": png}


def report(a: argparse.Namespace, m: dict[str, Any]) -> None:
    title = (
        f"{a.trajectories} trajectories x {a.steps} steps, prompts ~{a.prompt} tokens, "
        f"responses ~{a.response}, history {a.history} (median of {a.repeats})"
    )
    t = table(title, ("phase", "to_pylist path (ms)", "columnar (ms)", "speed-up"), "left")
    for r in m["results"]:
        speedup = r["baseline_ms"] / r["columnar_ms"]
        t.add_row(
            r["phase"], f"{r['baseline_ms']:.1f}", f"{r['columnar_ms']:.1f}", f"{speedup:.2f}x"
        )
    old, new = m["memory"]["baseline_bytes"], m["memory"]["columnar_bytes"]
    t.add_row(
        "held by the decoded trajectories (MB)",
        f"{old / 1e6:.1f}",
        f"{new / 1e6:.1f}",
        f"{old / new:.1f}x less",
    )
    console().print(t)


def main() -> None:
    ap = parser(__doc__, "blobs_to_batch")
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="steps per trajectory")
    ap.add_argument("--prompt", type=int, default=600, help="mean prompt tokens")
    ap.add_argument("--response", type=int, default=40, help="mean response tokens")
    ap.add_argument("--history", type=int, default=5, help="screenshots per prompt, at most")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    bench = Bench.start(ap)
    with tempfile.TemporaryDirectory(prefix="blobs-to-batch-") as d:
        m = measure(bench.args, Path(d))
    report(bench.args, m)
    bench.write(m)


if __name__ == "__main__":
    main()

"""Collate benchmark: Arrow step samples -> the trainer's tensors, per 1,000 samples.

    .venv/bin/python benchmarks/collate.py [--samples 1000] [--prompt 600] [--response 40]

Baseline, measured in the same run: the previous collate, which turned the whole batch into
Python lists (`RecordBatch.to_pylist`) and padded from them. Now: token lists go from the
Arrow buffers to tensors through numpy views. Two workloads: token columns only (no images:
what the Arrow path itself costs) and full samples with one 112x112 screenshot each (image
decoding and the image processor dominate, and are the same in both). Prints a table; writes
benchmarks/results/collate.json.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from harness import Bench, console, parser, table, timed
from PIL import Image

from dart_ray.records import SAMPLE_SCHEMA
from dart_ray.train.forward import collate

IMAGE_PAD = 7


class _NoImages:
    """An image processor for batches without images (never called)."""

    merge_size = 2


def _pad(seqs: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    n = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), n), value, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.tensor(list(s), dtype=dtype)
    return out


def pylist_collate(batch: pa.RecordBatch, image_processor: Any) -> dict[str, torch.Tensor]:
    """The baseline: the previous implementation's token path (to_pylist, then pad)."""
    rows = batch.to_pylist()
    images = [Image.open(io.BytesIO(d)).convert("RGB") for r in rows for d in r["images"]]
    if images:
        image_processor(images=images, return_tensors="pt")
    seqs = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in rows]
    return {
        "input_ids": _pad(seqs, 0, torch.long),
        "attention_mask": _pad([[1] * len(s) for s in seqs], 0, torch.long),
        "response_ids": _pad([r["response_ids"] for r in rows], 0, torch.long),
        "response_mask": _pad([r["loss_mask"] for r in rows], 0, torch.long),
        "behaviour_logprobs": _pad([r["behaviour_logprobs"] for r in rows], 0.0, torch.float32),
        "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
    }


def samples(n: int, prompt: int, response: int, with_images: bool) -> pa.RecordBatch:
    rng = np.random.default_rng(0)
    png = b""
    image_tokens = 0
    if with_images:
        buf = io.BytesIO()
        Image.new("RGB", (112, 112), (120, 40, 200)).save(buf, format="PNG")
        png, image_tokens = buf.getvalue(), 16  # 112x112 -> 4x4 merged patches
    rows: dict[str, list[Any]] = {k: [] for k in SAMPLE_SCHEMA.names}
    for i in range(n):
        p = int(rng.integers(prompt // 2, prompt * 3 // 2))
        r = int(rng.integers(response // 2, response * 3 // 2))
        ids = rng.integers(10, 600, p).tolist()
        ids[5 : 5 + image_tokens] = [IMAGE_PAD] * image_tokens
        rows["trajectory_id"].append(f"t{i}")
        rows["task_id"].append("task")
        rows["step_idx"].append(0)
        rows["weight_version"].append(3)
        rows["prompt_ids"].append(ids)
        rows["response_ids"].append(rng.integers(10, 600, r).tolist())
        rows["behaviour_logprobs"].append((-rng.random(r)).tolist())
        rows["loss_mask"].append([1] * r)
        rows["advantage"].append(float(rng.normal()))
        rows["images"].append([png] if with_images else [])
        rows["token_versions"].append([])
    return pa.RecordBatch.from_pydict(rows, schema=SAMPLE_SCHEMA)


def main() -> None:
    ap = parser(__doc__, "collate")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--prompt", type=int, default=600, help="mean prompt tokens")
    ap.add_argument("--response", type=int, default=40, help="mean response tokens")
    ap.add_argument("--repeats", type=int, default=5)
    bench = Bench.start(ap)
    a = bench.args
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    proc = Qwen2VLImageProcessorPil(min_pixels=112 * 112, max_pixels=112 * 112)
    results = []
    for label, with_images in (("tokens only", False), ("with screenshots", True)):
        batch = samples(a.samples, a.prompt, a.response, with_images)
        ip = proc if with_images else _NoImages()
        new = collate(batch, ip, image_pad_id=IMAGE_PAD, pad_id=0)
        old = pylist_collate(batch, ip)
        assert torch.equal(new.input_ids, old["input_ids"])  # the same tensors
        assert torch.equal(new.behaviour_logprobs, old["behaviour_logprobs"])
        base = timed(lambda b=batch, p=ip: pylist_collate(b, p), a.repeats)
        ours = timed(
            lambda b=batch, p=ip: collate(b, p, image_pad_id=IMAGE_PAD, pad_id=0), a.repeats
        )
        per = 1000 / a.samples
        results.append(
            {
                "workload": label,
                "baseline_s_per_1000": statistics.median(base) * per,
                "arrow_s_per_1000": statistics.median(ours) * per,
                "speedup": statistics.median(base) / statistics.median(ours),
            }
        )
    t = table(f"collate, {a.samples} samples (median of {a.repeats})",
              ("workload", "to_pylist (s / 1000)", "Arrow -> numpy (s / 1000)", "speed-up"), "left")  # fmt: skip
    for r in results:
        t.add_row(
            r["workload"],
            f"{r['baseline_s_per_1000']:.3f}",
            f"{r['arrow_s_per_1000']:.3f}",
            f"{r['speedup']:.1f}x",
        )
    console().print(t)
    bench.write({"results": results})


if __name__ == "__main__":
    main()

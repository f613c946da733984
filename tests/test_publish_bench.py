"""The publish benchmark at its smoke size (marker `slow`: it starts its own Ray): full
weights and a LoRA adapter of a 1M-parameter decoder go through the object store into a
replica, and the 7B adapter's size from UI-TARS-1.5-7B's config matches the count by hand.
The timings are for docs/BENCHMARKS.md, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.bench, pytest.mark.timeout(300)]


def lora_params(rank: int, shapes: list[tuple[int, int]]) -> int:
    """A and B of each targeted Linear(in, out): rank x (in + out)."""
    return sum(rank * (i + o) for i, o in shapes)


def test_publish_benchmark_moves_full_weights_and_an_adapter_exactly(tmp_path: Path) -> None:
    out = tmp_path / "publish.json"
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "publish.py"), "--sizes", "1M",
         "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=280, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res = json.loads(out.read_text())
    (row,) = res["sizes"]
    assert row["full"]["exact"] and row["adapter"]["exact"]
    # 1M: hidden 64, intermediate 172, 2 layers, 4 heads of 16, 4 KV heads; bf16
    h, i = 64, 172
    per_layer = [(h, h), (h, h), (h, h), (h, h), (h, i), (h, i), (i, h)]
    assert row["adapter"]["params"] == lora_params(32, per_layer * 2)
    assert row["adapter"]["bytes"] == 2 * row["adapter"]["params"]
    # Qwen2.5-VL-7B's language model: hidden 3584, 28 heads of 128, 4 KV heads, MLP 18944
    h, kv, i = 3584, 4 * 128, 18944
    lm = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)] * 28
    assert res["7B"]["adapter_lm"]["params"] == lora_params(32, lm) == 80_740_352
    # its vision tower: 32 blocks of hidden 1280 (fused qkv, proj) and MLP 3420
    v, vi = 1280, 3420
    vision = [(v, 3 * v), (v, v), (v, vi), (v, vi), (vi, v)] * 32
    assert res["7B"]["adapter_lm_vision"]["params"] == lora_params(32, lm + vision)
    assert res["7B"]["full"]["bytes"] / res["7B"]["adapter_lm"]["bytes"] > 100

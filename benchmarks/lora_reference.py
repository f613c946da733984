"""A LoRA trainer's memory with the KL reference as a second model against the policy with its
adapters disabled (issue 46): what each holds, measured in separate processes.

With `train.lora` and `algo.kl_beta > 0` the KL's reference is the frozen base. It used to be
a second full copy of the base loaded beside the policy; it is now the policy itself with its
adapters switched off for the reference's forward (`lora.adapters_off`). Each mode builds the
trainer as the worker does (`train.worker._build`, one rank, CPU) in a fresh process, takes
two optimizer steps on rollouts of the tiny model, and reports the parameter bytes the
trainer holds and the process's peak resident memory. The tiny model is 1 MB, so the peak
barely moves here; the parameter bytes are the figure that scales: on UI-TARS-1.5-7B the
second copy is the whole model (16.6 GB in bf16, per trainer process before FSDP shards it).
Prints a table and writes JSON.

    .venv/bin/python benchmarks/lora_reference.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test imports this file

from harness import Bench, console, parser, table

CHILD = r"""
import json, resource, sys, tempfile
from pathlib import Path
import torch
from dart_ray.config import load_config
from dart_ray.data.batches import to_record_batch
from dart_ray.data.curation import split_steps
from dart_ray.engines.hf import HFEngine
from dart_ray.models.tiny import save_tiny_model
from dart_ray.train.job import TrainJob
from dart_ray.train.worker import _build
from tests.train.rollouts import policy_trajectories

mode = sys.argv[1]
tmp = Path(tempfile.mkdtemp())
model_dir = save_tiny_model(tmp / "tiny")
cfg = load_config(None, ["train.lora.enabled=true", "train.lora.rank=8", "algo.kl_beta=0.1"])
model, learner = _build(TrainJob(cfg, "b", str(model_dir), str(tmp), "c", "p", "k", "ns"))
if mode == "second-model":  # the old way: a full copy of the base beside the policy
    from dart_ray.models.loading import load_model
    from dart_ray.train.fsdp import shard_model
    learner.ref_adapters_off = False
    learner.ref_model = shard_model(load_model(model_dir), "cpu")
engine = HFEngine(model_dir)
trajs = policy_trajectories(engine, "run", "t", 0, [0.0] * 4)
batch = to_record_batch([s for t, a in zip(trajs, [1.0, -1.0, 0.5, -0.5]) for s in split_steps(t, a)])
for _ in range(2):
    m = learner.step(batch, version=0)
held = {id(p): p.numel() * p.element_size() for p in model.parameters()}
if learner.ref_model is not None:
    held |= {id(p): p.numel() * p.element_size() for p in learner.ref_model.parameters()}
print(json.dumps({
    "mode": mode,
    "parameter_bytes": sum(held.values()),
    "policy_parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "kl_ref": m.get("kl_ref"),
}))
"""

MODES = ("second-model", "adapters-off")
UITARS_7B_BF16_GB = 16.6
"""UI-TARS-1.5-7B's weights in bf16 (docs/REFERENCE.md): the second copy a trainer held."""


def run(mode: str) -> dict[str, object]:
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, cwd=root, check=True
    )
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    bench = Bench.start(parser(__doc__, "lora_reference"), argv)
    rows = {m: run(m) for m in MODES}
    t = table("LoRA trainer memory by KL reference (tiny model, one rank, CPU)",
              ("reference", "parameter bytes held", "peak RSS, MB", "kl_ref"), left={"reference"})  # fmt: skip
    for m, r in rows.items():
        t.add_row(m, f"{r['parameter_bytes']:,}", f"{r['peak_rss_mb']:.0f}", f"{r['kl_ref']:.2e}")
    console().print(t)
    saved = rows["second-model"]["parameter_bytes"] - rows["adapters-off"]["parameter_bytes"]  # type: ignore[operator]
    console().print(
        f"held per trainer without the second model: {saved:,} bytes fewer (the base's weights); "
        f"on UI-TARS-1.5-7B that is {UITARS_7B_BF16_GB} GB of bf16 weights"
    )
    bench.write({"modes": rows, "bytes_saved": saved, "uitars_7b_gb_saved": UITARS_7B_BF16_GB})
    return 0


if __name__ == "__main__":
    sys.exit(main())

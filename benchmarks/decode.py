"""Decode benchmark: the transformers engine's own decode loop against `generate`.

    .venv/bin/python benchmarks/decode.py [--batches 30] [--batch 8] [--model fixtures/tiny-multi]

Rung 3's prompts (configs/multi-step.toml: MiniDesk screens of 168x112, 24 image tokens each)
as a rollout builds them: first turns, and second turns carrying the first screenshot and
the policy's answer. A batch of `--batch` prompts is generated with rung 3's sampling
(temperature 1, top-p 0.8, 48 new tokens) by the same engine and weights twice, once with
`HFEngine.decode = "generate"` (transformers' `generate` driving our sampler: the baseline)
and once with `"lean"` (`HFEngine._decode`), interleaved, from the same seed; the two must
draw the same tokens (checked on every batch). The prefill alone (one forward of the batch's
prompts) is timed too: the most that reusing a turn's prefix in the next turn could save.
Prints a table, writes
benchmarks/results/decode.json.
"""

from __future__ import annotations

import statistics
import time

import torch
from harness import REPO_ROOT, Bench, console, parser, table

from dart_ray.config import load_config
from dart_ray.engines.base import SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.envs.base import make_env
from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.models.loading import EncodedPrompt
from dart_ray.uitars.prompts import Turn, build_messages

MODES = ("generate", "lean")


def prompts(engine: HFEngine, n: int) -> list[EncodedPrompt]:
    """`n` first-turn and `n` second-turn prompts of rung 3's training tasks."""
    cfg = load_config(REPO_ROOT / "configs" / "multi-step.toml", [])
    env = make_env(cfg.env)
    tasks = load_tasks(REPO_ROOT / cfg.env.tasks)[:n]
    first, second = [], []
    for task in tasks:
        shot = env.reset(task).screenshot
        first.append(build_messages(task.instruction, [Turn(shot)]))
    greedy = SamplingParams(temperature=0, max_new_tokens=48)
    encoded = [engine.processor.encode(m) for m in first]
    answers = engine.generate_sync(encoded, [greedy] * n, 0)
    for task, g in zip(tasks, answers, strict=True):
        shot = env.reset(task).screenshot
        second.append(build_messages(task.instruction, [Turn(shot, g.text), Turn(shot)]))
    env.close()
    return encoded + [engine.processor.encode(m) for m in second]


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__, "decode")
    p.add_argument("--batches", type=int, default=30, help="timed batches per mode")
    p.add_argument("--batch", type=int, default=8, help="prompts per batch (rung 3: 8)")
    p.add_argument("--model", default="fixtures/tiny-multi", help="policy folder")
    bench = Bench.start(p, argv, f"torch threads {torch.get_num_threads()}")
    a = bench.args
    engine = HFEngine(REPO_ROOT / a.model)
    pool = prompts(engine, a.batch)
    sp = SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=48)
    secs: dict[str, list[float]] = {m: [] for m in MODES}
    tokens: dict[str, int] = dict.fromkeys(MODES, 0)
    for i in range(a.batches + 1):  # batch 0 warms up and is not timed
        batch = pool[(i % 2) * a.batch : (i % 2 + 1) * a.batch]  # first, then second turns
        drawn = {}
        for mode in MODES if i % 2 else reversed(MODES):
            engine.decode = mode  # type: ignore[assignment]
            torch.manual_seed(i)
            t0 = time.perf_counter()
            gens = engine.generate_sync(batch, [sp] * len(batch), 0)
            if i:
                secs[mode].append(time.perf_counter() - t0)
                tokens[mode] += sum(len(g.response_ids) for g in gens)
            drawn[mode] = [g.response_ids for g in gens]
        if drawn["lean"] != drawn["generate"]:
            raise SystemExit(f"batch {i}: the lean loop drew other tokens than generate")
    prefill = []  # what reusing a turn's prefix across turns could save at most
    for i in range(a.batches):
        inputs = engine._inputs(pool[(i % 2) * a.batch : (i % 2 + 1) * a.batch])
        t0 = time.perf_counter()
        with torch.no_grad():
            engine.model.model.rope_deltas = None
            engine.model(**inputs, use_cache=True, logits_to_keep=1)
        prefill.append(time.perf_counter() - t0)
    med = {m: statistics.median(secs[m]) for m in MODES}
    med["prefill"] = statistics.median(prefill)
    t = table(
        f"{a.batch} rung-3 prompts a batch, {a.batches} batches a mode (medians)",
        ("decode", "ms per batch", "response tokens/s", "speed-up"),
        left={"decode"},
    )
    for m in MODES:
        rate = tokens[m] / sum(secs[m])
        t.add_row(m, f"{1000 * med[m]:.1f}", f"{rate:.0f}", f"{med['generate'] / med[m]:.2f}x")
    t.add_row("(prefill alone)", f"{1000 * med['prefill']:.1f}", "", "")
    console().print(t)
    bench.write(
        {
            "batch": a.batch,
            "batches": a.batches,
            "median_s": med,
            "seconds": secs,
            "response_tokens": tokens,
            "speedup": med["generate"] / med["lean"],
            "same_tokens": True,
        }
    )


if __name__ == "__main__":
    main()

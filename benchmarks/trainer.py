"""The trainer's two costs: one optimizer step on CPU, and publishing its weights to the policy.

1. Step time. `dart_ray.train.learner.Learner.step` (collate: decode the screenshots and run
   the image processor; forward and backward over micro-batches of at most
   `train.tokens_per_rank` tokens; gradient clip; AdamW) on the warm-started tiny model
   (`fixtures/tiny-sft`) with the loss settings of `configs/tiny-cpu.toml`, in this process,
   for several batch sizes. The samples are real: MiniDesk screenshots of the click-button
   tasks (320x240), prompted as the rollouter prompts them, answered by the HF engine
   (temperature 0.7, 32 new tokens), turned into step samples (`split_steps`, advantages +1 /
   -1) and into one Arrow batch (`to_record_batch`), exactly what the curator hands a rank.
   Threads: 1 by default, what a Ray Train worker reserving 0.5 CPU gets (OMP_NUM_THREADS=1).

2. Weight publication against model size (random Qwen2.5-VL models built with `TinySpec`,
   ~10M and ~100M parameters; ~500M when asked for and memory allows). dart-ray's path, as
   `dart_ray/train/worker.py` runs it on rank 0: gather the full state dict
   (`full_state_dict`; with one unsharded process this is a view of the parameters, so the
   FSDP all-gather of a multi-rank run is not in the number), `ray.put(pack(state))` once,
   and `update_weights` on a real Serve policy app with 2 replicas of the HF engine, which
   returns when every replica serves the new version. Against DART-GUI's path: the trainer
   writes an HF checkpoint (`save_pretrained`) and the model service restarts its engines from
   the files: here 2 fresh Python processes (one per replica, started together) that each
   build the HF engine from the checkpoint, timed until both are ready. The first publish to
   fresh replicas (which maps the object store into them) is reported apart from the median.

Prints two tables and the command, writes JSON to benchmarks/results/trainer.json.

    .venv/bin/python benchmarks/trainer.py                 # 10M and 100M
    .venv/bin/python benchmarks/trainer.py --sizes 10M,100M,500M
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
import torch
from harness import REPO_ROOT, Bench, console, local_ray, parser, table
from ray import serve

from dart_ray.config import Config, PolicyConfig, load_config
from dart_ray.data.batches import batch_tokens, to_record_batch
from dart_ray.data.curation import StepSample, split_steps
from dart_ray.engines.base import GenerateRequest, SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.envs.minidesk.env import MiniDeskEnv
from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.models.tiny import TinySpec, num_parameters, save_tiny_model
from dart_ray.models.weights import pack, warm_object_store
from dart_ray.records import Status, Step, Trajectory
from dart_ray.train.forward import collate
from dart_ray.train.fsdp import full_state_dict
from dart_ray.train.learner import Learner, loss_settings, split_micro
from dart_ray.uitars.actions import parse_response
from dart_ray.uitars.prompts import Turn, build_messages
from serve_apps.policy import build_app

TINY = REPO_ROOT / "fixtures" / "tiny-sft"
SIZES = {
    "10M": TinySpec(hidden_size=320, intermediate_size=1024, num_layers=8, num_heads=10, num_kv_heads=10),
    "100M": TinySpec(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, num_kv_heads=12),
    "500M": TinySpec(hidden_size=1280, intermediate_size=4096, num_layers=24, num_heads=20, num_kv_heads=20),
}  # fmt: skip
"""The language model grows; the vision tower stays tiny (it is <1% of a 7B VLM's bytes too)."""


# --------------------------------------------------------------------------- 1. step time


def rollout_samples(engine: HFEngine, cfg: Config, n: int) -> list[StepSample]:
    """`n` one-step samples as the rollouter would log them, answered by `engine`."""
    tasks = [t for t in load_tasks(split="train") if t.config.get("family") in cfg.env.families]
    env = MiniDeskEnv(cfg.env)
    p = cfg.policy
    sp = SamplingParams(p.temperature, p.top_p, p.max_new_tokens, top_k=p.top_k)
    shots, prompts = [], []
    for i in range(n):
        task = tasks[i % len(tasks)]
        shot = env.reset(task).screenshot
        msgs = build_messages(task.instruction, [Turn(shot)], p.history_images, p.history_turns)
        shots.append((task, shot))
        prompts.append(engine.prepare(GenerateRequest(tuple(msgs), sp), sp).encoded)
    gens = []
    for k in range(0, n, 8):
        chunk = prompts[k : k + 8]
        gens += engine.generate_sync(chunk, [sp] * len(chunk), 0)  # type: ignore[arg-type]
    samples: list[StepSample] = []
    for i, ((task, shot), g) in enumerate(zip(shots, gens, strict=True)):
        step = Step(
            step_idx=0,
            prompt_ids=g.prompt_ids,
            response_ids=g.response_ids,
            behaviour_logprobs=g.logprobs,
            weight_version=0,
            response_text=g.text,
            action=parse_response(g.text).action,
            screenshot=shot,
            entropy=g.entropy,
        )
        t = Trajectory(f"bench/{i}", "bench", task, (step,), float(i % 2), Status.OK)
        samples += split_steps(t, 1.0 if i % 2 else -1.0)
    return samples


def learner_for(cfg: Config, model: torch.nn.Module, proc: PolicyProcessor) -> Learner:
    t = cfg.train
    return Learner(
        model,
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=loss_settings(cfg),
        lr=t.lr,
        weight_decay=t.weight_decay,
        grad_clip=t.grad_clip,
        tokens_per_micro=t.tokens_per_rank,
        suppressed_ids=proc.suppressed_ids(cfg.policy.allow_special_tokens),
    )


def bench_steps(
    cfg: Config, batches: list[int], threads: list[int], repeats: int
) -> dict[str, Any]:
    engine = HFEngine(TINY)
    t0 = time.perf_counter()
    samples = rollout_samples(engine, cfg, max(batches))
    gen_s = time.perf_counter() - t0
    del engine
    proc = PolicyProcessor.from_dir(TINY)
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for b in batches:
            torch.manual_seed(0)
            model = load_model(TINY)
            learner = learner_for(cfg, model, proc)
            rb = to_record_batch(samples[:b])
            learner.step(rb)  # warm-up: first-call allocations, lazy initialisation
            times, collate_s, metrics = [], [], {}
            for _ in range(repeats):
                t = time.perf_counter()
                for mb in split_micro(rb, cfg.train.tokens_per_rank):
                    collate(mb, proc.image_processor, image_pad_id=proc.image_pad_id,
                            pad_id=proc.pad_id)  # fmt: skip
                collate_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                metrics = learner.step(rb)
                times.append(time.perf_counter() - t)
            step_s = statistics.median(times)
            tokens = batch_tokens(rb)
            rows.append(
                {
                    "threads": n_threads,
                    "batch": b,
                    "tokens": tokens,
                    "micro_batches": int(metrics["micro_batches"]),
                    "step_s": step_s,
                    "step_s_all": times,
                    "collate_s": statistics.median(collate_s),
                    "samples_per_s": b / step_s,
                    "tokens_per_s": tokens / step_s,
                }
            )
            console().log(f"step: {n_threads} thread(s), batch {b}: {step_s:.3f} s")
            del learner, model
            gc.collect()
    prompt = [len(s.prompt_ids) for s in samples]
    response = [len(s.response_ids) for s in samples]
    return {
        "model": str(TINY.relative_to(REPO_ROOT)),
        "params": num_parameters(load_model(TINY)),
        "sample_generation_s": gen_s,
        "prompt_tokens_mean": statistics.mean(prompt),
        "response_tokens_mean": statistics.mean(response),
        "images_per_sample": 1,
        "rows": rows,
    }


# --------------------------------------------------------------------------- 2. publication


def _fresh_engines(path: Path, n: int) -> float:
    """Seconds until `n` fresh processes (started together) have each built the engine."""
    code = f"from dart_ray.engines.hf import HFEngine; HFEngine({str(path)!r})"
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stderr=subprocess.PIPE)
        for _ in range(n)
    ]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"fresh engine failed: {err.decode()[-2000:]}")
    return time.perf_counter() - t0


def _checkpoint_restart(
    model: torch.nn.Module, model_dir: Path, out: Path, n: int
) -> dict[str, float]:
    """DART-GUI's path: write an HF checkpoint, restart `n` engines from it."""
    t = time.perf_counter()
    model.save_pretrained(out)  # type: ignore[attr-defined]
    save_s = time.perf_counter() - t
    for f in model_dir.iterdir():  # tokenizer and processor files travel with the checkpoint
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    restart_s = _fresh_engines(out, n)
    shutil.rmtree(out)
    return {"save_s": save_s, "restart_s": restart_s, "total_s": save_s + restart_s}


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def bench_publish(
    name: str, spec: TinySpec, replicas: int, repeats: int, ckpt_repeats: int, work: Path
) -> dict[str, Any]:
    model_dir = save_tiny_model(work / f"model-{name}", spec)
    model = load_model(model_dir)
    params = num_parameters(model)
    nbytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    app = f"bench-{name}"
    cfg = PolicyConfig(replicas=replicas, num_cpus=0.5)
    handle = serve.run(build_app(cfg, model_dir), name=app, route_prefix=None)
    phases: dict[str, list[float]] = {"gather": [], "put": [], "load": [], "total": []}
    first: dict[str, float] = {}
    base_mb = plasma_mb()
    held_mb: list[float] = []
    try:
        for version in range(1, repeats + 2):
            with torch.no_grad():  # a new version: what an optimizer step would leave
                for p in model.parameters():
                    p.add_(1e-3)
            t0 = time.perf_counter()
            state = full_state_dict(model)
            t1 = time.perf_counter()
            ref = ray.put(pack(state))
            t2 = time.perf_counter()
            report = handle.update_weights.remote(version, [ref]).result()
            t3 = time.perf_counter()
            if len(report.replicas) != replicas or set(report.replicas.values()) != {version}:
                raise RuntimeError(f"version {version} not on every replica: {report.replicas}")
            del ref, state
            gc.collect()
            time.sleep(1.0)  # what the registry holds once the publish has settled
            held_mb.append(plasma_mb() - base_mb)
            got = {"gather": t1 - t0, "put": t2 - t1, "load": t3 - t2, "total": t3 - t0}
            if version == 1:
                first = got
            else:
                for k, v in got.items():
                    phases[k].append(v)
    finally:
        serve.delete(app)
    gc.collect()
    ckpt = [
        _checkpoint_restart(model, model_dir, work / f"ckpt-{name}", replicas)
        for _ in range(ckpt_repeats)
    ]
    del model
    gc.collect()
    shutil.rmtree(model_dir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in phases.items()}
    ck = {k: statistics.median(c[k] for c in ckpt) for k in ("save_s", "restart_s", "total_s")}
    return {
        "size": name,
        "params": params,
        "bytes": nbytes,
        "replicas": replicas,
        "publish_s": med,
        "publish_s_all": phases,
        "first_publish_s": first,
        "checkpoint": ck,
        "checkpoint_all": ckpt,
        "checkpoint_over_publish": ck["total_s"] / med["total"],
        "object_store_held_mb": statistics.median(held_mb),
        "object_store_copies": statistics.median(held_mb) / (nbytes / 2**20),
    }


def plasma_mb() -> float:
    """Object store memory in use on this node, MiB (Ray's memory summary)."""
    from ray._private.internal_api import memory_summary

    m = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(stats_only=True))
    return float(m.group(1)) if m else float("nan")


# --------------------------------------------------------------------------- report


def render(results: dict[str, Any]) -> None:
    if "steps" in results:
        render_steps(results["steps"])
    if results["publish"]:
        render_publish(results["publish"])


def render_steps(st: dict[str, Any]) -> None:
    t = table(f"trainer step on CPU: {st['model']} ({st['params'] / 1e6:.2f}M params), "
              f"~{st['prompt_tokens_mean']:.0f} prompt + {st['response_tokens_mean']:.0f} "
              "response tokens and 1 screenshot per sample",
              ("threads", "batch", "tokens", "micro", "step s", "of which collate", "samples/s",
               "tokens/s"))  # fmt: skip
    for r in st["rows"]:
        t.add_row(str(r["threads"]), str(r["batch"]), str(r["tokens"]), str(r["micro_batches"]),
                  f"{r['step_s']:.3f}", f"{r['collate_s']:.3f}", f"{r['samples_per_s']:.1f}",
                  f"{r['tokens_per_s']:.0f}")  # fmt: skip
    console().print(t)


def render_publish(publish: list[dict[str, Any]]) -> None:
    w = table("weight publication, seconds (median; fp32; 2 HF replicas)",
              ("size", "MB", "gather", "put", "all replicas loaded", "total", "first publish",
               "ckpt save", "restart 2 engines", "ckpt total", "ckpt / publish",
               "object store held (copies)"))  # fmt: skip
    for r in publish:
        if "skipped" in r:
            w.add_row(r["size"], *["-"] * 10, r["skipped"])
            continue
        p, c = r["publish_s"], r["checkpoint"]
        w.add_row(f"{r['size']} ({r['params'] / 1e6:.0f}M)", f"{r['bytes'] / 2**20:.0f}",
                  f"{p['gather']:.4f}", f"{p['put']:.3f}", f"{p['load']:.3f}", f"{p['total']:.3f}",
                  f"{r['first_publish_s']['total']:.3f}", f"{c['save_s']:.2f}",
                  f"{c['restart_s']:.2f}", f"{c['total_s']:.2f}",
                  f"{r['checkpoint_over_publish']:.0f}x",
                  f"{r['object_store_held_mb']:.0f} MB ({r['object_store_copies']:.1f})")  # fmt: skip
    console().print(w)


def parse_args(argv: list[str] | None) -> Bench:
    p = parser(__doc__, "trainer")
    p.add_argument("--batches", default="8,16,32", help="samples per optimizer step")
    p.add_argument("--threads", default="1,2", help="torch threads for the step benchmark")
    p.add_argument("--step-repeats", type=int, default=3)
    p.add_argument("--sizes", default="10M,100M", help=f"of {','.join(SIZES)}")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed publications per size")
    p.add_argument("--ckpt-repeats", type=int, default=2)
    p.add_argument("--skip-steps", action="store_true")
    p.add_argument("--skip-publish", action="store_true")
    p.add_argument("--cold", action="store_true",
                   help="publish without warming the object store first (train.warm_object_store off)")  # fmt: skip
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "tiny-cpu.toml")
    return Bench.start(p, argv, f"{_available_bytes() / 2**30:.1f} GiB available")


def publish_sizes(args: argparse.Namespace, sizes: list[str], results: dict[str, Any]) -> None:
    """`bench_publish` for each size that fits in memory, on one local Ray and Serve."""
    # room for the version the replicas serve (they point into it), the one arriving and
    # a spare (a smaller store spills to disk and measures the disk); with --cold the store
    # touches its pages at start (the publisher's still fault)
    store = max(2**30, 3 * max(_spec_bytes(SIZES[s]) for s in sizes))
    work = Path(tempfile.mkdtemp(prefix="dart-ray-bench-trainer-"))
    with local_ray(object_store_bytes=store, serve=True, preallocate=args.cold):
        if not args.cold:  # as rank 0 does with train.warm_object_store
            results["object_store_warmed"] = asdict(warm_object_store())
        try:
            for s in sizes:
                # besides the store (allocated at start): the trainer's model, 2 replicas
                # before their first publish, 2 restarted engines, the model being built
                need = 5 * _spec_bytes(SIZES[s])
                if _available_bytes() < need:
                    have = _available_bytes() / 2**30
                    why = f"skipped: needs ~{need / 2**30:.0f} GiB, {have:.0f} GiB available"
                    console().log(f"{s}: {why}")
                    results["publish"].append({"size": s, "skipped": why})
                    continue
                console().log(f"publish: {s}")
                results["publish"].append(
                    bench_publish(s, SIZES[s], args.replicas, args.repeats, args.ckpt_repeats, work)
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    bench = parse_args(argv)
    args = bench.args
    cfg = load_config(args.config)
    results: dict[str, Any] = {**bench.meta, "torch": torch.__version__}
    if not args.skip_steps:
        batches = [int(b) for b in args.batches.split(",")]
        threads = [int(t) for t in args.threads.split(",")]
        results["steps"] = bench_steps(cfg, batches, threads, args.step_repeats)
        torch.set_num_threads(os.cpu_count() or 1)
    sizes = [] if args.skip_publish else [s.strip() for s in args.sizes.split(",")]
    results["publish"] = []
    if sizes:
        publish_sizes(args, sizes, results)
    render(results)
    bench.write(results)
    return 0


def _spec_bytes(spec: TinySpec, vocab: int = 1100) -> int:
    """fp32 bytes of a TinySpec model, from its dimensions (before building it)."""
    h, i, n = spec.hidden_size, spec.intermediate_size, spec.num_layers
    kv = h // spec.num_heads * spec.num_kv_heads
    layer = h * (h + 2 * kv + h) + 3 * h * i
    return 4 * (n * layer + 2 * vocab * h)


if __name__ == "__main__":
    sys.exit(main())

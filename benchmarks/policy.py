"""Benchmark the policy server: actions/s with and without batching, and weight-update cost.

    .venv/bin/python benchmarks/policy.py            # full run (about 10 minutes on 2 cores)
    .venv/bin/python benchmarks/policy.py --quick    # smaller sizes, shorter windows

1. Actions/s at 1, 8 and 32 concurrent clients through a real Serve handle, one replica on one
   CPU, the tiny model on a 320x240 screenshot with UI-TARS's pixel budget (108 image tokens),
   64 sampled tokens per action (policy.max_new_tokens); batched (the server's `Batcher`, up to 32) against unbatched
   (max_batch_size 1: concurrent requests still overlap, each with its own forward passes).
2. Weight update latency against model size (~10M, ~100M, ~500M parameters, fp32) for
   - the object-store path: `ray.put(pack(state_dict))` + `update_weights` through Serve to a
     running replica, which loads in place (what dart-ray does), with `weights_load=share`
     (parameters point at the object-store memory) and `copy` (copied into the model);
   - a plain `ray.put` of the dict of torch tensors, fetched and loaded the same way;
   - the DART-GUI path: save an HF checkpoint, then a fresh process builds the engine from it;
   - the memory-copy floor: one `copy_` of the same bytes into a preallocated state dict.
Prints a table and writes JSON to benchmarks/results/policy.json.
"""

from __future__ import annotations

import asyncio
import gc
import shutil
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

from dart_ray.config import PolicyConfig
from dart_ray.engines.base import GenerateRequest, SamplingParams
from dart_ray.models.loading import load_model
from dart_ray.models.tiny import TinySpec, save_tiny_model
from dart_ray.models.weights import load_into, pack, unpack, warm_object_store
from dart_ray.uitars.prompts import Turn, build_messages
from serve_apps.policy import build_app

SIZES = {
    "10M": TinySpec(hidden_size=320, intermediate_size=1024, num_layers=8, num_heads=10, num_kv_heads=10),
    "100M": TinySpec(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, num_kv_heads=12),
    "500M": TinySpec(hidden_size=1280, intermediate_size=4096, num_layers=24, num_heads=20, num_kv_heads=20),
    "1B": TinySpec(hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=16, num_kv_heads=4),
}  # fmt: skip


SIZE_GB = {"10M": 0.05, "100M": 0.45, "500M": 2.1, "1B": 2.1}
"""Weights of each size as published (1B in bf16: fp32 would not fit this machine three
times over), for sizing the object store."""
BF16 = {"1B"}


def _screenshot() -> bytes:
    import io

    from PIL import Image, ImageDraw

    im = Image.new("RGB", (320, 240), (235, 235, 240))
    d = ImageDraw.Draw(im)
    for i in range(4):
        d.rectangle((20 + 70 * i, 180, 70 + 70 * i, 210), fill=(40 * i, 120, 200 - 40 * i))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- throughput


async def _clients(
    handle: Any, n: int, seconds: float, req: GenerateRequest
) -> tuple[int, float, float]:
    """(actions, seconds, mean batch size the engine ran them in)."""
    sizes: list[int] = []
    end = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < end:
            sizes.append((await handle.generate.remote(req)).batch_size)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n)))
    return len(sizes), time.perf_counter() - t0, sum(sizes) / max(len(sizes), 1)


def bench_engine(
    model_dir: Path, batches: list[int], tokens: int, repeats: int = 3
) -> list[dict[str, Any]]:
    """The engine alone, in this process on one thread: what batching buys without Serve
    (median of `repeats` after a warm-up)."""
    from dart_ray.engines.hf import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine(model_dir)
    sp = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    req = GenerateRequest(tuple(build_messages("click the blue button", [Turn(_screenshot())])), sp)
    rows = []
    for n in batches:
        encoded = [engine.prepare(req, sp).encoded for _ in range(n)]  # distinct preprocessing
        engine.generate_sync(encoded, [sp] * n, 0)  # type: ignore[arg-type]
        walls = []
        for _ in range(repeats):
            t = time.perf_counter()
            engine.generate_sync(encoded, [sp] * n, 0)  # type: ignore[arg-type]
            walls.append(time.perf_counter() - t)
        wall = _median(walls)
        rows.append({"batch": n, "seconds": wall, "actions_per_s": n / wall,
                     "min_s": min(walls), "max_s": max(walls)})  # fmt: skip
    return rows


def bench_throughput(
    model_dir: Path, clients: list[int], seconds: float, tokens: int
) -> list[dict[str, Any]]:
    sp = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    req = GenerateRequest(tuple(build_messages("click the blue button", [Turn(_screenshot())])), sp)
    rows = []
    for batched in (False, True):
        cfg = PolicyConfig(num_cpus=1, max_batch_size=32 if batched else 1, batch_wait_ms=10)
        handle = serve.run(build_app(cfg, model_dir), name="bench", route_prefix=None)
        handle.generate.remote(req).result()  # warm up
        for n in clients:
            done, wall, mean_batch = asyncio.run(_clients(handle, n, seconds, req))
            rows.append({"batched": batched, "clients": n, "actions": done, "seconds": wall,
                         "actions_per_s": done / wall, "mean_batch": mean_batch})  # fmt: skip
        serve.delete("bench")
    return rows


# --------------------------------------------------------------------------- weights


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _fresh_engine_seconds(path: Path, dtype: torch.dtype = torch.float32) -> float:
    code = (
        "import time; t = time.perf_counter(); import torch; "
        f"from dart_ray.engines.hf import HFEngine; HFEngine({str(path)!r}, dtype={dtype}); "
        "print(time.perf_counter() - t)"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=REPO_ROOT)
    return time.perf_counter() - t0


def bench_weights(name: str, spec: TinySpec, repeats: int, naive: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"dart-ray-bench-{name}-"))
    try:
        model_dir = save_tiny_model(work / "model", spec)
        model = load_model(model_dir)
        dtype = torch.bfloat16 if name in BF16 else torch.float32
        sd = {k: (v + 0.01).to(dtype) for k, v in model.state_dict().items()}
        del model
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        params = sum(v.numel() for v in sd.values())

        dst = {k: torch.empty_like(v) for k, v in sd.items()}
        for k, v in sd.items():  # first touch of the pages is not part of a copy
            dst[k].copy_(v)
        floor = []
        for _ in range(max(5, repeats)):
            t = time.perf_counter()
            for k, v in sd.items():
                dst[k].copy_(v)
            floor.append(time.perf_counter() - t)
        del dst

        store: dict[str, list[float]] = {"share": [], "copy": []}
        first: dict[str, list[float]] = {}
        put_s = []
        for mode, times in store.items():
            cfg = PolicyConfig(num_cpus=1, weights_load=mode,  # type: ignore[arg-type]
                               dtype="bfloat16" if name in BF16 else "float32")  # fmt: skip
            handle = serve.run(build_app(cfg, model_dir), name="bench-w", route_prefix=None)
            for i in range(repeats + 1):  # the first maps the object store into the replica
                t = time.perf_counter()
                ref = ray.put(pack(sd))
                put_s.append(time.perf_counter() - t)
                handle.update_weights.remote(i + 1, [ref]).result()
                (times if i else first.setdefault(mode, [])).append(time.perf_counter() - t)
                del ref
            serve.delete("bench-w")
            gc.collect()

        naive_s: list[float] = []
        if naive:  # the same load, but the tensors pickled as torch tensors
            model = load_model(model_dir)
            for _ in range(repeats):
                t = time.perf_counter()
                got = ray.get(ray.put(sd))
                model.load_state_dict(got)
                naive_s.append(time.perf_counter() - t)
                del got
            del model
            gc.collect()

        ckpt = []
        for _ in range(max(1, repeats - 1)):
            model = load_model(model_dir, dtype=dtype)
            load_into(model, pack(sd))
            out = work / "ckpt"
            t = time.perf_counter()
            model.save_pretrained(out)
            saved = time.perf_counter() - t
            for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                      "preprocessor_config.json"):  # fmt: skip
                if (model_dir / f).exists():
                    shutil.copy(model_dir / f, out / f)
            del model
            ckpt.append(saved + _fresh_engine_seconds(out, dtype))
            shutil.rmtree(out)
        row = {
            "size": name,
            "params": params,
            "bytes": nbytes,
            "floor_s": min(floor),  # the floor: the best of 5 warm copies
            "object_store_s": _median(store["share"]),
            "object_store_copy_s": _median(store["copy"]),
            "first_update_s": {k: v[0] for k, v in first.items()},
            "put_s": _median(put_s),
            "naive_put_get_s": _median(naive_s) if naive_s else None,
            "checkpoint_restart_s": _median(ckpt),
        }
        row["vs_floor"] = row["object_store_s"] / row["floor_s"]
        row["copy_vs_floor"] = row["object_store_copy_s"] / row["floor_s"]
        row["checkpoint_over_store"] = row["checkpoint_restart_s"] / row["object_store_s"]
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_unpack_is_zero_copy() -> bool:
    t = torch.randn(1024)
    got = ray.get(ray.put(pack({"w": t})))
    a = dict(unpack(got))["w"]
    b = dict(unpack(got))["w"]
    return a.data_ptr() == b.data_ptr() and torch.equal(a, t)


def main() -> None:
    ap = parser(__doc__, "policy")
    ap.add_argument("--quick", action="store_true", help="10M and 100M only, 5 s windows")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--sizes", default=None, help="comma list of 10M,100M,500M,1B (1B in bf16)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-weights", action="store_true", help="throughput only")
    ap.add_argument("--skip-throughput", action="store_true", help="weight updates only")
    ap.add_argument("--object-store-gb", type=float, default=None,
                    help="default: 3 copies of the largest model, 0.5 without weight updates")  # fmt: skip
    ap.add_argument("--cold", action="store_true",
                    help="publish without warming the object store first (train.warm_object_store off)")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=64, help="tokens per action (policy default)")
    bench = Bench.start(ap)
    args = bench.args
    sizes = (args.sizes or ("10M,100M" if args.quick else "10M,100M,500M")).split(",")
    seconds = 5.0 if args.quick else args.seconds

    # Room for three versions of the largest model: the one served, the one arriving, and one
    # in flight; a smaller store spills to disk and measures the disk instead.
    # With --cold, the store touches its pages once at start (`local_ray`'s preallocate);
    # otherwise the publisher warms the store itself (warm_object_store), which also maps its
    # pages into this process.
    gb = args.object_store_gb
    if gb is None:
        gb = 0.5 if args.skip_weights else 3 * max(SIZE_GB[s] for s in sizes) + 0.5
    with local_ray(object_store_bytes=int(gb * 2**30), serve=True, preallocate=args.cold):
        tmp = Path(tempfile.mkdtemp(prefix="dart-ray-bench-tiny-"))
        tiny = save_tiny_model(tmp / "tiny")  # UI-TARS pixel budget: 320x240 -> 108 tokens
        clients = [] if args.skip_throughput else [int(c) for c in args.clients.split(",")]
        tp = bench_throughput(tiny, clients, seconds, args.tokens) if clients else []
        eng = bench_engine(tiny, clients, args.tokens) if clients else []
        shutil.rmtree(tmp, ignore_errors=True)
        warmed = None
        if not args.skip_weights and not args.cold:  # as the trainer does (train.warm_object_store)
            warmed = asdict(warm_object_store())
            console().log(f"warmed the object store: {warmed}")
        ws = (
            []
            if args.skip_weights
            else [
                bench_weights(s, SIZES[s], args.repeats, naive=s in ("10M", "100M")) for s in sizes
            ]
        )
        zero_copy = check_unpack_is_zero_copy()

    t = table(f"actions/s (tiny model, {args.tokens} tokens/action, 1 replica of 1 CPU), "
              "through Serve and the engine alone (no Serve, no preprocessing, one thread)",
              ("clients", "Serve unbatched", "Serve batched", "mean batch", "speed-up",
               "engine batch 1", "engine batch n", "engine speed-up", "Serve batched / engine"))  # fmt: skip
    e1 = next((r["actions_per_s"] for r in eng if r["batch"] == 1), float("nan"))
    for n in sorted({r["clients"] for r in tp}):
        u = next(r for r in tp if r["clients"] == n and not r["batched"])["actions_per_s"]
        row = next(r for r in tp if r["clients"] == n and r["batched"])
        b = row["actions_per_s"]
        en = next(r["actions_per_s"] for r in eng if r["batch"] == n)
        t.add_row(str(n), f"{u:.1f}", f"{b:.1f}", f"{row['mean_batch']:.1f}", f"{b / u:.2f}x",
                  f"{e1:.1f}", f"{en:.1f}", f"{en / e1:.2f}x", f"{b / en:.0%}")  # fmt: skip
    console().print(t)
    w = table("weight update latency, seconds (fp32, median of repeats)",
              ("size", "MB", "floor", "store share", "/floor", "store copy", "/floor",
               "pickled", "ckpt+restart", "ckpt/share"))  # fmt: skip
    for r in ws:
        naive = f"{r['naive_put_get_s']:.3f}" if r["naive_put_get_s"] is not None else "skipped"
        w.add_row(f"{r['size']} ({r['params'] / 1e6:.0f}M)", f"{r['bytes'] / 2**20:.0f}",
                  f"{r['floor_s']:.3f}", f"{r['object_store_s']:.3f}", f"{r['vs_floor']:.1f}x",
                  f"{r['object_store_copy_s']:.3f}", f"{r['copy_vs_floor']:.1f}x", naive,
                  f"{r['checkpoint_restart_s']:.2f}",
                  f"{r['checkpoint_over_store']:.0f}x")  # fmt: skip
    console().print(w)
    bench.write(
        {
            "tokens_per_action": args.tokens,
            "throughput": tp,
            "engine_only": eng,
            "weights": ws,
            "unpack_zero_copy": zero_copy,
            "object_store_warmed": warmed,
        }
    )


if __name__ == "__main__":
    main()

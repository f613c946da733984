"""Weight load into a policy's parameters on its device: the last leg of a weight sync.

    python benchmarks/weight_load.py --device cuda --sizes 1B,7B [--repeats 5]
    .venv/bin/python benchmarks/weight_load.py --device cpu --sizes 10M   (a dry run)

A publication arrives as packed bytes in host memory (the object store's, pageable; see
dart_ray/models/weights.py). This measures, on bf16 decoder-LM-shaped weights of 1B and 7B
parameters (Qwen2-7B's shapes for 7B):

- `load_into`: the path replicas take today, `param.copy_(host view)` per tensor (on CUDA:
  pageable host -> device, synchronous, one tensor at a time);
- `load_into_staged`: host -> two reused pinned buffers -> device on a side stream, the two
  copies overlapping (CUDA only);
- floors, in the same run: one pinned host -> device copy of all the bytes at once (the
  link's speed: what any load must at least take) and a device -> device copy (memory).

Medians of `--repeats`, with min and max; ratio to the pinned floor. Only torch, numpy and
dart_ray.models.weights are needed (no Ray), so it runs on a bare GPU machine. Writes JSON
(`--out`, default benchmarks/results/weight_load.json) and prints a table.
"""

from __future__ import annotations

import platform
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
from harness import Bench, parser, timed

from dart_ray.models.weights import load_into, load_into_staged, pack

# hidden, intermediate, layers, heads, kv heads, vocab (Qwen2-like decoder; tied = False)
SHAPES = {
    "10M": (256, 688, 4, 4, 4, 8192),
    "100M": (768, 2048, 12, 12, 4, 32000),
    "1B": (2048, 5632, 22, 16, 4, 32000),
    "7B": (3584, 18944, 28, 28, 4, 152064),
}


class Decoder(torch.nn.Module):
    """Parameters shaped like a decoder LM's (no forward: only the bytes matter here)."""

    def __init__(self, size: str, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        h, inter, layers, heads, kv, vocab = SHAPES[size]
        head = h // heads

        def p(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device))

        self.embed = p(vocab, h)
        self.lm_head = p(vocab, h)
        self.norm = p(h)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            layer = torch.nn.Module()
            for name, shape in (
                ("q", (heads * head, h)), ("k", (kv * head, h)), ("v", (kv * head, h)),
                ("o", (h, heads * head)), ("gate", (inter, h)), ("up", (inter, h)),
                ("down", (h, inter)), ("ln1", (h,)), ("ln2", (h,)),
            ):  # fmt: skip
                layer.register_parameter(name, p(*shape))
            self.layers.append(layer)


def spread(fn: Callable[[], object], device: str, repeats: int) -> dict[str, float]:
    """Median, min and max seconds of `fn` after a warm-up (allocations, CUDA context, pinned
    pool), each timed until the device is done."""
    xs = timed(fn, repeats, sync=torch.cuda.synchronize if device == "cuda" else None)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run_size(size: str, device: str, repeats: int, dtype: torch.dtype) -> dict[str, Any]:
    if device == "cuda":
        torch.cuda.empty_cache()  # the previous size's weights
    model = Decoder(size, dtype, device)
    source = {
        k: torch.empty(v.shape, dtype=dtype).uniform_(-1, 1) for k, v in model.state_dict().items()
    }
    packed = pack(source)
    nbytes = packed.nbytes
    out: dict[str, Any] = {"size": size, "params": sum(v.numel() for v in source.values())}
    out["bytes"] = nbytes
    out["load_into"] = spread(lambda: load_into(model, packed), device, repeats)
    check = ["embed", "layers.0.q", "lm_head"]
    if device == "cuda":
        out["load_into_staged"] = spread(lambda: load_into_staged(model, packed), device, repeats)
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dev2 = torch.empty_like(dev)
        out["floor_pinned_h2d"] = spread(
            lambda: dev.copy_(host, non_blocking=True), device, repeats
        )
        out["floor_d2d"] = spread(lambda: dev2.copy_(dev), device, repeats)
        del host, dev, dev2
    else:
        flat = torch.empty(nbytes, dtype=torch.uint8)
        flat2 = torch.empty_like(flat)
        out["floor_host_memcpy"] = spread(lambda: flat2.copy_(flat), device, repeats)
    state = model.state_dict()
    out["exact"] = all(torch.equal(state[k].cpu(), source[k]) for k in check)
    floor = out.get("floor_pinned_h2d", out.get("floor_host_memcpy"))["median"]
    for k in ("load_into", "load_into_staged"):
        if k in out:
            out[k]["x_floor"] = out[k]["median"] / floor
            out[k]["GB_per_s"] = nbytes / out[k]["median"] / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "weight_load")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="1B,7B", help=f"of {','.join(SHAPES)}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16")
    bench = Bench.start(ap, argv)
    a = bench.args
    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "--device cuda: no CUDA device here (use --device cpu for a dry run)", file=sys.stderr
        )
        return 2
    dtype = getattr(torch, a.dtype)
    rows = [run_size(s, a.device, a.repeats, dtype) for s in a.sizes.split(",")]
    meta = {
        "device": torch.cuda.get_device_name(0)
        if a.device == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": a.dtype,
        "repeats": a.repeats,
    }
    print(
        f"weight load on {meta['device']} ({a.dtype}, median of {a.repeats}; x floor = / the floor)"
    )
    print(
        f"{'size':>5} {'GB':>7} {'path':<22} {'median s':>9} {'min':>8} {'max':>8} {'x floor':>8}"
    )
    for r in rows:
        for k in (
            "load_into",
            "load_into_staged",
            "floor_pinned_h2d",
            "floor_d2d",
            "floor_host_memcpy",
        ):
            if k in r:
                t = r[k]
                x = f"{t['x_floor']:.2f}" if "x_floor" in t else "-"
                print(f"{r['size']:>5} {r['bytes'] / 1e9:7.2f} {k:<22} {t['median']:9.4f} "
                      f"{t['min']:8.4f} {t['max']:8.4f} {x:>8}")  # fmt: skip
    bench.write({"meta": meta, "results": rows})
    for r in rows:
        if not r["exact"]:
            print(f"{r['size']}: the loaded weights differ from the source", file=sys.stderr)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Publish bytes and latency, full weights against a LoRA adapter, through the object store.

    .venv/bin/python benchmarks/publish.py                        # 10M, 100M, 1B and the 7B model
    .venv/bin/python benchmarks/publish.py --sizes 10M --repeats 2   # a smoke run

What a weight publication moves when the trainer trains the whole model and when it trains
only a LoRA adapter (issue 32), measured on real tensors for decoder LMs of 10M, 100M and 1B
parameters (Qwen2-shaped: `q_proj` ... `down_proj` as `nn.Linear`s, the shapes of
`benchmarks/weight_load.py`), bf16 by default, both paths in the same run:

- **full**: the model's whole state dict, as `dart_ray/train/worker.py` publishes it today;
- **adapter**: `dart_ray.models.lora.adapter_state` of the same model with LoRA layers
  injected by `lora.add_adapters` (the trainer's own call: rank `--rank`, alpha `--alpha`,
  target modules q, k, v, o, gate, up, down), what a `train.lora` trainer publishes, in the
  model's dtype.

Each goes dart-ray's way (`dart_ray/models/weights.py`): the publisher `ray.put(pack(state))`
once (into a warmed object store, as rank 0 does with `train.warm_object_store`), and a replica
(a Ray actor holding the same model and the same LoRA-wrapped model, as an engine would) gets
the object and loads it into its parameters in place: `load_into` for the full weights,
`load_packed_adapter` (what the transformers engine runs) for the adapter. Timed: the put in the publisher, the get and
the load inside the replica, and publish end to end (put + the actor call until it has
loaded) from the publisher. Median of `--repeats` versions after one warm-up version; every
version is checked (the replica's tensors equal the publisher's). Not in these figures: the
Serve round trip of `update_weights` (20-30 ms, docs/BENCHMARKS.md "Publish at memory speed")
and the copy to a GPU.

At 7B the bytes come from the configuration of UI-TARS-1.5-7B (Qwen2.5-VL-7B: the model built
on the meta device, wrapped by peft with the same LoRA config, the language model's modules
only and with the vision tower's as well), and the latency from the timing model
(`timing.weight_load_s` for the full weights, `dart_ray/config/timing.py`) and a line fitted
to this run's measured publishes (fixed cost + bytes / rate) for both.

Prints a table and the command, writes JSON to benchmarks/results/publish.json.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

import numpy as np
import ray
import torch
from harness import Bench, console, local_ray, parser, table

from dart_ray.config.timing import TimingConfig
from dart_ray.models import lora
from dart_ray.models.weights import (
    PackedWeights,
    load_into,
    load_packed_adapter,
    pack,
    warm_object_store,
)

# hidden, intermediate, layers, heads, kv heads, vocab (benchmarks/weight_load.py's; 10M: 8 layers)
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "1M": (64, 172, 2, 4, 4, 1024),  # the smoke test's
    "10M": (256, 688, 8, 4, 4, 8192),
    "100M": (768, 2048, 12, 12, 4, 32000),
    "1B": (2048, 5632, 22, 16, 4, 32000),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# UI-TARS-1.5-7B = Qwen2.5-VL-7B-Instruct's config.json (the parts that shape the weights)
QWEN25_VL_7B_TEXT = dict(
    hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
)  # fmt: skip
QWEN25_VL_7B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
)  # fmt: skip
LM_ONLY = r".*language_model.*\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
VISION = r".*visual\.blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(gate|up|down)_proj)"
WITH_VISION = f"({LM_ONLY})|({VISION})"


class Decoder(torch.nn.Module):
    """A decoder LM's parameters under Qwen2's names (no forward: the bytes and the module
    names peft targets are what a publish sees), filled with random values."""

    def __init__(self, size: str, dtype: torch.dtype, seed: int = 0) -> None:
        super().__init__()
        h, inter, layers, heads, kv, vocab = SHAPES[size]
        head = h // heads
        with torch.device("meta"):
            self.embed_tokens = torch.nn.Embedding(vocab, h, dtype=dtype)
            self.layers = torch.nn.ModuleList()
            for _ in range(layers):
                layer = torch.nn.Module()
                attn, mlp = torch.nn.Module(), torch.nn.Module()
                for m, name, i, o in (
                    (attn, "q_proj", h, heads * head), (attn, "k_proj", h, kv * head),
                    (attn, "v_proj", h, kv * head), (attn, "o_proj", heads * head, h),
                    (mlp, "gate_proj", h, inter), (mlp, "up_proj", h, inter),
                    (mlp, "down_proj", inter, h),
                ):  # fmt: skip
                    m.add_module(name, torch.nn.Linear(i, o, bias=name in ("q_proj", "k_proj", "v_proj"), dtype=dtype))  # fmt: skip
                layer.self_attn, layer.mlp = attn, mlp
                layer.input_layernorm = torch.nn.LayerNorm(h, bias=False, dtype=dtype)
                layer.post_attention_layernorm = torch.nn.LayerNorm(h, bias=False, dtype=dtype)
                self.layers.append(layer)
            self.norm = torch.nn.LayerNorm(h, bias=False, dtype=dtype)
            self.lm_head = torch.nn.Linear(h, vocab, bias=False, dtype=dtype)
        self.to_empty(device="cpu")
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():  # real bytes: every page written
                p.uniform_(-0.05, 0.05, generator=g)


def lora_config(rank: int, alpha: int, targets: list[str] | str) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets)


def spec(rank: int, alpha: int) -> lora.AdapterSpec:
    return lora.AdapterSpec(rank, float(alpha), tuple(TARGETS))


def with_lora(model: torch.nn.Module, rank: int, alpha: int) -> torch.nn.Module:
    """`model` with dart-ray's LoRA layers injected in place (`dart_ray.models.lora`, the
    trainer's own call; adapters in the model's dtype), B made non-zero as after training."""
    lora.add_adapters(model, spec(rank, alpha))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if lora.is_adapter(n) and ".lora_B." in n:
                p.uniform_(-0.01, 0.01)
    return model


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@ray.remote(num_cpus=0)
class Replica:
    """A policy replica's parameters: the full model and a LoRA-wrapped copy of the same shape."""

    def __init__(self, size: str, dtype: str, rank: int, alpha: int) -> None:
        torch.set_num_threads(1)
        self.full = Decoder(size, getattr(torch, dtype), seed=1)
        self.lora = with_lora(Decoder(size, getattr(torch, dtype), seed=2), rank, alpha)

    def load(self, kind: str, refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Get the version from the object store and load it in place; seconds of each."""
        t0 = time.perf_counter()
        packed: PackedWeights = ray.get(refs[0])
        t1 = time.perf_counter()
        if kind == "full":
            load_into(self.full, packed)
        else:
            load_packed_adapter(self.lora, packed)  # what the transformers engine runs
        t2 = time.perf_counter()
        del packed
        return {"get": t1 - t0, "load": t2 - t1}

    def digest(self, kind: str) -> float:
        """A checksum of what was loaded (the parameters the publish writes)."""
        state = self.full.state_dict() if kind == "full" else lora.adapter_state(self.lora)
        return float(sum(t.float().sum() for t in state.values()))


def bench_size(
    size: str, dtype: torch.dtype, rank: int, alpha: int, repeats: int
) -> dict[str, Any]:
    model = Decoder(size, dtype)
    full = dict(model.state_dict())  # views of the parameters, as with one unsharded rank
    params = sum(t.numel() for t in full.values())
    wrapped = with_lora(model, rank, alpha)
    replica = Replica.remote(size, str(dtype).removeprefix("torch."), rank, alpha)  # type: ignore[attr-defined]
    out: dict[str, Any] = {"size": size, "params": params, "dtype": str(dtype)}
    for kind in ("full", "adapter"):
        phases: dict[str, list[float]] = {"put": [], "get": [], "load": [], "total": []}
        exact = True
        for version in range(repeats + 1):
            with torch.no_grad():  # a new version, as an optimizer step leaves one
                for n, p in wrapped.named_parameters():
                    if ("lora_" in n) == (kind == "adapter"):
                        p.add_(1e-3)
            state = full if kind == "full" else lora.adapter_state(wrapped)
            t0 = time.perf_counter()
            ref = ray.put(pack(state, None if kind == "full" else spec(rank, alpha)))
            t1 = time.perf_counter()
            inner = ray.get(replica.load.remote(kind, [ref]))
            t2 = time.perf_counter()
            want = float(sum(t.float().sum() for t in state.values()))
            got = ray.get(replica.digest.remote(kind))
            exact &= abs(got - want) <= 1e-6 * max(1.0, abs(want))
            del ref
            if version:  # version 0: the warm-up (first mapping of the object in the replica)
                for k, v in {"put": t1 - t0, **inner, "total": t2 - t0}.items():
                    phases[k].append(v)
        out[kind] = {
            "bytes": nbytes(state),
            "params": sum(t.numel() for t in state.values()),
            "tensors": len(state),
            "median_s": {k: statistics.median(v) for k, v in phases.items()},
            "all_s": phases,
            "exact": exact,
        }
        console().log(f"{size} {kind}: {nbytes(state) / 1e6:.1f} MB, "
                      f"{out[kind]['median_s']['total']:.4f} s")  # fmt: skip
    ray.kill(replica)
    del wrapped, model, full
    gc.collect()
    f, a = out["full"], out["adapter"]
    out["bytes_ratio"] = f["bytes"] / a["bytes"]
    out["latency_ratio"] = f["median_s"]["total"] / a["median_s"]["total"]
    return out


def seven_b(rank: int, alpha: int, dtype_bytes: int = 2) -> dict[str, Any]:
    """Bytes of UI-TARS-1.5-7B's full weights and of its LoRA adapter, from the config: the
    model built on the meta device (no memory), wrapped by peft, its adapter state dict
    counted. With the language model's modules only, and with the vision tower's too."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(text_config=QWEN25_VL_7B_TEXT, vision_config=QWEN25_VL_7B_VISION,
                              tie_word_embeddings=False)  # fmt: skip
    out: dict[str, Any] = {"model": "UI-TARS-1.5-7B (Qwen2.5-VL-7B)", "dtype_bytes": dtype_bytes}
    for name, targets in (("adapter_lm", LM_ONLY), ("adapter_lm_vision", WITH_VISION)):
        with torch.device("meta"):
            model = Qwen2_5_VLForConditionalGeneration(config)
        params = sum(p.numel() for p in model.parameters())
        vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
        out["full"] = {"params": params, "vision_params": vision, "bytes": params * dtype_bytes}
        wrapped = get_peft_model(
            model, lora_config(rank, alpha, targets), autocast_adapter_dtype=False
        )
        state = get_peft_model_state_dict(wrapped)
        n = sum(t.numel() for t in state.values())
        modules = len([k for k in state if "lora_A" in k])
        out[name] = {"params": n, "bytes": n * dtype_bytes, "modules": modules,
                     "target_modules": targets}  # fmt: skip
        del wrapped, model
    return out


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares of publish seconds (median, end to end) on bytes over every measured
    publish: fixed seconds + bytes / rate."""
    xs = [r[k]["bytes"] for r in rows for k in ("full", "adapter")]
    ys = [r[k]["median_s"]["total"] for r in rows for k in ("full", "adapter")]
    if len(set(xs)) < 2:
        return {"fixed_s": float("nan"), "GB_per_s": float("nan")}
    slope, fixed = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
    return {"fixed_s": float(max(fixed, 0.0)), "GB_per_s": float(1e-9 / slope)}


def render(res: dict[str, Any]) -> None:
    t = table(f"publish through the object store: full weights vs LoRA adapter (rank "
              f"{res['rank']}, alpha {res['alpha']}, q,k,v,o,gate,up,down; {res['dtype']}; "
              f"median of {res['repeats']})",
              ("size", "full MB", "adapter MB", "bytes full / adapter", "full put", "full get",
               "full load", "full total s", "adapter put", "adapter get", "adapter load",
               "adapter total s", "latency full / adapter"), left={"size"})  # fmt: skip
    for r in res["sizes"]:
        f, a = r["full"], r["adapter"]
        fm, am = f["median_s"], a["median_s"]
        t.add_row(f"{r['size']} ({r['params'] / 1e6:.0f}M)", f"{f['bytes'] / 1e6:.1f}",
                  f"{a['bytes'] / 1e6:.2f}", f"{r['bytes_ratio']:.0f}x", f"{fm['put']:.4f}",
                  f"{fm['get']:.4f}", f"{fm['load']:.4f}", f"{fm['total']:.4f}",
                  f"{am['put']:.4f}", f"{am['get']:.4f}", f"{am['load']:.4f}",
                  f"{am['total']:.4f}", f"{r['latency_ratio']:.1f}x")  # fmt: skip
    console().print(t)
    s = res.get("7B")
    if s:
        fit = res["fit"]
        m = table(f"7B: {s['model']}, bf16; bytes from the config; fit s: this run's line "
                  f"({fit['fixed_s'] * 1e3:.1f} ms + bytes / {fit['GB_per_s']:.2f} GB/s); timing "
                  "model s: the fixed cost + bytes at timing.weight_load_s's rate (16.6 GB in 2.5 s)",
                  ("what", "params", "GB", "full / this", "fit s", "timing model s"),
                  left={"what"})  # fmt: skip
        for k, label in (("full", "full weights"), ("adapter_lm", "adapter, language model"),
                         ("adapter_lm_vision", "adapter, LM + vision tower")):  # fmt: skip
            v = s[k]
            m.add_row(label, f"{v['params'] / 1e6:,.1f}M", f"{v['bytes'] / 1e9:.3f}",
                      f"{s['full']['bytes'] / v['bytes']:.0f}x", f"{v['fit_s']:.3f}",
                      f"{v['timing_s']:.3f}")  # fmt: skip
        console().print(m)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "publish")
    p.add_argument("--sizes", default="10M,100M,1B", help=f"of {','.join(SHAPES)}")
    p.add_argument("--repeats", type=int, default=5, help="timed versions per size and kind")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--alpha", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--skip-7b", action="store_true", help="leave out the 7B bytes (transformers)")
    bench = Bench.start(p, argv)
    a = bench.args
    dtype = getattr(torch, a.dtype)
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    biggest = max(decoder_bytes(s, dtype) for s in sizes)
    store = max(2**30, 3 * biggest)  # the version held, the one arriving and a spare
    torch.set_num_threads(1)
    res: dict[str, Any] = {"rank": a.rank, "alpha": a.alpha, "dtype": a.dtype,
                           "repeats": a.repeats, "targets": TARGETS, "torch": torch.__version__}  # fmt: skip
    with local_ray(object_store_bytes=store):
        w = warm_object_store()
        res["object_store_warmed"] = {"bytes": w.bytes, "seconds": w.seconds}
        res["sizes"] = [bench_size(s, dtype, a.rank, a.alpha, a.repeats) for s in sizes]
    res["fit"] = fit(res["sizes"])
    if not a.skip_7b:
        s = seven_b(a.rank, a.alpha)
        weight_load_s = TimingConfig().weight_load_s
        for k in ("full", "adapter_lm", "adapter_lm_vision"):
            s[k]["fit_s"] = res["fit"]["fixed_s"] + s[k]["bytes"] / 1e9 / res["fit"]["GB_per_s"]
            # the timing model's rate (weight_load_s for the full bytes) + this run's fixed cost
            rate_s = weight_load_s * s[k]["bytes"] / s["full"]["bytes"]
            s[k]["timing_s"] = res["fit"]["fixed_s"] + rate_s
        res["7B"] = s
    render(res)
    bench.write(res)
    bad = [r["size"] for r in res["sizes"] if not (r["full"]["exact"] and r["adapter"]["exact"])]
    if bad:
        print(f"{bad}: the replica's tensors differ from the publisher's", file=sys.stderr)
    return 1 if bad else 0


def decoder_bytes(size: str, dtype: torch.dtype) -> int:
    """Bytes of a `Decoder` of `size`, from its shapes (before building it)."""
    h, inter, layers, heads, kv, vocab = SHAPES[size]
    head = h // heads
    layer = h * heads * head * 2 + 2 * h * kv * head + 3 * h * inter + 2 * h
    return (layers * layer + 2 * vocab * h + h) * torch.empty(0, dtype=dtype).element_size()


if __name__ == "__main__":
    sys.exit(main())

"""Zero-copy state-dict packing for the object store, shared by the trainer and the server.

`ray.put` of a dict of torch tensors pickles every tensor through torch's reducer, which
copies the bytes more than once (measured here: ~55x the memory-copy floor at 2 GB, and out of
memory at 500M parameters fp32 with two receivers). Ray ships numpy arrays out of band
instead: `ray.put` writes each array's bytes once into the object store, and `ray.get` on the
same node returns arrays that *are* the object-store memory. So a state dict travels as
`PackedWeights`: one uint8 numpy view per tensor (any dtype, bfloat16 included, since the
bytes are reinterpreted rather than converted) plus a small list of names, dtypes and shapes.

The receiver turns the arrays back into torch views without copying (`unpack`) and copies
them into its parameters in place (`load_into`), so the whole path costs one copy into the
store and one copy into the model. The arrays are read-only views of shared memory: only the
copy into the model writes, and no reference is kept after loading.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dart_ray.models.lora import AdapterSpec, load_adapter

_DTYPES: dict[str, torch.dtype] = {
    str(d): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    name: str
    dtype: str
    """`str(torch.dtype)`, e.g. 'torch.bfloat16'."""
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PackedWeights:
    """A state dict as raw byte arrays that Ray serialises without copies."""

    metas: tuple[TensorMeta, ...]
    arrays: tuple[np.ndarray, ...]
    """One uint8 array per tensor, its raw bytes."""
    adapter: AdapterSpec | None = None
    """Set when the tensors are LoRA adapters (`dart_ray.models.lora`), not the whole model:
    the receiver applies them to its base weights (`load_adapter`)."""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def __len__(self) -> int:
        return len(self.metas)


def pack(
    state_dict: Mapping[str, torch.Tensor], adapter: AdapterSpec | None = None
) -> PackedWeights:
    """Byte views of each tensor (a copy only for non-contiguous or non-CPU tensors);
    `adapter` marks a state dict of LoRA adapters."""
    metas: list[TensorMeta] = []
    arrays: list[np.ndarray] = []
    for name, t in state_dict.items():
        if str(t.dtype) not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} cannot be packed")
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        metas.append(TensorMeta(name, str(t.dtype), tuple(t.shape)))
        arrays.append(t.reshape(-1).view(torch.uint8).numpy())
    return PackedWeights(tuple(metas), tuple(arrays), adapter)


def unpack(packed: PackedWeights) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of the packed bytes; no copy. Do not write into them."""
    if len(packed.metas) != len(packed.arrays):
        raise ValueError(f"{len(packed.metas)} tensor descriptions for {len(packed.arrays)} arrays")
    with warnings.catch_warnings():
        # Arrays from the object store are read-only; torch warns that it cannot protect them.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for meta, arr in zip(packed.metas, packed.arrays, strict=True):
            dtype = _DTYPES.get(meta.dtype)
            if dtype is None:
                raise TypeError(f"{meta.name}: unknown dtype {meta.dtype}")
            flat = torch.from_numpy(arr)
            yield meta.name, flat.view(dtype).reshape(meta.shape)


@torch.no_grad()
def load_into(model: torch.nn.Module, packed: PackedWeights, strict: bool = True) -> int:
    """Copy packed tensors into the model's parameters and buffers in place; returns bytes.

    In place means the model object, its storage and anything holding it (an engine, a
    compiled graph) stay as they are. With `strict`, every packed name must exist in the model
    and every parameter must be covered, else ValueError names the difference.
    """
    targets = dict(model.state_dict(keep_vars=True))
    names = {m.name for m in packed.metas}
    if strict:
        unknown = sorted(names - set(targets))
        missing = sorted(n for n, _ in model.named_parameters() if n not in names)
        if unknown or missing:
            raise ValueError(
                f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}"
            )
    copied = 0
    for name, src in unpack(packed):
        dst = targets.get(name)
        if dst is None:
            continue
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)} != model's {tuple(dst.shape)}")
        dst.data.copy_(src)
        copied += src.numel() * src.element_size()
    return copied


def load_packed_adapter(model: torch.nn.Module, packed: PackedWeights) -> int:
    """Apply published LoRA adapters to the model in place (its base weights stay); returns
    bytes copied. The first call injects the LoRA layers."""
    if packed.adapter is None:
        raise ValueError("these weights are a whole model, not adapters")
    return load_adapter(model, packed.adapter, dict(unpack(packed)))


@torch.no_grad()
def load_into_staged(
    model: torch.nn.Module, packed: PackedWeights, chunk_bytes: int = 64 << 20
) -> int:
    """`load_into` for a model on a CUDA device, through two reused pinned host buffers.

    `load_into` copies each tensor from pageable memory (the object store's), which CUDA
    stages through a driver buffer and runs synchronously, one tensor at a time. Here the
    bytes go host -> pinned buffer (a memcpy) while the other buffer's bytes go pinned ->
    device on a side stream (DMA at the link's speed), so the two copies overlap and small
    tensors share a buffer. Parameters are written in place. On any other device this is
    `load_into`. Returns the bytes copied."""
    params = [t for t in model.state_dict(keep_vars=True).values()]
    device = params[0].device if params else torch.device("cpu")
    if device.type != "cuda":
        return load_into(model, packed)
    targets = dict(model.state_dict(keep_vars=True))
    names = {m.name for m in packed.metas}
    unknown = sorted(names - set(targets))
    missing = sorted(n for n, _ in model.named_parameters() if n not in names)
    if unknown or missing:
        raise ValueError(f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}")  # fmt: skip
    stream = torch.cuda.Stream(device)
    bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done: list[torch.cuda.Event | None] = [None, None]
    cur, pos, copied = 0, 0, 0
    for name, src in unpack(packed):
        dst = targets[name].data
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)} != model's {tuple(dst.shape)}")
        if not dst.is_contiguous() or dst.dtype != src.dtype:
            stream.synchronize()
            dst.copy_(src)
            copied += src.numel() * src.element_size()
            continue
        raw, out = src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)
        off = 0
        while off < raw.numel():
            if pos == chunk_bytes:  # this buffer is full: reuse the other once it drained
                cur, pos = 1 - cur, 0
                ev = done[cur]
                if ev is not None:
                    ev.synchronize()
            n = min(chunk_bytes - pos, raw.numel() - off)
            staged = bufs[cur][pos : pos + n]
            staged.copy_(raw[off : off + n])
            with torch.cuda.stream(stream):
                out[off : off + n].copy_(staged, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
                done[cur] = ev
            pos += n
            off += n
        copied += raw.numel()
    stream.synchronize()
    return copied


@torch.no_grad()
def share_into(model: torch.nn.Module, packed: PackedWeights) -> int:
    """Point the model's parameters at the packed bytes themselves: no copy at all.

    With weights fetched from the object store, the parameters then live in the store's shared
    memory: an update costs one `ray.put` and a pointer swap, and every replica on a node
    shares one physical copy. The memory is read-only (inference never writes parameters)
    and stays valid while `packed` is referenced, even after the publisher dies (the store
    keeps an object alive while a process maps it), so the caller keeps `packed` until the
    next update. A tensor whose dtype differs from the parameter's is converted (a copy).
    Returns the bytes now shared.
    """
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    unknown = sorted({m.name for m in packed.metas} - set(params) - set(buffers))
    missing = sorted(set(params) - {m.name for m in packed.metas})
    if unknown or missing:
        raise ValueError(
            f"weights do not match the model: unknown {unknown[:5]}, missing {missing[:5]}"
        )
    shared = 0
    for name, src in unpack(packed):
        dst = params.get(name, buffers.get(name))
        assert dst is not None
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)} != model's {tuple(dst.shape)}")
        if src.dtype == dst.dtype and src.device == dst.device:
            dst.data = src
            shared += src.numel() * src.element_size()
        else:
            dst.data = src.to(device=dst.device, dtype=dst.dtype)
    return shared


@dataclass(frozen=True, slots=True)
class WarmReport:
    """What `warm_object_store` did."""

    bytes: int
    """Bytes of the node's object store written (and so mapped) by this process."""
    seconds: float


def warm_object_store(
    fraction: float = 0.95, chunk_bytes: int = 64 << 20, store_bytes: int | None = None
) -> WarmReport:
    """Map this node's object store into the calling process once, so later puts copy at
    memory speed.

    A `ray.put` copies the bytes into the store's shared memory, which each process maps
    lazily: the first write to each 4 KiB page of the mapping is a page fault, even when the
    store preallocated its memory. The store places successive objects at fresh addresses
    until it has gone round its whole capacity, so a publisher faults on every page of every
    version for a long while: measured here, a 437 MB put took 0.12-0.17 s with 112,000 minor
    faults against a 0.037 s memcpy, and 0.03-0.05 s once its pages were mapped. Writing
    `fraction` of the free store once, in chunks that are freed at once, maps it all; the
    memory is the store's own (it counts against `object_store_memory`, not this process).
    Costs about 0.4 s per GB here, once; the page tables cost 2 MB per GB mapped.

    `store_bytes` defaults to this node's free object store memory as Ray reports it. Must
    run inside a connected Ray driver or worker.
    """
    import ray

    if not 0 < fraction <= 0.95:
        raise ValueError(f"fraction must be in (0, 0.95], got {fraction}")
    t0 = time.perf_counter()
    free = _free_store_bytes() if store_bytes is None else store_bytes
    total = int(free * fraction)
    zeros = np.zeros(min(chunk_bytes, total), dtype=np.uint8)
    sizes = [len(zeros)] * (total // len(zeros)) if len(zeros) else []
    if total - sum(sizes) >= 1 << 20:
        sizes.append(total - sum(sizes))
    refs = [ray.put(zeros[:n]) for n in sizes]
    del refs
    # the store frees them asynchronously: wait for that here rather than in the first publish
    deadline = time.monotonic() + 10
    while store_bytes is None and time.monotonic() < deadline:
        if _free_store_bytes() >= free * 0.98:
            break
        time.sleep(0.1)
    return WarmReport(sum(sizes), time.perf_counter() - t0)


def _free_store_bytes() -> int:
    import ray

    node = ray.get_runtime_context().get_node_id()
    try:  # per node; Ray keeps this in a private module
        from ray._private.state import state

        free = state.available_resources_per_node()[node].get("object_store_memory")
    except Exception:  # an internal API that may move: fall back below
        free = None
    if free is None:
        free = next(
            n["Resources"].get("object_store_memory", 0) / 2
            for n in ray.nodes()
            if n["NodeID"] == node
        )
    return int(free)

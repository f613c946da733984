"""FSDP2 for the policy model: shard every transformer block, then the root.

`fully_shard` per decoder layer and per vision block means each block's parameters are
all-gathered just before it runs and freed after, so peak memory is one block plus the
shards; the root unit holds what is left (embeddings, norms, the LM head). On CPU the process
group is gloo, on GPU NCCL: the code is the same.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from dart_ray.models.lora import is_adapter

BLOCK_SUFFIXES = ("DecoderLayer", "VisionBlock")


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (language decoder layers and vision blocks)."""
    return [m for m in model.modules() if type(m).__name__.endswith(BLOCK_SUFFIXES)]


def comm_device() -> torch.device:
    """Where collective tensors must live: the current GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_model(model: torch.nn.Module, device_type: str = "cpu") -> torch.nn.Module:
    """Apply FSDP2 in place, which also moves the parameters to `device_type`; without a
    process group, only the move."""
    if not dist.is_initialized():
        return model.to(device_type)
    # FSDP2 warns, at every forward, that the root module returned a view tensor (Qwen2.5-VL's
    # output carries views, e.g. of the image features) because an in-place op on such a view
    # would skip FSDP's pre-backward hook. Nothing here writes into the model's outputs in
    # place: `score_responses` (train/forward.py) only gathers out of `out.logits`. The
    # warning says nothing to an operator, once per step in the job's log.
    warnings.filterwarnings(
        "ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning
    )
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on rank 0 (CPU), empty elsewhere. Every rank must call it."""
    if not dist.is_initialized():
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def full_adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA adapters' full tensors on rank 0 (CPU), empty elsewhere: only they are
    gathered, not the frozen base. Every rank must call it (one all-gather per tensor)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not is_adapter(name):
            continue
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().cpu()
    return out if not dist.is_initialized() or dist.get_rank() == 0 else {}


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (present on rank 0) into a sharded model on every rank."""
    if not dist.is_initialized():
        model.load_state_dict(state)
        return
    set_model_state_dict(
        model,
        state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )

"""LoRA adapters on the policy: train, publish and checkpoint only the low-rank matrices.

RL moves little information per step, and low-rank adapters match full fine-tuning in RL even
at small ranks ("LoRA Without Regret", Thinking Machines 2025); what they change for a system
is the size of everything that moves: an adapter of rank 32 on a 7B model is ~80 MB against
16.6 GB of weights (docs/BENCHMARKS.md, "Publish: full weights vs a LoRA adapter").

The adapters are `peft` LoRA layers injected into the model in place (no `PeftModel` wrapper,
so the module names the trainer, FSDP2 and the engines know stay as they are, each targeted
linear gaining `base_layer`, `lora_A.default` and `lora_B.default`). `lora_B` starts at zero,
so a model with fresh adapters computes exactly the base model.

- The trainer (`train/worker.py`) injects them before sharding; only they require grad.
- A publish packs `adapter_state(model)` with its `AdapterSpec`; an engine that receives
  adapters injects the same layers once and copies every later version into them in place
  (`load_adapter`): y = W x + (alpha / r) B A x, the same function as the merged weights
  W + (alpha / r) B A (tests/models/test_lora.py: log-probs equal to 1e-4).
- A checkpoint is peft's adapter folder (`adapter_config.json`, `adapter_model.safetensors`,
  keys `base_model.model.<module>.lora_A.weight`, loadable by `PeftModel.from_pretrained` and
  vLLM's LoRA loader) plus `dart_ray_base.json`: the base folder and the SHA-256 of its
  weights, checked when the checkpoint is loaded (`load_adapter_checkpoint`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from dart_ray.config.train import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_IDENTITY = "dart_ray_base.json"
_PEFT_PREFIX = "base_model.model."
_ADAPTER_NAME = "default"
VISION_MODULES = r".*\.visual\..*"
"""Qwen2.5-VL's vision tower: excluded from the adapters unless `vision` is set (its MLP uses
the language model's projection names)."""


class AdapterError(ValueError):
    """An adapter that does not fit its model or base (named in the message)."""


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """What a receiver needs to build the same LoRA layers (travels with every publish)."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    vision: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:  # a set to peft: the order carries no meaning
        object.__setattr__(self, "target_modules", tuple(sorted(set(self.target_modules))))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self, base_dir: str | None = None) -> object:
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            exclude_modules=None if self.vision else VISION_MODULES,
            base_model_name_or_path=base_dir,
        )


def adapter_spec(cfg: LoraConfig) -> AdapterSpec | None:
    """The adapters `[train.lora]` asks for, or None when LoRA is off."""
    if not cfg.enabled:
        return None
    return AdapterSpec(cfg.rank, cfg.alpha, tuple(cfg.target_modules), cfg.vision, cfg.dropout)


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA matrix."""
    return ".lora_A." in name or ".lora_B." in name


def has_adapters(model: torch.nn.Module) -> bool:
    return any(is_adapter(n) for n, _ in model.named_parameters())


def add_adapters(model: torch.nn.Module, spec: AdapterSpec) -> torch.nn.Module:
    """Inject fresh LoRA layers in place (B = 0: the model's function is unchanged) and
    freeze everything else; returns the same model. AdapterError when no module matches."""
    from peft import inject_adapter_in_model

    try:
        inject_adapter_in_model(spec.peft_config(), model)  # type: ignore[arg-type]
    except ValueError as e:
        raise AdapterError(f"train.lora.target_modules {list(spec.target_modules)}: {e}") from None
    base_dtype = next(p.dtype for n, p in model.named_parameters() if not is_adapter(n))
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
        if is_adapter(name) and p.dtype != base_dtype:  # peft upcasts bf16 adapters to fp32
            p.data = p.data.to(base_dtype)  # the model's dtype: what is trained and published
    return model


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model with every LoRA layer bypassed for the duration: the frozen base's function
    (the KL reference of a LoRA run, without a second copy of the weights). peft's switch also
    stops the adapters' gradients; switching back makes them trainable again, as they were."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors by parameter name (CPU, detached; without a process group)."""
    return {n: p.detach().cpu() for n, p in model.named_parameters() if is_adapter(n)}


@torch.no_grad()
def load_adapter(
    model: torch.nn.Module, spec: AdapterSpec, state: Mapping[str, torch.Tensor]
) -> int:
    """Copy adapter tensors into the model's LoRA layers in place, injecting them first if
    the model has none; every adapter parameter must be covered. Returns bytes copied."""
    if not has_adapters(model):
        add_adapters(model, spec)
        model.eval()
    params = {n: p for n, p in model.named_parameters() if is_adapter(n)}
    unknown = sorted(set(state) - set(params))
    missing = sorted(set(params) - set(state))
    if unknown or missing:
        raise AdapterError(
            f"adapter does not match the model's LoRA layers: unknown {unknown[:3]}, "
            f"missing {missing[:3]} (was it trained with other train.lora settings?)"
        )
    copied = 0
    for name, src in state.items():
        dst = params[name]
        if tuple(dst.shape) != tuple(src.shape):
            raise AdapterError(f"{name}: shape {tuple(src.shape)} != model's {tuple(dst.shape)}")
        dst.data.copy_(src)
        copied += src.numel() * src.element_size()
    return copied


@torch.no_grad()
def merged_state(model: torch.nn.Module, spec: AdapterSpec) -> dict[str, torch.Tensor]:
    """The full state dict of the function the adapted model computes, under the base's
    names: each targeted weight W + (alpha / r) B A. What full fine-tuning would publish."""
    out: dict[str, torch.Tensor] = {}
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for name, t in sd.items():
        if is_adapter(name):
            continue
        if ".base_layer." in name:
            module, leaf = name.split(".base_layer.")
            if leaf == "weight":
                a = sd[f"{module}.lora_A.{_ADAPTER_NAME}.weight"]
                b = sd[f"{module}.lora_B.{_ADAPTER_NAME}.weight"]
                t = t + spec.scaling * (b @ a)
            out[f"{module}.{leaf}"] = t
        else:
            out[name] = t
    return out


# ----------------------------------------------------------------------------- checkpoints


@cache
def weights_digest(base_dir: str) -> str:
    """SHA-256 over the base folder's weight files (names and bytes): the base's identity
    (computed once per process and folder; 16 GB hash in ~10 s)."""
    h = hashlib.sha256()
    files = sorted(Path(base_dir).glob("*.safetensors")) or sorted(Path(base_dir).glob("*.bin"))
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def write_adapter(
    out: Path, spec: AdapterSpec, state: Mapping[str, torch.Tensor], base_path: str
) -> None:
    """Write peft's adapter folder (config and weights) into `out` (which exists): what
    `PeftModel.from_pretrained` and vLLM's `LoRARequest` load."""
    tensors = {
        _PEFT_PREFIX + n.replace(f".{_ADAPTER_NAME}.", "."): t.contiguous()
        for n, t in state.items()
    }
    save_file(tensors, str(out / ADAPTER_WEIGHTS))
    spec.peft_config(base_path).save_pretrained(str(out))  # type: ignore[attr-defined]


def save_adapter_checkpoint(
    out: Path, spec: AdapterSpec, state: Mapping[str, torch.Tensor], base_dir: Path
) -> None:
    """Write peft's adapter folder and the base's identity into `out` (which exists)."""
    base = base_identity(base_dir)
    write_adapter(out, spec, state, base["path"])
    (out / BASE_IDENTITY).write_text(json.dumps(base, indent=1) + "\n")


def base_identity(base_dir: Path) -> dict[str, str]:
    """The base model an adapter belongs to: a base's own identity file if `base_dir` is
    itself an adapter checkpoint (a resumed run saves again), else the folder and digest."""
    if (base_dir / BASE_IDENTITY).is_file():
        return dict(json.loads((base_dir / BASE_IDENTITY).read_text()))
    path = str(base_dir.resolve())
    return {"path": path, "sha256": weights_digest(path)}


def is_adapter_checkpoint(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_folder(path: str | Path) -> Path:
    """The base model folder of an adapter checkpoint; any other folder is its own base."""
    p = Path(path)
    if (p / BASE_IDENTITY).is_file():
        return Path(json.loads((p / BASE_IDENTITY).read_text())["path"])
    return p


def read_adapter_checkpoint(path: str | Path) -> tuple[Path, AdapterSpec, dict[str, torch.Tensor]]:
    """(base folder, spec, adapter tensors under parameter names) of an adapter checkpoint,
    after checking that the base folder still holds the weights it was trained on."""
    p = Path(path)
    cfg = json.loads((p / ADAPTER_CONFIG).read_text())
    ident_file = p / BASE_IDENTITY
    if not ident_file.is_file():
        raise AdapterError(f"{p}: {BASE_IDENTITY} is missing: the base model is unknown")
    ident = json.loads(ident_file.read_text())
    base = Path(ident["path"])
    if not base.is_dir():
        raise AdapterError(f"{p}: its base model folder {base} does not exist")
    if weights_digest(str(base)) != ident["sha256"]:
        raise AdapterError(
            f"{p}: the base model at {base} is not the one these adapters were trained on "
            f"(weights SHA-256 {weights_digest(str(base))[:12]}, expected {ident['sha256'][:12]})"
        )
    targets = cfg["target_modules"]
    spec = AdapterSpec(
        rank=int(cfg["r"]),
        alpha=float(cfg["lora_alpha"]),
        target_modules=tuple(sorted(targets) if isinstance(targets, list) else [targets]),
        vision=cfg.get("exclude_modules") is None,
        dropout=float(cfg.get("lora_dropout", 0.0)),
    )
    state = {_to_param_name(k): v for k, v in load_file(str(p / ADAPTER_WEIGHTS)).items()}
    return base, spec, state


def _to_param_name(key: str) -> str:
    name = key.removeprefix(_PEFT_PREFIX)
    for m in ("lora_A", "lora_B"):
        name = name.replace(f".{m}.weight", f".{m}.{_ADAPTER_NAME}.weight")
    return name

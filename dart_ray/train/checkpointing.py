"""Durable checkpoints: an HF folder (loadable by transformers and vLLM) plus the optimizer
state and the trainer's position, so a resumed run continues at the right step and version.

Layout of `<run_dir>/checkpoints/v<version>/`:
    config.json, model.safetensors, tokenizer + processor files   (the HF folder; with LoRA,
        adapter_config.json + adapter_model.safetensors + dart_ray_base.json instead of the
        weights: peft's adapter folder and the base model it applies to)
    optimizer.pt                                                  (full optimizer state)
    trainer_state.json        ({"step": k, "version": v, "rows": [...]}: the log rows whose
                               training this checkpoint holds and no earlier one does)
The folder is written under a temporary name and renamed when complete, so a crash mid-save
never leaves a folder that looks loadable.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dart_ray.models.lora import AdapterSpec, save_adapter_checkpoint

# Files of an HF model folder that are not weights: copied from the source model folder.
_AUX = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "dart_ray_tiny.json",
)


@dataclass(frozen=True)
class TrainerState:
    step: int
    version: int
    rows: tuple[int, ...] = ()
    """Lineage: the log rows trained since the previous durable checkpoint. A resume from
    this checkpoint settles them as consumed, acknowledged or not (the trainer may have died
    between completing the checkpoint and acknowledging them), so none is trained twice."""
    trained_at: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """The lineage's rows by the weight version that trained them (what `dart-ray audit`
    checks the staleness bound against: version - the row's version <= max_staleness)."""
    durable_version: int | None = None
    """Only in a resume point: the version of the durable checkpoint it starts from (0 for the
    base weights) when `version` is above it (versions published after the last durable save
    were lost with their trainer). None: `version` itself is durable (a checkpoint's file)."""


def save_checkpoint(
    out: Path,
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    optimizer_state: dict[str, object] | None,
    source_dir: Path,
    state: TrainerState,
    adapter: AdapterSpec | None = None,
) -> Path:
    """Write the checkpoint folder (call on rank 0 with the full state dict). With `adapter`,
    `state_dict` holds the LoRA adapters: the folder is then peft's adapter folder with the
    base's identity and the base's config.json (`dart_ray.models.lora`)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if adapter is None:
        model.save_pretrained(tmp, state_dict=state_dict)  # type: ignore[operator]
    else:
        save_adapter_checkpoint(tmp, adapter, state_dict, source_dir)
        shutil.copy2(source_dir / "config.json", tmp / "config.json")
    for name in _AUX:
        if (source_dir / name).is_file():
            shutil.copy2(source_dir / name, tmp / name)
    if optimizer_state is not None:
        torch.save(optimizer_state, tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(
        json.dumps(
            {
                "step": state.step,
                "version": state.version,
                "rows": list(state.rows),
                "trained_at": {str(v): list(rs) for v, rs in sorted(state.trained_at.items())},
            }
        )
        + "\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_trainer_state(path: Path) -> TrainerState:
    d = json.loads((path / "trainer_state.json").read_text())
    rows = tuple(int(r) for r in d.get("rows", ()))
    trained_at = {int(v): tuple(int(r) for r in rs) for v, rs in d.get("trained_at", {}).items()}
    return TrainerState(int(d["step"]), int(d["version"]), rows, trained_at)

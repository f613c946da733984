"""Policy models: the tiny Qwen2.5-VL built locally, and loading any Qwen2.5-VL folder."""

from __future__ import annotations

from pathlib import Path

from dart_ray.config import Config
from dart_ray.models.loading import check_model_dir


def resolve_model_path(cfg: Config) -> Path:
    """The folder the policy loads: `policy.model_path`, checked, or else the tiny model.

    With no `policy.model_path` (the embedded default), the tiny model is built once, seeded by
    `run.seed`, under `<run.root_dir>/models/tiny-seed<seed>` and reused afterwards.
    """
    if cfg.policy.model_path is not None:
        return check_model_dir(cfg.policy.model_path)
    from dart_ray.models.tiny import TinySpec, save_tiny_model

    out = Path(cfg.run.root_dir) / "models" / f"tiny-seed{cfg.run.seed}"
    if not (out / "config.json").is_file():
        save_tiny_model(out, TinySpec(seed=cfg.run.seed))
    return check_model_dir(out)

"""Inference engines behind the policy server: transformers (`hf`), vLLM (`vllm`), and written
solutions played back (`script`)."""

from __future__ import annotations

from pathlib import Path

import torch

from dart_ray.config import PolicyConfig
from dart_ray.engines.base import Engine, GenerateRequest, Generation, SamplingParams

__all__ = ["Engine", "GenerateRequest", "Generation", "SamplingParams", "make_engine"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_engine(cfg: PolicyConfig, model_path: str | Path) -> Engine:
    """The engine `cfg.engine` names, loaded from `model_path` (vLLM is imported only here)."""
    if cfg.engine == "script":
        from dart_ray.engines.script import ScriptEngine

        return ScriptEngine(Path(model_path), cfg.interrupt_on_update)
    if cfg.engine == "hf":
        from dart_ray.engines.hf import HFEngine

        device = "cuda" if cfg.num_gpus > 0 and torch.cuda.is_available() else "cpu"
        return HFEngine(
            model_path,
            cfg.allow_special_tokens,
            DTYPES[cfg.dtype],
            device,
            cfg.weights_load,
            cfg.interrupt_on_update,
            cfg.hf_decode,
        )
    from dart_ray.engines.vllm import VLLMEngine

    return VLLMEngine.from_config(cfg, model_path)

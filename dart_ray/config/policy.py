"""`[policy]`: the model, its inference engine and serving (replicas, batching, sampling, the
HTTP route and who may call it)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dart_ray.config.base import Section


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PolicyConfig(Section):
    model_path: Path | None = None
    """Local HF model directory (e.g. UI-TARS-1.5-7B). Unset: build the tiny model locally."""
    engine: Literal["hf", "vllm", "script"] = "hf"
    """Inference engine: `hf` (transformers, CPU or GPU) or `vllm`; `script` plays written
    solutions from the JSONL file `model_path` names (`dart_ray.engines.script`: for `dart-ray
    eval` and `serve`, checking an environment's set-up and evaluator; it has nothing to train)."""
    replicas: int = Field(default=1, ge=1)
    """Policy server replicas (Ray Serve)."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (0 = greedy: a policy server's default for its HTTP route; a run
    refuses it, since RL learns from sampled tokens and their log-probs, which greedy
    decoding does not have; held-out evaluation is greedy by itself)."""
    top_k: int = Field(default=0, ge=0)
    """Sample among the k most likely tokens (0: all). The trainer scores the same truncated
    distribution."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1: all). The trainer scores the same truncated distribution."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Maximum response tokens per turn (DART-GUI: 500 on UI-TARS-7B)."""
    history_images: int = Field(default=1, ge=1)
    """Screenshots kept in the prompt (the newest k)."""
    history_turns: int = Field(default=5, ge=0)
    """Previous assistant turns kept in the prompt (the newest m)."""
    max_batch_size: int = Field(default=32, ge=1)
    """Largest batch the transformers engine forms from concurrent requests."""
    batch_wait_ms: float = Field(default=5.0, ge=0)
    """How long a request waits for others to join its batch, from its arrival or, if it
    queued behind a running batch, from the moment the engine freed up."""
    prepare_threads: int = Field(default=2, ge=1)
    """Threads per replica that prepare requests (decode screenshots, run the image processor,
    tokenise) while the engine generates; measured on 2 cores with 32 clients, 2 threads
    gave 41.8 actions/s against 31.6 with 1 (docs/BENCHMARKS.md)."""
    http_host: str = "127.0.0.1"
    """Address the OpenAI-compatible HTTP route binds to; any but a loopback address needs
    auth_token_file or auth_token_env."""
    http_port: int = Field(default=8000, ge=1, le=65535)
    """Port of the HTTP route."""
    auth_token_env: str | None = None
    """Environment variable holding a bearer token the HTTP route requires (unset: none)."""
    auth_token_file: Path | None = None
    """File whose first line is the bearer token the HTTP route requires (wins over
    auth_token_env; the path must exist on every node that runs a replica)."""
    num_cpus: float = Field(default=1.0, gt=0)
    """CPUs each policy replica reserves (fractional is fine)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each policy replica reserves."""
    torch_threads: int = Field(default=0, ge=0)
    """Threads each replica's engine computes with on the CPU (its OMP_NUM_THREADS). 0: Ray's
    choice, the replica's num_cpus rounded down and at least 1. More than num_cpus lets a
    replica that is the run's bottleneck use cores the others leave idle (the default run's
    trainer is idle most of the time)."""
    autoscaling: bool = False
    """Let Ray Serve scale replicas between min_replicas and max_replicas with the load."""
    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas when autoscaling."""
    max_replicas: int = Field(default=4, ge=1)
    """Most replicas when autoscaling."""
    target_ongoing_requests: float = Field(default=16.0, gt=0)
    """Requests in flight per replica that autoscaling aims for."""
    upscale_delay_s: float = Field(default=30.0, ge=0)
    """Autoscaling: how long the load must call for more replicas before Serve adds one
    (Serve's default). A new replica loads the newest published version before its first
    request (docs/OPERATIONS.md)."""
    downscale_delay_s: float = Field(default=600.0, ge=0)
    """Autoscaling: how long the load must call for fewer replicas before Serve removes one
    (Serve's default, 10 minutes: a 7B replica takes minutes to start, so a lull shorter than
    that should not cost one). A removed replica drains its requests first."""
    look_back_period_s: float = Field(default=30.0, gt=0)
    """Autoscaling: the window over which Serve averages the requests in flight (Serve's
    default). Serve receives the load from each handle every 10 s
    (RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S), so a shorter window reacts faster
    but not below that interval."""
    max_ongoing_requests: int = Field(default=64, ge=1)
    """Requests a replica accepts at once (at least max_batch_size for batching to fill)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype of the engine."""
    access_log: bool = False
    """Serve's per-request access log lines from the replicas (`CALL generate OK 12.3ms`,
    one per request: hundreds a minute in a run, most of a job's log). Off by default; on
    brings them back, in the replica logs and (in a job) the driver's output."""
    allow_special_tokens: tuple[str, ...] = ()
    """Special tokens the policy may sample besides the end token (all others are suppressed;
    e.g. ["<|box_start|>", "<|box_end|>"] for UI-TARS-1.5-7B, which writes them)."""
    weights_load: Literal["share", "copy"] = "share"
    """transformers engine on CPU: `share` points the parameters at the weights in the object
    store (no copy; replicas on a node share them), `copy` copies them into the model."""
    hf_decode: Literal["lean", "generate"] = "lean"
    """transformers engine: `lean` decodes with the engine's own loop (one prefill, then one
    forward a token on the KV cache; the same tokens as `generate`, 1.06x faster on rung 3's
    batches on a quiet machine, 1.2x on a busy one),
    `generate` with transformers' `generate` (the baseline, and a fallback for a model the
    loop does not know)."""
    update_timeout_s: float = Field(default=300.0, gt=0)
    """How long `update_weights` waits for every replica to load a new version."""
    interrupt_on_update: bool = False
    """Partial rollouts: a weight update pauses the generations in flight at their next token
    boundary, loads, and they resume on the new weights (each token records the version
    that sampled it; a step's `weight_version` is its oldest). Off: an update waits for the
    generations in flight to finish (seconds for long responses) and holds new ones off
    meanwhile. Engines `hf` and the timing mode's; not `vllm` yet."""
    vllm_max_model_len: int = Field(default=8192, ge=256)
    """vLLM: longest prompt plus response, in tokens."""
    vllm_kv_cache_mb: int = Field(default=512, ge=16)
    """vLLM: memory reserved for the KV cache, MiB (on GPU as on CPU: a fixed size, so a
    replica that shares its GPU with a train worker takes no more than it was given)."""
    vllm_logprobs_topk: int = Field(default=20, ge=-1)
    """vLLM: top log-probs per token used to estimate the entropy (a lower bound); -1 returns
    the whole vocabulary (exact entropy; affordable for small vocabularies only)."""

    vllm_max_lora_rank: int = Field(default=0, ge=0)
    """vLLM: the largest LoRA rank the engine takes (0: LoRA off). Must be at least
    `train.lora.rank` when a run trains adapters on the vLLM engine; vLLM then serves every
    published version as a LoRA adapter on the base weights."""

    @field_validator("vllm_logprobs_topk")
    @classmethod
    def _topk(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be -1 (whole vocabulary) or at least 1")
        return v

    @model_validator(mode="after")
    def _replica_bounds(self) -> PolicyConfig:
        if self.autoscaling and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"policy.min_replicas = {self.min_replicas} is above policy.max_replicas = "
                f"{self.max_replicas}"
            )
        return self

    @model_validator(mode="after")
    def _vllm_temperature(self) -> PolicyConfig:
        if self.engine == "vllm" and self.temperature > 2:
            raise ValueError(
                f"policy.temperature = {self.temperature}: vLLM samples at temperatures up to 2 "
                "(use policy.engine = 'hf' for hotter sampling)"
            )
        return self

    @model_validator(mode="after")
    def _script_reads_its_step(self) -> PolicyConfig:
        if self.engine == "script" and self.history_turns < 1:
            raise ValueError(
                "policy.engine = 'script' reads its step from the newest response in the "
                "prompt: policy.history_turns must be at least 1"
            )
        return self

    @model_validator(mode="after")
    def _vllm_interrupt(self) -> PolicyConfig:
        if self.engine == "vllm" and self.interrupt_on_update:
            raise ValueError(
                "policy.interrupt_on_update is not implemented for policy.engine = 'vllm' "
                "(it would abort and resume requests across the load): use 'hf', or leave "
                "it off so updates wait for the responses in flight"
            )
        return self

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> PolicyConfig:
        if not is_loopback(self.http_host) and not (self.auth_token_env or self.auth_token_file):
            raise ValueError(
                f"policy.http_host = {self.http_host!r} serves beyond this machine: set "
                "policy.auth_token_file or policy.auth_token_env so the route needs a token"
            )
        return self

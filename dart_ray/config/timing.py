"""`[timing]`: the timing mode. Every part of a run runs for real (Ray actors, the Serve
deployment, the durable log, the curator, Ray Train workers, the object-store weight sync, the
driver); only compute is replaced by calibrated latencies: the environment's resets and steps,
the policy's generation, the trainer's optimizer step and the replicas' weight load. A run in
this mode measures the system's scheduling in a regime (a 7B model on GPUs, OSWorld desktops)
this machine cannot compute, and says SIMULATED in every output. The figures and where each
comes from: docs/BENCHMARKS.md ("Decoupling in DART-GUI's regime"); the defaults describe
UI-TARS-1.5-7B (Qwen2.5-VL-7B, 8.3 B parameters, bf16) on H100s against OSWorld.

`[env.latency]`: the environment part alone (LatencyMiniDesk), which the timing mode fills."""

from __future__ import annotations

from pydantic import Field, model_validator

from dart_ray.config.base import Section


class EnvLatency(Section):
    """LatencyMiniDesk: MiniDesk's tasks behind OSWorld-shaped, heavy-tailed latencies
    (clipped lognormals), and optionally a simulated success rate in place of its checker."""

    reset_median_s: float = Field(default=10.0, gt=0)
    """Median reset (VM snapshot revert plus the task's setup), seconds."""
    reset_sigma: float = Field(default=1.0, ge=0)
    """Lognormal sigma of a reset (1.0: p5 1.9 s, p95 52 s around a 10 s median)."""
    reset_lo_s: float = Field(default=2.0, ge=0)
    """Shortest reset, seconds."""
    reset_hi_s: float = Field(default=90.0, gt=0)
    """Longest reset, seconds."""
    step_median_s: float = Field(default=2.5, gt=0)
    """Median step (run the pyautogui code in the VM, let the screen settle, screenshot)."""
    step_sigma: float = Field(default=0.45, ge=0)
    """Lognormal sigma of a step (0.45: p5 1.2 s, p95 5.2 s around a 2.5 s median)."""
    step_lo_s: float = Field(default=0.5, ge=0)
    """Shortest step, seconds."""
    step_hi_s: float = Field(default=15.0, gt=0)
    """Longest step, seconds."""
    scale: float = Field(default=1.0, ge=0)
    """Multiplier of every latency (the timing mode sets it to `timing.scale`)."""
    seed: int = 0
    """Seed of the latency streams (one per session index: session 3 draws the same
    latencies in every run)."""
    success_rate: float | None = Field(default=None, ge=0, le=1)
    """Unset: MiniDesk's checker rewards the episode. Set: each task succeeds with its own
    probability, drawn once per task from a Beta distribution with this mean (concentration
    2), so some tasks are nearly always solved and some nearly never, as on OSWorld."""

    @model_validator(mode="after")
    def _ranges(self) -> EnvLatency:
        for k in ("reset", "step"):
            lo, hi = getattr(self, f"{k}_lo_s"), getattr(self, f"{k}_hi_s")
            if lo > hi:
                raise ValueError(f"{k}_lo_s = {lo} is above {k}_hi_s = {hi}")
        return self


class TimingConfig(Section):
    enabled: bool = False
    """Replace compute by the latencies below (a simulated run; every output says so).
    Needs env.kind = "minidesk": its tasks run behind `env.latency` figures."""
    scale: float = Field(default=1.0, gt=0)
    """Multiplier of every latency (environment, generation, train step, weight load): 0.1
    runs ten times faster than the regime it models, with every ratio kept."""
    env: EnvLatency = EnvLatency(success_rate=0.275)
    """Environment latencies and the simulated success rate (default 27.5%: UI-TARS-1.5-7B on
    OSWorld before DART's training)."""
    finish_prob: float = Field(default=0.08, ge=0, le=1)
    """Chance that a simulated response ends the episode (`finished()`); otherwise it clicks a
    uniformly random point. 0.08 gives episodes of 12 steps on average, cut at
    rollout.max_steps."""
    rollout_gpus: int = Field(default=8, ge=1)
    """Simulated GPUs per policy replica, one model copy each; requests go to the one with
    the least work."""
    prompt_tokens: int = Field(default=14000, ge=1)
    """Prompt tokens prefilled per turn: five screenshots at 1920x1080 (about 2,650 tokens
    each after Qwen2.5-VL's 28-pixel merge) plus text. The history window moves every turn,
    so the prefix cache does not hold it."""
    prefill_tokens_per_s: float = Field(default=30000.0, gt=0)
    """Prefill rate of one GPU (compute-bound): 8.3 B parameters x 2 FLOPs per token at 50%
    of an H100's 989 bf16 TFLOPS, about 30,000 tokens/s. One prefill at a time per GPU."""
    vision_s_per_image: float = Field(default=0.03, ge=0)
    """Vision encoder per screenshot (675 M-parameter ViT over ~10,600 patches at 50% MFU)."""
    decode_step_s: float = Field(default=0.007, gt=0)
    """One decode step with one sequence: 16.6 GB of weights read at 3.35 TB/s is 5 ms; vLLM
    reaches about 70% of the bandwidth."""
    decode_step_s_per_seq: float = Field(default=0.00025, ge=0)
    """What each running sequence adds to a decode step: its KV cache (57 KB per token for
    Qwen2.5-7B's 28 layers x 4 KV heads x 128, bf16; ~14,000 tokens) read at 3.35 TB/s."""
    max_running: int = Field(default=64, ge=1)
    """Sequences one GPU decodes at once (KV-cache capacity: ~55 GB left after the weights,
    ~0.8 GB per sequence); more wait."""
    response_tokens_median: int = Field(default=100, ge=1)
    """Median response length (`Thought: ... Action: ...`), tokens."""
    response_tokens_sigma: float = Field(default=0.5, ge=0)
    """Lognormal sigma of the response length (clipped to policy.max_new_tokens)."""
    train_tokens_per_sample: int = Field(default=14100, ge=1)
    """Tokens the trainer processes per step sample (the prompt it was sampled with plus the
    response): samples are step-wise, each with its own five screenshots."""
    train_tokens_per_s: float = Field(default=42000.0, gt=0)
    """Trainer throughput: 8 H100s at 35% MFU over 8 N FLOPs per token (forward and backward
    6 N, the reference model's forward 2 N; N = 8.3 B): 42,000 tokens/s."""
    train_overhead_s: float = Field(default=5.0, ge=0)
    """Fixed cost of an optimizer step (FSDP all-gathers, the optimizer update)."""
    weight_load_s: float = Field(default=2.5, ge=0)
    """A replica loading a new version: 16.6 GB through the object store at the 7.4 GB/s
    measured for 1 B bf16 here (2.2 s) plus the host-to-GPU copy."""

    @model_validator(mode="after")
    def _env_scale(self) -> TimingConfig:
        if self.env.scale != 1.0:
            raise ValueError("timing.env.scale: set timing.scale, which scales everything")
        return self

    def env_latency(self) -> EnvLatency:
        """What the environment sessions of a timing-mode run are given."""
        return self.env.model_copy(update={"scale": self.scale})

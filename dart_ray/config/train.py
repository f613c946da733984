"""The learner's side of a run: `[algo]` (the loss and its off-policy correction) and `[train]`
(workers, optimizer, batches, checkpoints)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dart_ray.config.base import Section


class AlgoConfig(Section):
    objective: Literal["grpo", "rft"] = "grpo"
    """`grpo`: RL with DART's curation (group advantages, replay, the clipped loss below).
    `rft`: rejection-sampling fine-tuning, the control agent-RL papers compare against: the
    same loop and budget, but the curator keeps only the policy's own successful
    trajectories (no advantages, no replay) and the loss is their plain negative
    log-likelihood (`dart_ray.algo.losses.nll_loss`; `loss` and the off-policy correction are
    not used)."""
    loss: Literal["ppo", "gspo"] = "ppo"
    """Token-level PPO clip or sequence-level GSPO."""
    eps_low: float = Field(default=0.1, gt=0)
    """Lower clip range (ratio >= 1 - eps_low)."""
    eps_high: float = Field(default=0.28, gt=0)
    """Upper clip range (ratio <= 1 + eps_high)."""
    dual_clip: float | None = Field(default=10.0, gt=1)
    """Dual-clip bound c for negative advantages (None disables)."""
    off_policy: Literal["token_tis", "token_mask", "seq_mask"] = "token_tis"
    """Correction of behaviour -> proximal policy (docs/TRAINING.md): `token_tis` weights each
    token by min(r, is_cap) with r = pi_prox / pi_behaviour; `token_mask` keeps r where it lies
    in [mask_low, mask_high] and drops the token otherwise (IcePop); `seq_mask` drops whole
    sequences whose geometric-mean ratio leaves the band and weights the rest by it."""
    is_cap: float = Field(default=1.0, gt=0)
    """Cap C of the truncated importance weight min(pi_prox / pi_behaviour, C) (`token_tis`)."""
    mask_low: float = Field(default=0.5, ge=0)
    """Lower edge of the ratio band of `token_mask` and `seq_mask`."""
    mask_high: float = Field(default=2.0, gt=0)
    """Upper edge of the ratio band of `token_mask` and `seq_mask`."""
    kl_beta: float = Field(default=0.0, ge=0)
    """KL coefficient to the frozen reference model; 0 disables the reference model."""
    advantage: Literal["trajectory", "step_weighted"] = "trajectory"
    """GRPO statistics per trajectory, or DART-GUI's step-count-weighted variant."""
    credit: Literal["trajectory", "step"] = "trajectory"
    """`trajectory`: every step of a trajectory carries its trajectory's GRPO advantage.
    `step` (GiGPO): each step also gets `step_weight` x its advantage among the group's steps
    that acted on the same screen (an anchor state), so the action that made the difference
    at a state every rollout passed through gets more credit than the steps around it
    (docs/TRAINING.md, "Step-level credit")."""
    step_gamma: float = Field(default=0.95, gt=0, le=1)
    """Discount gamma of a step's return gamma^(T-1-t) x R with `credit = "step"`: at a shared
    state, the action from which the episode ended sooner gets the higher return (1: none)."""
    step_weight: float = Field(default=1.0, ge=0)
    """omega, the weight of the step-level advantage added to the trajectory's (0 is
    trajectory-level credit)."""
    step_norm: Literal["mean", "std"] = "mean"
    """Normalisation of the returns within an anchor state: `mean` only centres them (the step
    advantage stays on the reward's scale); `std` also divides by their std, so where every
    rollout from a state succeeded, one step's discount weighs as much as success does."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How token losses are reduced to one number: `token_mean` (every token of the batch
    weighs the same), `seq_mean_token_mean` (every step sample weighs the same, so a short
    response's tokens weigh more), `seq_mean_token_sum_norm` (token sums over a fixed length,
    `loss_norm_tokens`; Dr. GRPO). docs/TRAINING.md says why the default is `token_mean`."""
    loss_norm_tokens: int | None = Field(default=None, ge=1)
    """The fixed length L of `seq_mean_token_sum_norm` (default: `policy.max_new_tokens`)."""

    @model_validator(mode="after")
    def _band(self) -> AlgoConfig:
        if not self.mask_low < 1 < self.mask_high:
            raise ValueError(
                f"the ratio band [algo.mask_low, algo.mask_high] = [{self.mask_low}, "
                f"{self.mask_high}] must contain 1 (on-policy tokens must be kept)"
            )
        return self


class LoraConfig(Section):
    """`[train.lora]`: train low-rank adapters instead of every weight (docs/TRAINING.md,
    "LoRA"). Only the adapters are trained, published and checkpointed."""

    enabled: bool = False
    """Train LoRA adapters (peft) on the policy; the base weights stay frozen."""
    rank: int = Field(default=32, ge=1)
    """r, the adapters' rank ("LoRA Without Regret": RL is matched by full fine-tuning even at
    small ranks; 32 on a 7B model is ~80 MB of bf16 adapters)."""
    alpha: float = Field(default=64.0, gt=0)
    """The adapters' output is scaled by alpha / rank."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input in training (0: the trainer's and the engine's log-probs
    of a sample are the same function)."""
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Names of the linear layers that get adapters (every attention and MLP projection of the
    language model: the placement "LoRA Without Regret" recommends)."""
    vision: bool = False
    """Also adapt the vision tower's layers of those names (add `qkv` and `proj` to
    `target_modules` for its attention). Off: the vision encoder stays the base's, as vLLM
    applies LoRA only to the language model."""


class TrainConfig(Section):
    num_workers: int = Field(default=1, ge=1)
    """Ray Train workers (FSDP2 ranks)."""
    use_gpu: bool = False
    """Train on GPUs (NCCL) instead of CPUs (gloo)."""
    cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPUs each train worker reserves."""
    gpus_per_worker: float = Field(default=1.0, gt=0)
    """GPUs each train worker reserves when use_gpu (a fraction shares a GPU with a policy
    replica, e.g. 0.5 and policy.num_gpus = 0.5 on a one-GPU machine)."""
    max_restarts: int = Field(default=3, ge=0)
    """Times the trainer is started again after a worker died (from the newest COMPLETED
    checkpoint, in a new trainer session); the run fails after that."""
    lr: float = Field(default=1e-4, ge=0)
    """AdamW learning rate (DART-GUI: 1e-6 on UI-TARS-7B). 0 is the control run: every part
    runs and every row is trained, but the weights never move (docs/LEARNING.md)."""
    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(default=2.0, gt=0)
    """Gradient norm clip."""
    tokens_per_rank: int = Field(default=8192, ge=1)
    """Token budget of one rank's micro-batch."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over each curated batch. With ppo_epochs x minibatches > 1 the batch takes
    several optimizer steps, and the clip (ratio to the proximal policy) bounds how far."""
    minibatches: int = Field(default=2, ge=1)
    """Optimizer steps per pass: the batch is split into this many parts. 2 by default, so the
    trust region acts: with one step per batch the ratio to the proximal policy is 1 at the
    only gradient and the clip never binds. Measured on the default run, same seed: 1 ->
    +26.5 points held out, 2 -> +37.5 (docs/LEARNING.md)."""
    publish_timeout_s: float = Field(default=900.0, gt=0)
    """Seconds a weight publication may take (every policy replica loading the new version,
    after the generations in flight drain) before the trainer fails with the reason. A
    publication whose policy application is gone (deleted by an operator, `serve.shutdown`)
    fails at once, naming it, instead of waiting."""
    sync_every: int = Field(default=1, ge=1)
    """Optimizer steps between weight publications."""
    save_every: int = Field(default=5, ge=1)
    """Published versions between durable checkpoints."""
    warm_object_store: bool = False
    """Rank 0 writes its node's free object store once when the trainer starts, while the
    first batch is still being rolled out. A process maps the store lazily and the store
    places objects at fresh addresses until it has gone round its capacity, so the first
    (store size / weights size) publishes fault in a page per 4 KiB (437 MB: 0.12-0.17 s
    against 0.03-0.05 s once mapped; docs/BENCHMARKS.md); warming pays those faults up front,
    off the critical path (about 0.35 s per GB here). It also makes the whole store resident
    at once, so it is off for the laptop default."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    lora: LoraConfig = LoraConfig()
    """LoRA adapters instead of full fine-tuning (`[train.lora]`)."""

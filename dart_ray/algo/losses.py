"""Policy losses over packed step samples. Shapes: B samples, T response tokens (padded).

All functions take per-token log-probs of the current policy `logp` (with gradient), of the
policy before this update `logp_old` (recomputed by the trainer, no gradient), and of the
behaviour policy that sampled the tokens `logp_behaviour` (logged by the inference engine).
They return `(loss, metrics)`.

Truncated importance sampling corrects for the gap between the inference engine and the
trainer (different kernels, and in the decoupled mode possibly older weights):

    w_t = min(exp(logp_old_t - logp_behaviour_t), C)                 (TIS; stop-gradient)

Token-level PPO clip with asymmetric bounds (DAPO's clip-higher) and dual clip:

    r_t  = exp(logp_t - logp_old_t)
    l_t  = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))
    l_t  = min(l_t, -A c)          for A < 0                          (dual clip, c > 1)

GSPO replaces the token ratio with the length-normalised sequence ratio
s_i = exp(mean_t(logp_t - logp_old_t)) and clips it per sequence.

KL to a frozen reference uses the low-variance k3 estimator (Schulman, "Approximating KL"):

    kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  >= 0
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def aggregate(loss_tok: torch.Tensor, mask: torch.Tensor, agg: LossAgg) -> torch.Tensor:
    """(B, T) token losses -> scalar: mean over all real tokens, or mean of per-sample means."""
    if agg == "token_mean":
        return masked_mean(loss_tok, mask)
    if agg == "seq_mean_token_mean":
        return masked_mean(loss_tok, mask, dim=1).mean()
    raise ValueError(f"unknown loss aggregation {agg!r}")


def truncated_is_weight(
    logp_old: torch.Tensor, logp_behaviour: torch.Tensor, cap: float
) -> torch.Tensor:
    """w = min(pi_old / pi_behaviour, C) per token, without gradient."""
    return torch.exp(logp_old - logp_behaviour).clamp(max=cap).detach()


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) from samples of pi."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1


def _expand(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    is_weight: torch.Tensor | None = None,
    agg: LossAgg = "token_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate. advantages: (B,) per sample or (B, T) per token."""
    adv = _expand(advantages, logp).detach()
    ratio = torch.exp(logp - logp_old.detach())
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss_tok = torch.maximum(unclipped, clipped)
    dual_frac = torch.zeros((), dtype=logp.dtype)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual = (adv < 0) & (loss_tok > bound)
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, bound), loss_tok)
        dual_frac = masked_mean(dual.to(logp.dtype), mask)
    if is_weight is not None:
        loss_tok = loss_tok * is_weight
    loss = aggregate(loss_tok, mask, agg)
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).to(logp.dtype), mask)
        metrics = {
            "clip_frac": float(clip_frac),
            "dual_clip_frac": float(dual_frac),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "approx_kl_old": float(masked_mean(logp_old - logp, mask)),
        }
    return loss, metrics


def gspo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence-level clipped surrogate (GSPO). advantages: (B,). Mean over sequences."""
    log_s = masked_mean(logp - logp_old.detach(), mask, dim=1)  # (B,)
    s = torch.exp(log_s)
    adv = advantages.detach()
    unclipped = -adv * s
    clipped = -adv * s.clamp(1 - eps_low, 1 + eps_high)
    loss_seq = torch.maximum(unclipped, clipped)
    if is_weight is not None:
        # sequence weight: geometric mean of the token weights, capped like them
        w_seq = torch.exp(masked_mean(torch.log(is_weight.clamp(min=1e-12)), mask, dim=1))
        loss_seq = loss_seq * w_seq.detach()
    loss = loss_seq.mean()
    with torch.no_grad():
        metrics = {
            "clip_frac": float((clipped > unclipped).to(logp.dtype).mean()),
            "ratio_mean": float(s.mean()),
        }
    return loss, metrics

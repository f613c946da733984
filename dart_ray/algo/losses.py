"""Policy losses over packed step samples. Shapes: B samples, T response tokens (padded).

Three policies meet here, kept apart as in decoupled PPO (Hilton et al. 2022; AReaL):

- *behaviour* `logp_behaviour`: logged by the inference engine from the distribution it
  sampled from (possibly older weights, other kernels);
- *proximal* `logp_old`: the trainer's weights before this batch's first optimizer step,
  computed once (no gradient);
- *current* `logp`: under the gradient.

The importance weight corrects behaviour -> proximal; the clip bounds current / proximal. With
one optimizer step per batch the current policy *is* the proximal one at the gradient, so
the ratio is 1 and the clip cannot bind; it binds from the second step on (`train.ppo_epochs`,
`train.minibatches`). The off-policy correction, r_t = exp(logp_old_t - logp_behaviour_t):

    token_tis:   w_t = min(r_t, C)                                    (truncated IS)
    token_mask:  w_t = r_t if lo <= r_t <= hi else 0                  (IcePop-style)
    seq_mask:    s_i = exp(mean_t log r_t); w_t = s_i if lo <= s_i <= hi else 0

all without gradient. `seq_mask` uses the geometric mean, as GSPO does for its ratio: the
plain product of a few dozen token ratios spans orders of magnitude and would mask almost
every sequence.

Token-level PPO clip with asymmetric bounds (DAPO's clip-higher) and dual clip:

    r_t  = exp(logp_t - logp_old_t)
    l_t  = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))
    l_t  = min(l_t, -A c)          for A < 0                          (dual clip, c > 1)

Rejection-sampling fine-tuning (`nll_loss`, the `rft` control) drops all of it: the curator
keeps only successful trajectories and the loss is their plain negative log-likelihood.

GSPO replaces the token ratio with the length-normalised sequence ratio
s_i = exp(mean_t(logp_t - logp_old_t)) and clips it per sequence.

KL to a frozen reference uses the low-variance k3 estimator (Schulman, "Approximating KL"):

    kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  >= 0
"""

from __future__ import annotations

import math
from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
"""How (B, T) token losses become one number (verl's names):

    token_mean               sum_i sum_t l_it / sum_i T_i        every token weighs the same
    seq_mean_token_mean      1/B sum_i (1/T_i sum_t l_it)         every sample weighs the same
    seq_mean_token_sum_norm  1/B sum_i (1/L sum_t l_it)           a fixed length L (Dr. GRPO)

`seq_mean_token_mean` gives a short response's tokens more weight than a long one's (the
length bias Dr. GRPO removes); `token_mean`'s denominator moves with the batch's total
length; `seq_mean_token_sum_norm` weighs every token the same whatever the batch holds.
A sample is one step, so under all three a trajectory weighs by its number of steps: each
step is a decision its advantage credits (docs/TRAINING.md)."""


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def aggregate(
    loss_tok: torch.Tensor, mask: torch.Tensor, agg: LossAgg, norm_tokens: int | None = None
) -> torch.Tensor:
    """(B, T) token losses -> scalar (`LossAgg`); `norm_tokens` is L of
    `seq_mean_token_sum_norm` (default: the padded length T)."""
    if agg == "token_mean":
        return masked_mean(loss_tok, mask)
    if agg == "seq_mean_token_mean":
        return masked_mean(loss_tok, mask, dim=1).mean()
    if agg == "seq_mean_token_sum_norm":
        length = norm_tokens or loss_tok.shape[-1]
        return ((loss_tok * mask.to(loss_tok.dtype)).sum(1) / length).mean()
    raise ValueError(f"unknown loss aggregation {agg!r}")


def truncated_is_weight(
    logp_old: torch.Tensor, logp_behaviour: torch.Tensor, cap: float
) -> torch.Tensor:
    """w = min(pi_old / pi_behaviour, C) per token, without gradient."""
    return torch.exp(logp_old - logp_behaviour).clamp(max=cap).detach()


OffPolicy = Literal["token_tis", "token_mask", "seq_mask"]

CAP_TOL = 1e-3
"""A token counts as capped (`is_capped_frac`) when its log-ratio exceeds log(cap) by more
than this: the cap then removes more than 0.1% of its weight. Below it the difference is the
engine's and the trainer's float arithmetic (1e-7 to 1e-4 here), not off-policyness."""


def off_policy_weights(
    logp_old: torch.Tensor,
    logp_behaviour: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: OffPolicy = "token_tis",
    cap: float = 1.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) per-token weights (0 on padding, no gradient) and the fractions of real tokens
    they capped (`is_capped_frac`) or dropped (`is_masked_frac`)."""
    m = mask.to(logp_old.dtype)
    log_r = (logp_old - logp_behaviour).detach()
    r = torch.exp(log_r)
    capped = torch.zeros_like(m, dtype=torch.bool)
    if mode == "token_tis":
        w = r.clamp(max=cap)
        # capped only where the cap takes a real part of the weight: a ratio of 1 + 1e-7
        # (float noise between engine and trainer on an on-policy token) is not capped
        capped = log_r > math.log(cap) + CAP_TOL
        dropped = r <= 0  # the trainer gives the token no mass (outside its top-k / top-p)
    elif mode == "token_mask":
        dropped = (r < low) | (r > high)
        w = torch.where(dropped, torch.zeros_like(r), r)
    elif mode == "seq_mask":
        s = torch.exp(masked_mean(log_r, mask, dim=1))  # (B,)
        drop_seq = (s < low) | (s > high)
        w = torch.where(drop_seq, torch.zeros_like(s), s).unsqueeze(-1).expand_as(r)
        dropped = drop_seq.unsqueeze(-1).expand_as(r)
    else:
        raise ValueError(f"unknown off-policy correction {mode!r}")
    metrics = {
        "is_capped_frac": float(masked_mean(capped.to(m.dtype), m)),
        "is_masked_frac": float(masked_mean(dropped.to(m.dtype), m)),
    }
    return (w * m).detach(), metrics


def mismatch_metrics(
    logp_old: torch.Tensor, logp_behaviour: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the trainer's log-probs are from the engine's on the sampled tokens: mean
    |difference| and the k3 estimate of KL(behaviour || proximal) (samples come from the
    behaviour policy, so that is the direction k3 estimates without bias), over the tokens
    the proximal policy gives mass; `no_mass_frac` is the share it gives none (a stale token
    outside its top-k / top-p, at the trainer's log-prob floor: the KL is infinite there, and
    one such token's ~1e4 would swamp the mean)."""
    d = (logp_old - logp_behaviour).detach()
    m = mask.to(d.dtype)
    has_mass = (logp_old > NO_MASS).to(d.dtype) * m
    return {
        "logp_diff_abs": float(masked_mean(d.abs(), has_mass)),
        "mismatch_kl_k3": float(masked_mean(torch.exp(d) - d - 1, has_mass)),
        "no_mass_frac": float(masked_mean(m - has_mass, m)),
    }


NO_MASS = -1e3
"""A log-prob at or below this is the trainer's floor for "no mass" (`train.forward.LOGP_FLOOR`,
-1e4), far below any real token's."""


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
    norm_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate. advantages: (B,) per sample or (B, T) per token."""
    adv = _expand(advantages, logp).detach()
    # capped at e^20 (zero gradient beyond): a token the proximal policy gives no mass
    # (outside its top-p) must not make inf * 0 = nan; such a token has IS weight 0
    ratio = torch.exp((logp - logp_old.detach()).clamp(max=20.0))
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
    loss = aggregate(loss_tok, mask, agg, norm_tokens)
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
        # sequence weight: geometric mean of the weights of the tokens the correction kept
        # (a sequence with none kept gets 0)
        kept = mask.bool() & (is_weight > 0)
        log_w = torch.log(is_weight.clamp(min=1e-30))
        w_seq = torch.where(
            kept.any(1), torch.exp(masked_mean(log_w, kept, dim=1)), torch.zeros_like(log_s)
        )
        loss_seq = loss_seq * w_seq.detach()
    loss = loss_seq.mean()
    with torch.no_grad():
        metrics = {
            "clip_frac": float((clipped > unclipped).to(logp.dtype).mean()),
            "ratio_mean": float(s.mean()),
        }
    return loss, metrics


def nll_loss(
    logp: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: LossAgg = "token_mean",
    norm_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection-sampling fine-tuning's loss: the weighted negative log-likelihood of the
    sampled tokens, l_t = -w_i logp_t, with w_i = 1 for each kept success (the curator keeps
    nothing else); no ratio, clip or importance weight. weights: (B,) per sample."""
    w = _expand(weights, logp).detach()
    loss = aggregate(-w * logp, mask, agg, norm_tokens)
    with torch.no_grad():
        metrics = {"nll": float(masked_mean(-logp, mask))}
    return loss, metrics

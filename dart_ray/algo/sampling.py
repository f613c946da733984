"""The sampling distribution, defined once for the engine that samples and the trainer that
scores.

RL is only sound when the log-prob the engine records for a token is the log-prob of the
distribution the token was drawn from, and when the trainer's recomputation is of that same
distribution. Both sides therefore call `process_logits`, which turns next-token logits into
the logits of the distribution actually sampled from:

    suppress tokens -> divide by temperature -> top-k -> top-p (nucleus)

in that order (vLLM's order: temperature, then top-k, then top-p on the result). Tokens
outside the support get -inf. Greedy decoding (temperature 0) records the model's own
distribution at temperature 1, with the suppressed tokens removed: a point mass has no
useful log-prob, so RL refuses greedy rollouts (`dart_ray.config`) and evaluation is the
only user of it.

Top-k keeps every token whose logit reaches the k-th largest (ties kept, as transformers and
vLLM do). Top-p keeps the smallest prefix of the tokens sorted by probability whose mass
reaches p: a token is dropped when the mass strictly before it already reaches p, so the
most likely token always stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """The knobs that shape the sampled distribution (not length or stop strings)."""

    temperature: float = 1.0
    """0 means greedy: the recorded distribution is then the temperature-1 one."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 keeps all."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether some tokens of the tempered distribution get no mass."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """True where a token falls outside the top k (ties with the k-th kept). (..., V)"""
    if k <= 0 or k >= logits.shape[-1]:
        return torch.zeros_like(logits, dtype=torch.bool)
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits < kth


def top_p_mask(logits: torch.Tensor, p: float) -> torch.Tensor:
    """True where a token falls outside the nucleus of mass p. (..., V)"""
    if p >= 1:
        return torch.zeros_like(logits, dtype=torch.bool)
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each sorted token
    drop_sorted = before >= p
    return drop_sorted.scatter(-1, order, drop_sorted)


def process_logits(
    logits: torch.Tensor, spec: SamplingSpec, suppressed: torch.Tensor | None = None
) -> torch.Tensor:
    """(..., V) logits -> (..., V) logits of the distribution sampled from (-inf outside).

    Differentiable in the kept logits: the masks are decisions, the kept values carry the
    gradient, so the trainer can use it under autograd."""
    z = logits
    if suppressed is not None and suppressed.numel():
        z = z.index_fill(-1, suppressed.to(z.device), float("-inf"))
    if spec.greedy:
        return z
    if spec.temperature != 1:
        z = z / spec.temperature
    if spec.top_k > 0:
        z = z.masked_fill(top_k_mask(z.detach(), spec.top_k), float("-inf"))
    if spec.top_p < 1:
        z = z.masked_fill(top_p_mask(z.detach(), spec.top_p), float("-inf"))
    return z


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each distribution given as log-probs (-inf allowed). (..., V) -> (...)"""
    p = logp.exp()
    return -(p * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)

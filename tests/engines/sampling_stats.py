"""A goodness-of-fit check shared by the engine tests: are the tokens an engine sampled drawn
from the distribution whose log-probs it recorded?

Every sample is the first response token of the same prompt, so all of them come from one
distribution `p` (V,), built by hand by the test. Three checks:

1. each sampled token's recorded log-prob is log p(token) (1e-3);
2. Pearson's chi-square over bins of tokens by rank under p (bins merged until each expects
   at least 20 samples), against the critical value at alpha = 1e-4, so a correct engine fails
   about once in 10,000 runs;
3. the share of samples ranked 50 or beyond is within 4.5 binomial standard deviations of
   p's mass there (transformers' default top-k of 50 once made that share 0).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

Z_1E4 = 3.719  # standard normal quantile for alpha = 1e-4 (one-sided)


def chi2_critical(dof: int, z: float = Z_1E4) -> float:
    """Upper critical value of chi-square(dof) (Wilson-Hilferty; within 1% for dof >= 3)."""
    k = float(dof)
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def rank_bins(p: torch.Tensor, n: int, min_expected: float = 20.0) -> list[list[int]]:
    """Token ids grouped by rank under p, each group expecting >= min_expected of n draws.
    Tokens with p = 0 go in a group of their own (expected 0: any draw there is a failure)."""
    order = torch.argsort(p, descending=True).tolist()
    bins: list[list[int]] = [[]]
    mass = 0.0
    for t in order:
        if p[t] <= 0:
            break
        bins[-1].append(t)
        mass += float(p[t])
        if mass * n >= min_expected:
            bins.append([])
            mass = 0.0
    if not bins[-1]:
        bins.pop()
    elif len(bins) > 1:  # a short tail joins the last full bin
        bins[-2].extend(bins.pop())
    return bins


def check_samples(tokens: Sequence[int], recorded: Sequence[float], p: torch.Tensor) -> dict:
    """Assert the three checks above; returns the statistics (for messages and docs)."""
    n = len(tokens)
    p = p.double()
    logp = p.log()
    for t, lp in zip(tokens, recorded, strict=True):
        assert abs(lp - float(logp[t])) < 1e-3, f"token {t}: recorded {lp}, log p {logp[t]}"
    counts = Counter(tokens)
    outside = sum(c for t, c in counts.items() if p[t] <= 0)
    assert outside == 0, f"{outside} samples outside the distribution's support"
    bins = rank_bins(p, n)
    chi2 = 0.0
    for b in bins:
        expected = float(p[b].sum()) * n
        observed = sum(counts.get(t, 0) for t in b)
        chi2 += (observed - expected) ** 2 / expected
    dof = len(bins) - 1
    critical = chi2_critical(dof)
    assert chi2 < critical, f"chi-square {chi2:.1f} >= {critical:.1f} ({dof} dof)"
    order = torch.argsort(p, descending=True)
    tail = set(order[50:].tolist())
    tail_mass = float(p[order[50:]].sum())
    tail_share = sum(c for t, c in counts.items() if t in tail) / n
    sd = math.sqrt(max(tail_mass * (1 - tail_mass), 1e-12) / n)
    assert abs(tail_share - tail_mass) <= 4.5 * sd, (
        f"{tail_share:.3f} of samples ranked >= 50, where the distribution has {tail_mass:.3f}"
    )
    return {"n": n, "chi2": chi2, "dof": dof, "tail_mass": tail_mass, "tail_share": tail_share}

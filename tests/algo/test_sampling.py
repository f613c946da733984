"""The sampling distribution both the engine and the trainer use, on numbers worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dart_ray.algo.sampling import SamplingSpec, entropy_of, process_logits

INF = float("inf")


def probs(z: torch.Tensor) -> list[float]:
    return z.softmax(-1).tolist()


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    # p = [0.5, 0.3, 0.15, 0.05], top_p 0.8: the mass before token 2 is 0.8 >= 0.8, so tokens
    # 2 and 3 go; the rest renormalise to [0.5, 0.3] / 0.8 = [0.625, 0.375].
    z = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert probs(process_logits(z, SamplingSpec(top_p=0.8))) == pytest.approx(
        [0.625, 0.375, 0.0, 0.0]
    )
    # top_p 0.81: token 2 has 0.8 < 0.81 before it and stays: [0.5, 0.3, 0.15] / 0.95
    assert probs(process_logits(z, SamplingSpec(top_p=0.81))) == pytest.approx(
        [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]
    )
    # a tiny top_p keeps the top token alone
    assert probs(process_logits(z, SamplingSpec(top_p=1e-6))) == pytest.approx([1, 0, 0, 0])


def test_temperature_then_top_k_then_top_p() -> None:
    # logits [2, 1, 1, 0, -1] at T = 0.5 -> [4, 2, 2, 0, -2]; top_k 3 keeps ties with the
    # 3rd largest (2): [4, 2, 2]; softmax of [4, 2, 2] = [e^2, 1, 1] / (e^2 + 2)
    #   = [0.7870, 0.1065, 0.1065]; then top_p 0.75: mass before token 1 is 0.787 >= 0.75,
    # so only token 0 stays.
    z = torch.tensor([2.0, 1.0, 1.0, 0.0, -1.0])
    e2 = math.exp(2)
    k = process_logits(z, SamplingSpec(temperature=0.5, top_k=3))
    assert probs(k) == pytest.approx([e2 / (e2 + 2), 1 / (e2 + 2), 1 / (e2 + 2), 0, 0], abs=1e-6)
    kp = process_logits(z, SamplingSpec(temperature=0.5, top_k=3, top_p=0.75))
    assert probs(kp) == pytest.approx([1, 0, 0, 0, 0])
    # top_k 2 with a tie at the 2nd place keeps both tied tokens (3 tokens), as vLLM does
    assert (process_logits(z, SamplingSpec(top_k=2)) > -INF).tolist() == [1, 1, 1, 0, 0]


def test_suppression_and_greedy() -> None:
    # greedy records the temperature-1 distribution without the suppressed tokens:
    # softmax of [0, ln 3] over tokens 1 and 2 = [1/4, 3/4]
    z = torch.tensor([5.0, 0.0, math.log(3)])
    out = process_logits(z, SamplingSpec(temperature=0.0, top_p=0.1), torch.tensor([0]))
    assert probs(out) == pytest.approx([0.0, 0.25, 0.75])


def test_entropy_with_zero_mass() -> None:
    # [0.625, 0.375, 0]: -(0.625 ln 0.625 + 0.375 ln 0.375) = 0.66156
    logp = torch.tensor([0.625, 0.375, 0.0]).log()
    assert float(entropy_of(logp)) == pytest.approx(0.66156, abs=1e-5)


def test_gradient_flows_only_through_kept_tokens() -> None:
    z = torch.tensor([[1.0, 0.5, -3.0]], requires_grad=True)
    logp = process_logits(z, SamplingSpec(top_p=0.6)).log_softmax(-1)
    # token 2 is cut: log-prob -inf; token 0 and 1 renormalise; d log p0 / d z2 = 0
    assert logp[0, 2] == -INF
    logp[0, 0].backward()
    assert z.grad is not None and z.grad[0, 2] == 0 and torch.isfinite(z.grad).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"temperature": -1}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0}, "top_p")],
)
def test_bad_settings_are_named(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=match):
        SamplingSpec(**kwargs)

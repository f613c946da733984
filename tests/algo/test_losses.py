"""Policy losses against numbers worked out by hand (ln values rounded in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from dart_ray.algo.losses import (
    aggregate,
    gspo_loss,
    kl_k3,
    mismatch_metrics,
    nll_loss,
    off_policy_weights,
    ppo_clip_loss,
    truncated_is_weight,
)

LN = math.log


def test_ppo_clip_asymmetric_bounds() -> None:
    # One sample, three tokens, A = +1, eps_low 0.1, eps_high 0.28.
    # ratios r = [0.5, 1.0, 2.0]; for A > 0 loss = max(-r, -clip(r)) = -min(r, clip(r)):
    #   r=0.5 -> clip 0.9 -> -min(0.5, 0.9) = -0.5
    #   r=1.0 -> -1.0
    #   r=2.0 -> clip 1.28 -> -min(2.0, 1.28) = -1.28 (clipped)
    # token mean = (-0.5 - 1.0 - 1.28) / 3 = -0.92666...
    logp_old = torch.zeros(1, 3)
    logp = torch.tensor([[LN(0.5), 0.0, LN(2.0)]], requires_grad=True)
    mask = torch.ones(1, 3)
    loss, m = ppo_clip_loss(logp, logp_old, torch.tensor([1.0]), mask, eps_low=0.1, eps_high=0.28)
    assert loss.item() == pytest.approx(-2.78 / 3)
    assert m["clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    # d/dlogp of -r/3 = -r/3 for unclipped tokens; 0 for the clipped one
    assert logp.grad[0].tolist() == pytest.approx([-0.5 / 3, -1 / 3, 0.0])  # type: ignore[index]


def test_ppo_negative_advantage_and_dual_clip() -> None:
    # A = -1, ratios [0.5, 4.0, 20.0], eps 0.2/0.2, dual clip c = 10.
    # for A < 0: loss = max(r, clip(r)):
    #   r=0.5  -> max(0.5, 0.8) = 0.8 (clipped from below)
    #   r=4.0  -> max(4.0, 1.2) = 4.0; dual clip min(4.0, 10) = 4.0
    #   r=20.0 -> 20.0; dual clip -> 10.0
    # mean = (0.8 + 4 + 10) / 3 = 4.9333...
    logp = torch.tensor([[LN(0.5), LN(4.0), LN(20.0)]])
    loss, m = ppo_clip_loss(
        logp,
        torch.zeros(1, 3),
        torch.tensor([-1.0]),
        torch.ones(1, 3),
        eps_low=0.2,
        eps_high=0.2,
        dual_clip=10.0,
    )
    assert float(loss) == pytest.approx(14.8 / 3)
    assert m["dual_clip_frac"] == pytest.approx(1 / 3)


def test_mask_excludes_padding_and_aggregation_modes() -> None:
    # two samples, A = +1, ratio 1 everywhere -> token loss -1 on real tokens, 5.0 on padding
    # (padding must never count). Sample 0 has 1 real token, sample 1 has 3.
    loss_tok = torch.tensor([[-1.0, 5.0, 5.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    # token_mean: (-1 - 6) / 4 = -1.75 ; seq_mean_token_mean: (-1 + -2) / 2 = -1.5
    assert float(aggregate(loss_tok, mask, "token_mean")) == pytest.approx(-1.75)
    assert float(aggregate(loss_tok, mask, "seq_mean_token_mean")) == pytest.approx(-1.5)
    # seq_mean_token_sum_norm with L = 4: (-1 / 4 + -6 / 4) / 2 = -0.875; L defaults to T = 3:
    # (-1 / 3 + -6 / 3) / 2 = -7 / 6
    agg = "seq_mean_token_sum_norm"
    assert float(aggregate(loss_tok, mask, agg, 4)) == pytest.approx(-0.875)
    assert float(aggregate(loss_tok, mask, agg)) == pytest.approx(-7 / 6)


def test_a_fixed_length_normaliser_weighs_every_token_the_same_across_batches() -> None:
    # a token's gradient under seq_mean_token_sum_norm is A / (B L) whatever the other
    # samples' lengths; under seq_mean_token_mean it is A / (B T_i): a 1-token response's
    # token weighs 3x a 3-token response's. d loss / d logp at ratio 1 = -A * w.
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, 1.0])
    for agg, want in [
        ("seq_mean_token_sum_norm", [[-1 / 8, 0, 0], [-1 / 8, -1 / 8, -1 / 8]]),
        ("seq_mean_token_mean", [[-1 / 2, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]),
    ]:
        logp.grad = None
        loss, _ = ppo_clip_loss(
            logp, logp.detach(), adv, mask, eps_low=0.2, eps_high=0.2, agg=agg, norm_tokens=4
        )
        loss.backward()
        assert torch.allclose(logp.grad, torch.tensor(want))  # type: ignore[arg-type]


def test_truncated_is_weight_caps() -> None:
    # pi_old / pi_behaviour = [0.5, 1, 3] ; cap 1.0 -> [0.5, 1, 1] ; cap 2.0 -> [0.5, 1, 2]
    old = torch.tensor([LN(0.5), 0.0, LN(3.0)])
    beh = torch.zeros(3)
    assert truncated_is_weight(old, beh, 1.0).tolist() == pytest.approx([0.5, 1.0, 1.0])
    assert truncated_is_weight(old, beh, 2.0).tolist() == pytest.approx([0.5, 1.0, 2.0])


def test_is_weight_scales_token_losses() -> None:
    # A = 1, ratio 1: token loss -1; weights [0.5, 1.0] -> mean(-0.5, -1.0) = -0.75
    loss, _ = ppo_clip_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.ones(1, 2),
        eps_low=0.2,
        eps_high=0.2,
        is_weight=torch.tensor([[0.5, 1.0]]),
    )
    assert float(loss) == pytest.approx(-0.75)


def test_kl_k3() -> None:
    # d = ref - logp. d = 0 -> 0 ; d = ln 2 -> 2 - ln 2 - 1 = 0.30685 ; d = -ln 2 -> 0.5 + ln 2 - 1
    logp = torch.zeros(3)
    ref = torch.tensor([0.0, LN(2.0), -LN(2.0)])
    assert kl_k3(logp, ref).tolist() == pytest.approx([0.0, 1 - LN(2.0), LN(2.0) - 0.5])


def test_gspo_uses_the_sequence_ratio() -> None:
    # one sequence, token log-ratios [ln 2, 0] -> mean ln(2)/2 -> s = sqrt(2) = 1.41421
    # A = +1, eps_high 0.28 -> clipped to 1.28 -> loss = -min(1.41421, 1.28) = -1.28
    # a second sequence with A = -1 and log-ratios [0, 0] -> s = 1 -> loss = +1
    logp = torch.tensor([[LN(2.0), 0.0], [0.0, 0.0]], requires_grad=True)
    loss, m = gspo_loss(
        logp,
        torch.zeros(2, 2),
        torch.tensor([1.0, -1.0]),
        torch.ones(2, 2),
        eps_low=0.1,
        eps_high=0.28,
    )
    assert loss.item() == pytest.approx((-1.28 + 1.0) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_off_policy_token_tis() -> None:
    # r = pi_prox / pi_behaviour = [0.5, 1, 3, 0] (the last token: the trainer's top-p left it
    # out, log-prob floor); cap 2 -> w = [0.5, 1, 2, 0]; one of 4 capped, one dropped
    prox = torch.tensor([[LN(0.5), 0.0, LN(3.0), -1e4]])
    beh = torch.zeros(1, 4)
    w, m = off_policy_weights(prox, beh, torch.ones(1, 4), mode="token_tis", cap=2.0)
    assert w.tolist()[0] == pytest.approx([0.5, 1.0, 2.0, 0.0])
    assert m == pytest.approx({"is_capped_frac": 0.25, "is_masked_frac": 0.25})


def test_float_noise_on_the_ratio_is_not_counted_as_capped() -> None:
    # on-policy tokens whose engine and trainer log-probs differ by float noise: r = 1 + 1e-7,
    # 1 - 1e-6, 1 + 1e-5 against cap 1 -> weights ~1 and nothing capped; the fourth token's
    # r = 1.5 loses a third of its weight to the cap: 1 of 4 capped
    prox = torch.tensor([[1e-7, -1e-6, 1e-5, LN(1.5)]])
    w, m = off_policy_weights(prox, torch.zeros(1, 4), torch.ones(1, 4), cap=1.0)
    assert w.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=1e-5)
    assert m["is_capped_frac"] == pytest.approx(0.25)


def test_off_policy_token_mask_icepop() -> None:
    # band [0.5, 2]: r = [0.4, 0.5, 1.5, 2.5] -> keep r inside, 0 outside -> [0, 0.5, 1.5, 0];
    # the padding token (mask 0) gets 0 whatever its ratio and does not count
    prox = torch.tensor([[LN(0.4), LN(0.5), LN(1.5), LN(2.5), 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    w, m = off_policy_weights(prox, torch.zeros(1, 5), mask, mode="token_mask", low=0.5, high=2.0)
    assert w.tolist()[0] == pytest.approx([0.0, 0.5, 1.5, 0.0, 0.0])
    assert m["is_masked_frac"] == pytest.approx(0.5) and m["is_capped_frac"] == 0


def test_off_policy_sequence_mask() -> None:
    # sequence 0: log-ratios [ln 4, 0] -> geometric mean sqrt(4 * 1) = 2 -> inside [0.5, 2.5]:
    #   every token weighs 2;
    # sequence 1: log-ratios [ln 9, ln 9, 0] -> (81)^(1/3) = 4.327 -> outside: dropped.
    # Real tokens 5, dropped 3 -> masked fraction 3 / 5.
    prox = torch.tensor([[LN(4.0), 0.0, 0.0], [LN(9.0), LN(9.0), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    w, m = off_policy_weights(prox, torch.zeros(2, 3), mask, mode="seq_mask", low=0.5, high=2.5)
    assert w.flatten().tolist() == pytest.approx([2.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    assert m["is_masked_frac"] == pytest.approx(3 / 5)


def test_mismatch_metrics() -> None:
    # d = prox - behaviour = [ln 2, -ln 2]: mean |d| = ln 2 = 0.6931;
    # k3 = e^d - d - 1: [2 - ln 2 - 1, 0.5 + ln 2 - 1] -> mean = (1 - ln2 + ln2 - 0.5) / 2 = 0.25
    m = mismatch_metrics(torch.tensor([[LN(2.0), -LN(2.0)]]), torch.zeros(1, 2), torch.ones(1, 2))
    assert m == pytest.approx(
        {"logp_diff_abs": LN(2.0), "mismatch_kl_k3": 0.25, "no_mass_frac": 0.0}
    )


def test_mismatch_leaves_out_tokens_the_proximal_policy_gives_no_mass() -> None:
    # a stale token outside the proximal policy's top-p gets the trainer's floor (-1e4): its
    # |diff| of ~1e4 made the mean of a whole step read 13-31 nats in a healthy run. It is
    # counted apart (1 of 3 tokens); the means are over the other two ([ln 2, -ln 2] above)
    prox = torch.tensor([[LN(2.0), -LN(2.0), -1e4]])
    m = mismatch_metrics(prox, torch.zeros(1, 3), torch.ones(1, 3))
    assert m == pytest.approx(
        {"logp_diff_abs": LN(2.0), "mismatch_kl_k3": 0.25, "no_mass_frac": 1 / 3}
    )


def test_ppo_clipped_tokens_carry_no_gradient_and_weights_scale_the_rest() -> None:
    # proximal log-probs differ from current ones (a second update on the same batch):
    # A = +1, ratios [1.5, 1.1, 0.5], eps 0.2/0.2 -> token 0 clipped (1.5 > 1.2), no gradient;
    # tokens 1, 2 unclipped: d(-w r)/d logp = -w r with w = [1, 0.5, 2]:
    #   token 1: -0.5 * 1.1 / 3 = -0.18333 ; token 2: -2 * 0.5 / 3 = -0.33333
    logp_old = torch.zeros(1, 3)
    logp = torch.tensor([[LN(1.5), LN(1.1), LN(0.5)]], requires_grad=True)
    w = torch.tensor([[1.0, 0.5, 2.0]])
    loss, m = ppo_clip_loss(
        logp,
        logp_old,
        torch.tensor([1.0]),
        torch.ones(1, 3),
        eps_low=0.2,
        eps_high=0.2,
        is_weight=w,
    )
    # loss = -(1.2 * 1 + 1.1 * 0.5 + 0.5 * 2) / 3 = -2.75 / 3
    assert loss.item() == pytest.approx(-2.75 / 3)
    assert m["clip_frac"] == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.55 / 3, -1.0 / 3])  # type: ignore[union-attr]


def test_ppo_ratio_stays_finite_when_the_proximal_policy_gave_no_mass() -> None:
    # proximal log-prob at the floor (-1e4) and IS weight 0: the loss and gradient are 0, not nan
    logp = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(
        logp,
        torch.tensor([[-1e4]]),
        torch.tensor([-1.0]),
        torch.ones(1, 1),
        eps_low=0.2,
        eps_high=0.2,
        dual_clip=None,
        is_weight=torch.zeros(1, 1),
    )
    loss.backward()
    assert loss.item() == 0.0 and float(logp.grad) == 0.0  # type: ignore[arg-type]


def test_gspo_sequence_weight_uses_the_kept_tokens() -> None:
    # token weights [2, 0 (masked), 0.5] -> geometric mean over kept tokens sqrt(2 * 0.5) = 1;
    # ratio 1, A = +1 -> loss = -1 * 1 = -1; a sequence with every token masked weighs 0
    logp = torch.zeros(2, 3)
    w = torch.tensor([[2.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    loss, _ = gspo_loss(
        logp,
        torch.zeros(2, 3),
        torch.tensor([1.0, 1.0]),
        torch.ones(2, 3),
        eps_low=0.1,
        eps_high=0.1,
        is_weight=w,
    )
    assert float(loss) == pytest.approx(-1.0 / 2)


def test_nll_loss_is_the_mean_negative_log_likelihood_of_the_kept_tokens() -> None:
    # two samples, weights 1 (kept successes); tokens p = [0.5, 0.25 | 0.8, pad]:
    # token_mean = -(ln .5 + ln .25 + ln .8) / 3 = (0.6931 + 1.3863 + 0.2231) / 3 = 0.7675
    logp = torch.tensor([[LN(0.5), LN(0.25)], [LN(0.8), LN(0.1)]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, m = nll_loss(logp, torch.tensor([1.0, 1.0]), mask)
    assert loss.item() == pytest.approx((LN(2) + LN(4) - LN(0.8)) / 3)
    assert m["nll"] == pytest.approx(loss.item())
    loss.backward()
    # d/dlogp_t = -w / 3 on real tokens, 0 on padding: no ratio, no clip
    grad = logp.grad.flatten().tolist()  # type: ignore[union-attr]
    assert grad == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 0.0])
    # per sample: (0.6931 + 1.3863) / 2 and 0.2231, averaged: (1.0397 + 0.2231) / 2 = 0.6314
    seq, _ = nll_loss(logp, torch.tensor([1.0, 1.0]), mask, agg="seq_mean_token_mean")
    assert seq.item() == pytest.approx(((LN(2) + LN(4)) / 2 - LN(0.8)) / 2)
    # a weight of 0 removes a sample's tokens from the numerator
    zero, _ = nll_loss(logp, torch.tensor([1.0, 0.0]), mask)
    assert zero.item() == pytest.approx((LN(2) + LN(4)) / 3)

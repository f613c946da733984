"""The learner's objectives on the tiny Qwen2.5-VL, in one process: the trust region, the
gradient's independence of micro-batching, the KL reference (resumed runs, LoRA), RFT."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch

from dart_ray.algo.losses import kl_k3, ppo_clip_loss
from dart_ray.algo.sampling import SamplingSpec
from dart_ray.config import load_config
from dart_ray.engines.base import SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.train.forward import collate, response_logprobs
from dart_ray.train.learner import Learner, LossSettings, loss_settings
from tests.train.rollouts import samples


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


def _learner(model: torch.nn.Module, proc: PolicyProcessor, **settings: object) -> Learner:
    return Learner(
        model,
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=LossSettings(**settings),  # type: ignore[arg-type]
        lr=3e-2,
        suppressed_ids=proc.suppressed_ids(),
    )


def test_the_trust_region_binds_with_several_updates_per_batch(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """Two epochs of two minibatches at a high learning rate: from the second update on the
    current policy has left the proximal one, so tokens get clipped, and a clipped token
    carries no gradient. The engine's samples were drawn by the trainer's starting weights,
    so the on-policy gap between the two is float noise."""
    torch.manual_seed(0)
    batch = samples(engine, [1.0, -1.0, 1.0, -1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)
    learner = _learner(model, proc, ppo_epochs=2, minibatches=2, eps_low=0.05, eps_high=0.05)
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    with torch.no_grad():
        prox, _ = response_logprobs(model, mb, None, learner.suppressed)
    metrics = learner.step(batch, version=0)
    assert metrics["updates"] == 4
    assert metrics["clip_frac"] > 0 and metrics["clip_frac_last"] > 0
    assert metrics["onpolicy_logp_diff_abs"] < 1e-4
    # the loss of the next update, on the real model: clipped tokens get exactly no gradient
    logp, _ = response_logprobs(model, mb, None, learner.suppressed)
    logp.retain_grad()
    mask = mb.response_mask
    adv = mb.advantages
    loss, m = ppo_clip_loss(logp, prox, adv, mask, eps_low=0.05, eps_high=0.05, dual_clip=None)
    loss.backward()
    ratio = torch.exp(logp.detach() - prox)
    a = adv.unsqueeze(-1)
    clipped = mask.bool() & (((a > 0) & (ratio > 1.05)) | ((a < 0) & (ratio < 0.95)))
    free = mask.bool() & ~clipped
    assert clipped.any() and free.any() and m["clip_frac"] > 0
    assert (logp.grad[clipped] == 0).all()  # type: ignore[index]
    assert (logp.grad[free] != 0).all()  # type: ignore[index]


def test_one_update_per_batch_never_clips(engine: HFEngine, tiny_model_dir: Path) -> None:
    """One optimizer step per batch: the proximal policy is the current one at the gradient,
    so the ratio is exactly 1 and the clip cannot bind (the case the docs warn about)."""
    batch = samples(engine, [1.0, -1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    metrics = _learner(load_model(tiny_model_dir), proc).step(batch)
    assert metrics["updates"] == 1 and metrics["clip_frac"] == 0
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def test_collate_reads_arrow_buffers_of_a_sliced_batch(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """Micro-batches are slices of the shard: their list columns share the shard's buffers
    at an offset. The tensors must be those of the slice's own rows, token for token."""
    batch = samples(engine, [1.0, -1.0, 0.5, 0.2])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    part = batch.slice(1, 2)
    mb = collate(part, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    rows = part.to_pylist()
    for b, r in enumerate(rows):
        seq = r["prompt_ids"] + r["response_ids"]
        assert mb.input_ids[b, : len(seq)].tolist() == seq
        assert mb.input_ids[b, len(seq) :].eq(proc.pad_id).all()
        assert int(mb.attention_mask[b].sum()) == len(seq)
        assert int(mb.prompt_lens[b]) == len(r["prompt_ids"])
        n = len(r["response_ids"])
        assert mb.response_ids[b, :n].tolist() == r["response_ids"]
        assert mb.behaviour_logprobs[b, :n].tolist() == pytest.approx(r["behaviour_logprobs"])
        assert mb.response_mask[b, :n].tolist() == r["loss_mask"]
        assert float(mb.advantages[b]) == pytest.approx(r["advantage"])


def test_kl_to_the_reference_compares_untruncated_distributions(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """Rollouts at top-p 0.5; the reference is the same model with its output layer
    perturbed, so sampled tokens inside the policy's nucleus fall outside the reference's.
    Truncated, each such token sits at the -1e4 floor and its k3 term is ~1e4; the KL the
    learner reports (and trains on) must be the one between the untruncated distributions."""
    torch.manual_seed(3)
    cfg = load_config(None, ["policy.top_p=0.5", "algo.kl_beta=0.1"])
    batch = samples(engine, [1.0, -1.0, 0.5, -0.5], SamplingParams(1.0, 0.5, 12))
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model, ref = load_model(tiny_model_dir), load_model(tiny_model_dir)
    with torch.no_grad():
        head = ref.lm_head.weight  # type: ignore[union-attr]
        head.add_(torch.randn_like(head) * head.std() * 2)
    learner = Learner(
        model,
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=loss_settings(cfg),
        lr=0.0,
        ref_model=ref,
        suppressed_ids=proc.suppressed_ids(),
    )
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    mask = mb.response_mask.bool()
    nucleus = loss_settings(cfg).sampling
    with torch.no_grad():
        cur, _ = response_logprobs(model, mb, SamplingSpec(1.0), learner.suppressed)
        want = kl_k3(cur, response_logprobs(ref, mb, SamplingSpec(1.0), learner.suppressed)[0])
        truncated = response_logprobs(ref, mb, nucleus, learner.suppressed)[0]
    assert (truncated[mask] <= -1e3).any()  # the case under test: outside the ref's nucleus
    metrics = learner.step(batch)
    assert metrics["kl_ref"] == pytest.approx(float(want[mask].mean()), rel=1e-4)
    assert 0 < metrics["kl_ref"] < 10


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_the_gradient_does_not_depend_on_how_samples_fall_into_micro_batches(
    engine: HFEngine, tiny_model_dir: Path, agg: str
) -> None:
    """Each aggregation is normalised by the minibatch's global counts (tokens, samples, or
    the fixed L), so one micro-batch of four samples and four micro-batches of one give the
    same gradient."""
    batch = samples(engine, [1.0, -1.0, 0.5, -0.25])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    grads = []
    for budget in (100_000, 40):
        model = load_model(tiny_model_dir)
        learner = Learner(
            model,
            proc.image_processor,
            image_pad_id=proc.image_pad_id,
            pad_id=proc.pad_id,
            settings=LossSettings(loss_agg=agg, norm_tokens=64),  # type: ignore[arg-type]
            lr=0.0,
            grad_clip=1e9,
            tokens_per_micro=budget,
            suppressed_ids=proc.suppressed_ids(),
        )
        m = learner.step(batch)
        assert m["micro_batches"] == (1.0 if budget > 40 else 4.0)
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_the_default_config_takes_two_updates_per_batch_so_the_clip_binds(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """The trust region is on by default: `make run`'s config splits each curated batch into
    two optimizer steps, so the second is clipped against the proximal policy. Before, every
    shipped config took one step per batch and the clip never bound (the loss was
    -A * TIS * logp)."""
    cfg = load_config(Path(__file__).parents[2] / "configs" / "default.toml")
    settings = loss_settings(cfg)
    assert settings.minibatches * settings.ppo_epochs == 2
    batch = samples(engine, [1.0, -1.0, 1.0, -1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    learner = Learner(
        load_model(tiny_model_dir),
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=settings,
        lr=3e-2,
        suppressed_ids=proc.suppressed_ids(),
    )
    metrics = learner.step(batch)
    assert metrics["updates"] == 2 and metrics["clip_frac_last"] > 0


def test_with_train_lora_the_worker_steps_only_the_adapters(
    engine: HFEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The worker's own build (`_build`): adapters injected, the optimizer holds only them,
    and a step moves them and nothing of the base."""
    from dart_ray.models import lora
    from dart_ray.train.job import TrainJob
    from dart_ray.train.worker import _build

    cfg = load_config(None, ["train.lora.enabled=true", "train.lora.rank=4", "train.lr=1e-2"])
    job = TrainJob(cfg, "lora", str(tiny_model_dir), str(tmp_path), "c", "p", "k", "ns")
    model, learner = _build(job)
    adapters = {n for n, _ in model.named_parameters() if lora.is_adapter(n)}
    assert adapters and {n for n, p in model.named_parameters() if p.requires_grad} == adapters
    optimized = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in model.named_parameters() if n in adapters}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner.step(samples(engine, [1.0, -1.0, 1.0, -1.0]), version=0)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= adapters


def test_a_resumed_run_keeps_its_base_as_the_kl_reference(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`_build` of a resumed run trains from the checkpoint but measures the KL to the run's
    base: before, the reference was the checkpoint itself, so every resume reset the KL
    penalty to zero and let the policy drift further from the base than `algo.kl_beta` asks."""
    import shutil

    from dart_ray.models.loading import load_model
    from dart_ray.train.job import TrainJob
    from dart_ray.train.worker import _build

    ckpt = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, ckpt)
    trained = load_model(tiny_model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    trained.save_pretrained(ckpt)
    cfg = load_config(None, ["algo.kl_beta=0.1"])
    job = TrainJob(
        cfg, "kl", str(ckpt), str(tmp_path), "c", "p", "k", "ns", base_dir=str(tiny_model_dir)
    )
    model, learner = _build(job)
    base = load_model(tiny_model_dir).state_dict()
    ref = learner.ref_model.state_dict()
    assert all(torch.equal(ref[k], base[k]) for k in base)
    assert not torch.equal(model.state_dict()["lm_head.weight"], base["lm_head.weight"])


def test_the_rft_objective_raises_the_likelihood_of_the_kept_successes(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """`algo.objective = "rft"`: the config's loss is the NLL (`loss_settings`), and a step
    makes every kept sample likelier, the clip and importance weights playing no part (a
    stale sample whose behaviour log-probs are far off trains as a fresh one)."""
    settings = loss_settings(load_config(None, ["algo.objective=rft", "train.minibatches=1"]))
    assert settings.loss == "nll"
    batch = samples(engine, [1.0, 1.0])
    stale = pa.array(
        [[lp - 5.0 for lp in row] for row in batch.column("behaviour_logprobs").to_pylist()],
        pa.list_(pa.float32()),
    )
    batch = batch.set_column(
        batch.schema.get_field_index("behaviour_logprobs"), "behaviour_logprobs", stale
    )
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)
    learner = Learner(
        model,
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=settings,
        lr=3e-3,
        suppressed_ids=proc.suppressed_ids(),
    )
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    with torch.no_grad():
        before, _ = response_logprobs(model, mb, settings.sampling, learner.suppressed)
    metrics = learner.step(batch)
    model.eval()
    with torch.no_grad():
        after, _ = response_logprobs(model, mb, settings.sampling, learner.suppressed)
    mask = mb.response_mask.bool()
    assert metrics["nll"] == pytest.approx(float(-before[mask].mean()), rel=1e-4)
    assert ((after - before) * mb.response_mask).sum(1).min() > 0


def test_with_lora_the_kl_reference_is_the_base_through_disabled_adapters(
    engine: HFEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 46: with `train.lora` and `algo.kl_beta`, the reference is the policy with its
    adapters disabled (its frozen base), not a second full model: no separate copy is held,
    the reference's log-probs are the base model's, and after the adapters move the KL term
    is positive."""
    from dart_ray.models.loading import load_model
    from dart_ray.train.job import TrainJob
    from dart_ray.train.worker import _build

    cfg = load_config(
        None,
        ["train.lora.enabled=true", "train.lora.rank=4", "train.lr=5e-2", "algo.kl_beta=0.5"],
    )
    job = TrainJob(cfg, "lora-kl", str(tiny_model_dir), str(tmp_path), "c", "p", "k", "ns")
    model, learner = _build(job)
    assert learner.ref_model is None and learner.ref_adapters_off
    batch = samples(engine, [1.0, -1.0])
    for _ in range(3):
        metrics = learner.step(batch, version=0)
    assert metrics["kl_ref"] > 0
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    full = SamplingSpec(temperature=1.0)
    model.eval()
    with torch.no_grad(), learner._reference() as ref:
        off, _ = response_logprobs(ref, mb, full, learner.suppressed)
    with torch.no_grad():
        base, _ = response_logprobs(load_model(tiny_model_dir), mb, full, learner.suppressed)
        on, _ = response_logprobs(model, mb, full, learner.suppressed)
    mask = mb.response_mask.bool()
    assert torch.allclose(off[mask], base[mask], atol=1e-5)  # adapters off: the base
    assert not torch.allclose(on[mask], base[mask], atol=1e-3)  # adapters on: moved

"""The trainer's forward pass and learner step on the tiny Qwen2.5-VL, in one process."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch

from dart_ray.algo.sampling import SamplingSpec
from dart_ray.config import load_config
from dart_ray.engines.base import SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.train.forward import BatchError, collate, response_logprobs
from dart_ray.train.learner import Learner, LossSettings, loss_settings, split_micro
from tests.policy_helpers import png
from tests.train.rollouts import samples


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 20, 1.0), (0.9, 40, 0.9), (2.0, 0, 0.5)],
)
def test_trainer_logprobs_match_the_engine(
    engine: HFEngine, tiny_model_dir: Path, temperature: float, top_k: int, top_p: float
) -> None:
    """For every sampling setting the config accepts, the trainer recomputes the behaviour
    log-probs the engine logged (same weights, same suppressed tokens, same temperature, top-k
    and top-p): what makes the importance ratio 1 on-policy. The settings come from the
    config as a run builds them (`loss_settings`)."""
    torch.manual_seed(1)
    cfg = load_config(
        None,
        [f"policy.temperature={temperature}", f"policy.top_k={top_k}", f"policy.top_p={top_p}"],
    )
    sp = SamplingParams(temperature, top_p, 12, top_k=top_k)
    batch = samples(engine, [1.0, -1.0, 0.5, 0.2], sp)
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    suppressed = torch.tensor(proc.suppressed_ids())
    with torch.no_grad():
        logp, ent = response_logprobs(model, mb, loss_settings(cfg).sampling, suppressed)
    mask = mb.response_mask.bool()
    assert torch.allclose(logp[mask], mb.behaviour_logprobs[mask], atol=1e-4)
    assert (ent[mask] > 0).all() and (ent[~mask] == 0).all()
    if top_p < 1 or top_k:  # the untruncated distribution differs: the check has teeth
        with torch.no_grad():
            plain, _ = response_logprobs(model, mb, SamplingSpec(temperature), suppressed)
        assert not torch.allclose(plain[mask], mb.behaviour_logprobs[mask], atol=1e-3)


def test_the_image_reaches_the_trainer(engine: HFEngine, tiny_model_dir: Path) -> None:
    batch = samples(engine, [1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)
    other = batch.set_column(
        batch.schema.get_field_index("images"),
        "images",
        pa.array([[png((0, 0, 0))]], pa.list_(pa.binary())),
    )
    with torch.no_grad():
        a, _ = response_logprobs(
            model,
            collate(
                batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id
            ),
        )
        b, _ = response_logprobs(
            model,
            collate(
                other, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id
            ),
        )
    assert not torch.allclose(a, b)


def test_image_token_mismatch_is_named(engine: HFEngine, tiny_model_dir: Path) -> None:
    batch = samples(engine, [1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    big = batch.set_column(
        batch.schema.get_field_index("images"),
        "images",
        pa.array([[png((0, 0, 0), size=(300, 300))]], pa.list_(pa.binary())),
    )
    # 112x112 -> 16 tokens at logging time. 300x300 now: 308^2 is over max_pixels 64*28^2 =
    # 50176, so each side shrinks by sqrt(90000/50176) = 1.339 to 224.0 -> floor to 7 * 28 =
    # 196 px -> 14x14 patches -> 49 tokens after the 2x2 merge.
    with pytest.raises(
        BatchError, match=r"prompt has 16 image tokens but its 1 image\(s\) make 49"
    ):
        collate(big, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)


def test_learner_moves_logprobs_with_the_advantage_sign(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    batch = samples(engine, [1.0, -1.0])
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)
    learner = Learner(
        model,
        proc.image_processor,
        image_pad_id=proc.image_pad_id,
        pad_id=proc.pad_id,
        settings=LossSettings(),
        lr=3e-3,
        tokens_per_micro=40,
        suppressed_ids=proc.suppressed_ids(),
    )
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    with torch.no_grad():
        before, _ = response_logprobs(model, mb, None, learner.suppressed)
    for _ in range(3):
        metrics = learner.step(batch)
    assert metrics["micro_batches"] == 2.0  # 40-token budget: one sample per micro-batch
    model.eval()
    with torch.no_grad():
        after, _ = response_logprobs(model, mb, None, learner.suppressed)
    gain = (after - before).sum(1)
    assert gain[0] > 0 > gain[1]  # the positive-advantage response became likelier


def test_split_micro_respects_the_token_budget() -> None:
    rows = {
        "prompt_ids": [[1] * 10, [1] * 10, [1] * 30, [1] * 5],
        "response_ids": [[2] * 2, [2] * 2, [2] * 2, [2] * 2],
    }
    b = pa.RecordBatch.from_pydict(rows)
    # budgets: 12 + 12 = 24 <= 30 ; 32 alone (over budget but a sample is never split) ; 7
    assert [s.num_rows for s in split_micro(b, 30)] == [2, 1, 1]


def test_padding_with_a_suppressed_id_never_makes_nan(
    engine: HFEngine, tiny_model_dir: Path
) -> None:
    """The pad token is special, hence suppressed (log-prob -inf): padded positions of a
    shorter response must read 0, not -inf * 0 = nan."""
    batch = samples(engine, [1.0, -1.0])
    short = batch.column("response_ids").to_pylist()
    short[1] = short[1][:1]
    lp = batch.column("behaviour_logprobs").to_pylist()
    lp[1] = lp[1][:1]
    batch = batch.set_column(
        batch.schema.get_field_index("response_ids"),
        "response_ids",
        pa.array(short, pa.list_(pa.int32())),
    )
    batch = batch.set_column(
        batch.schema.get_field_index("behaviour_logprobs"),
        "behaviour_logprobs",
        pa.array(lp, pa.list_(pa.float32())),
    )
    batch = batch.set_column(
        batch.schema.get_field_index("loss_mask"),
        "loss_mask",
        pa.array([[1] * len(r) for r in short], pa.list_(pa.int8())),
    )
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    assert proc.pad_id in proc.suppressed_ids()
    model = load_model(tiny_model_dir)
    mb = collate(batch, proc.image_processor, image_pad_id=proc.image_pad_id, pad_id=proc.pad_id)
    logp, ent = response_logprobs(model, mb, None, torch.tensor(proc.suppressed_ids()))
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()
    assert logp[1, 1:].abs().sum() == 0

"""The transformers engine: exact log-probs and entropy, suppression, limits, batching, versions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from dart_ray.engines.base import Generation, SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.models.tiny import SPECIAL_TOKENS
from dart_ray.weights import pack
from tests.policy_helpers import GREEDY, png, request


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


def _run(engine: HFEngine, reqs: list, defaults: SamplingParams = GREEDY) -> list[Generation]:  # type: ignore[type-arg]
    return asyncio.run(engine.generate([engine.prepare(r, defaults) for r in reqs]))


def _teacher_forced(engine: HFEngine, req, g: Generation) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(T, V) next-token logits for the response tokens, from one forward pass."""
    enc = engine.processor.encode(req.messages)
    ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
    with torch.no_grad():
        out = engine.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=enc.pixel_values,
            image_grid_thw=enc.image_grid_thw,
        )
    return out.logits[0, len(g.prompt_ids) - 1 : -1].float()


def test_logprobs_and_entropy_are_those_of_the_sampling_distribution(engine: HFEngine) -> None:
    torch.manual_seed(0)
    sp = SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=16)
    req = request()
    (g,) = _run(engine, [req], sp)
    assert len(g.response_ids) == len(g.logprobs) == len(g.entropy) > 0
    # rebuild the distribution by hand: suppress specials, divide by 0.7, keep the smallest
    # set of tokens whose mass reaches 0.8, renormalise
    z = _teacher_forced(engine, req, g)
    z[:, engine.suppressed] = -float("inf")
    z = z / 0.7
    p = z.softmax(-1)
    sorted_p, order = p.sort(-1, descending=True)
    drop = (sorted_p.cumsum(-1) - sorted_p) >= 0.8
    z = z.masked_fill(drop.scatter(-1, order, drop), -float("inf"))
    logp = z.log_softmax(-1)
    want = logp.gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)
    q = logp.exp()
    entropy = -(q * logp.nan_to_num(neginf=0.0)).sum(-1)
    assert torch.allclose(torch.tensor(g.entropy), entropy, atol=1e-4)
    assert all(lp > -float("inf") for lp in g.logprobs)  # sampled tokens are in the nucleus


def test_greedy_logprobs_are_the_temperature_one_distribution(engine: HFEngine) -> None:
    req = request()
    (g,) = _run(engine, [req])
    z = _teacher_forced(engine, req, g)
    z[:, engine.suppressed] = -float("inf")
    assert g.response_ids == tuple(z.argmax(-1).tolist())
    want = z.log_softmax(-1).gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


def test_special_tokens_are_never_sampled(tiny_model_dir: Path) -> None:
    """Rig the model so that the special tokens beat every other token, then sample."""
    rigged = HFEngine(tiny_model_dir)
    free = HFEngine(tiny_model_dir, allow_special_tokens=SPECIAL_TOKENS)
    req = request()
    (g,) = _run(rigged, [req])
    z = _teacher_forced(rigged, req, g)[0]
    best = int(z.argmax())  # the top token at the first step, with a positive logit
    assert z[best] > 0
    specials = rigged.processor.suppressed_ids()
    with torch.no_grad():
        for e in (rigged, free):
            w = e.model.lm_head.weight
            w[specials] = 10 * w[best]  # each special's logit is 10x the top token's
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    sampled = _run(rigged, [req] * 8, sp) + _run(rigged, [req], GREEDY)
    assert not {t for g in sampled for t in g.response_ids} & set(specials)
    # the same rigged model with nothing suppressed does emit them: suppression is the cause
    (g_free,) = _run(free, [req], GREEDY)
    assert g_free.response_ids[0] in specials


def test_max_tokens_and_stop_strings(engine: HFEngine) -> None:
    req = request()
    (g,) = _run(engine, [req], SamplingParams(temperature=0, max_new_tokens=20))
    assert len(g.response_ids) <= 20
    if len(g.response_ids) == 20:
        assert g.finish_reason == "length"
    stop = g.text[4:6]
    assert stop and g.text.find(stop) == 4
    (s,) = _run(engine, [req], SamplingParams(temperature=0, max_new_tokens=20, stop=(stop,)))
    assert s.text == g.text[:4] and s.finish_reason == "stop"
    assert s.response_ids == g.response_ids[: len(s.response_ids)]  # same tokens, cut short
    assert stop in engine.processor.decode(s.response_ids)  # up to the completing token


def test_batched_equals_one_by_one(engine: HFEngine) -> None:
    """Left padding and concatenated images must not change any request's answer."""
    reqs = [
        request(screens=(png((200, 0, 0)),)),
        request("drag the file", screens=(png((0, 200, 0)), png((0, 0, 200), size=(168, 112)))),
        request("type hello", screens=(png((90, 90, 90), box=40),)),
    ]
    together = _run(engine, reqs)
    for r, g in zip(reqs, together, strict=True):
        (alone,) = _run(engine, [r])
        assert g.prompt_ids == alone.prompt_ids
        assert g.response_ids == alone.response_ids
        assert g.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert g.batch_size == 3 and alone.batch_size == 1
    assert together[1].model_sizes == ((112, 112), (168, 112))


@pytest.mark.parametrize("weights_load", ["share", "copy"])
def test_updates_are_versioned_and_in_place(tiny_model_dir: Path, weights_load: str) -> None:
    e = HFEngine(tiny_model_dir, weights_load=weights_load)  # type: ignore[arg-type]
    req = request()
    (before,) = _run(e, [req])
    new = {k: v * 1.5 for k, v in e.model.state_dict().items()}

    async def scenario() -> tuple[Generation, Generation, float]:
        slow = SamplingParams(temperature=0, max_new_tokens=48)
        first = asyncio.create_task(e.generate([e.prepare(req, slow)]))
        await asyncio.sleep(0.05)  # the generation holds version 0 now
        update = asyncio.create_task(e.update_weights(1, pack(new)))
        await asyncio.sleep(0)
        late = asyncio.create_task(e.generate([e.prepare(req, GREEDY)]))
        return (await first)[0], (await late)[0], await update

    first, late, seconds = asyncio.run(scenario())
    assert first.weight_version == 0  # started before the update: old weights throughout
    assert first.response_ids[: len(before.response_ids)] == before.response_ids
    assert late.weight_version == 1 and late.response_ids != before.response_ids
    assert e.version == 1 and seconds > 0
    assert asyncio.run(e.update_weights(1, pack(new))) == 0.0  # a retried publish: no-op
    with pytest.raises(ValueError, match="older than the loaded 1"):
        asyncio.run(e.update_weights(0, pack(new)))


def test_top_p_and_recorder_on_hand_numbers() -> None:
    from dart_ray.engines.hf import _Recorder, _TopP

    # p = [0.5, 0.3, 0.15, 0.05], top_p 0.8: the mass before token 2 is 0.8 >= 0.8, so tokens
    # 2 and 3 go; the rest renormalise to [0.5, 0.3] / 0.8 = [0.625, 0.375].
    scores = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = _TopP(0.8)(torch.zeros(1, 1, dtype=torch.long), scores)
    assert kept.softmax(-1).tolist()[0] == pytest.approx([0.625, 0.375, 0.0, 0.0])
    # the recorder: entropy of [0.625, 0.375] = -(0.625 ln 0.625 + 0.375 ln 0.375) = 0.6616;
    # then token 1 is "sampled": log 0.375 = -0.9808. A uniform 4-way step: ln 4 = 1.3863.
    rec = _Recorder()
    rec(torch.zeros(1, 1, dtype=torch.long), kept)
    rec(torch.tensor([[0, 1]]), torch.zeros(1, 4))
    logprobs, entropy = rec.finish(torch.tensor([3]))
    assert entropy.tolist()[0] == pytest.approx([0.6616, 1.3863], abs=1e-4)
    assert logprobs.tolist()[0] == pytest.approx([-0.9808, -1.3863], abs=1e-4)

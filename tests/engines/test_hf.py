"""The transformers engine: exact log-probs and entropy, suppression, limits, batching, versions."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dart_ray.algo.sampling import SamplingSpec, process_logits
from dart_ray.engines.base import Generation, SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.models.tiny import SPECIAL_TOKENS
from dart_ray.models.weights import pack
from tests.engines.sampling_stats import check_samples
from tests.policy_helpers import GREEDY, logits_in_1d, logits_in_3d, png, request


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


def _run(engine: HFEngine, reqs: list, defaults: SamplingParams = GREEDY) -> list[Generation]:  # type: ignore[type-arg]
    return asyncio.run(engine.generate([engine.prepare(r, defaults) for r in reqs]))


def _teacher_forced(engine: HFEngine, req, g: Generation) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(T, V) next-token logits for the response tokens, from one forward pass."""
    enc = engine.processor.encode(req.messages)
    ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
    return logits_in_3d(engine.model, ids, enc)[0, len(g.prompt_ids) - 1 : -1]


def test_image_tokens_take_the_models_3d_positions(engine: HFEngine) -> None:
    """Qwen2.5-VL places each image patch at (time, row, column) and resumes the text after
    the image's largest position (M-RoPE). transformers 5 only does so when told which
    tokens are image tokens; told nothing it numbers every token 1D without an error, and
    the engine ran that way: its log-probs were 0.8-4 nats off the model's own positions
    on these prompts, and off what vLLM (which builds the 3D positions itself) computes."""
    reqs = [request(screens=(png((50 * i, 90, 200 - 40 * i), box=12 * i),)) for i in range(3)]
    for req, g in zip(reqs, _run(engine, reqs), strict=True):  # batched, left-padded
        enc = engine.processor.encode(req.messages)
        ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
        n = len(g.prompt_ids)
        for logits, same in ((logits_in_3d, True), (logits_in_1d, False)):
            z = logits(engine.model, ids, enc)[0, n - 1 : -1]
            z[:, engine.suppressed] = float("-inf")
            logp = torch.log_softmax(z, -1).gather(-1, torch.tensor(g.response_ids)[:, None])
            close = torch.allclose(logp[:, 0], torch.tensor(g.logprobs), atol=1e-4)
            assert close == same, logits.__name__


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


def test_a_forced_response_is_scored_as_if_the_sampler_had_drawn_it(engine: HFEngine) -> None:
    """Teacher forcing (`GenerateRequest.forced`, what seeds the replay pool with written
    solutions) gives a response the log-probs and entropies the sampler records when it
    draws the same tokens: the trainer's importance weights then treat a seed as a sample
    of the weights it was scored under. Forced and sampled requests share a batch."""
    torch.manual_seed(0)
    sp = SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=16)
    reqs = [request(screens=(png((50, 90, 200), box=12), png((9, 9, 9)))), request()]
    sampled = _run(engine, reqs, sp)
    forced = [
        replace(engine.prepare(r, sp), forced_ids=g.response_ids)
        for r, g in zip(reqs, sampled, strict=True)
    ]
    *scored, fresh = asyncio.run(engine.generate([*forced, engine.prepare(reqs[1], sp)]))
    for g, f in zip(sampled, scored, strict=True):
        assert (f.response_ids, f.prompt_ids, f.model_sizes) == (
            g.response_ids,
            g.prompt_ids,
            g.model_sizes,
        )
        assert torch.allclose(torch.tensor(f.logprobs), torch.tensor(g.logprobs), atol=1e-4)
        assert torch.allclose(torch.tensor(f.entropy), torch.tensor(g.entropy), atol=1e-4)
    assert fresh.response_ids and fresh.finish_reason in ("stop", "length")  # sampled

    text = "Thought: script step 1 of 2.\nAction: type(content='ls ~ <x> \\n')"
    (g,) = _run(engine, [replace(request(), forced=text)], sp)
    assert g.text == text and g.finish_reason == "stop"
    assert g.response_ids[-1] == engine.processor.eos_id  # the response ends as a model's
    assert len(g.logprobs) == len(g.response_ids) and max(g.logprobs) <= 0


def test_top_logprobs_are_the_most_likely_tokens_of_the_sampling_distribution(
    engine: HFEngine,
) -> None:
    """`top_logprobs=k` records, per token, the k best tokens of the distribution sampled
    from: rebuilt by hand as above (specials suppressed, temperature 0.7, top-k 2), so each
    step offers exactly 2 finite tokens, and the drawn token is one of them with its own
    recorded log-prob."""
    torch.manual_seed(1)
    sp = SamplingParams(temperature=0.7, max_new_tokens=10, top_k=2, top_logprobs=5)
    req = request()
    (g,) = _run(engine, [req], sp)
    assert len(g.top_logprobs) == len(g.response_ids) > 0
    z = _teacher_forced(engine, req, g)
    z[:, engine.suppressed] = -float("inf")
    logp = process_logits(z, SamplingSpec(0.7, 2, 1.0)).log_softmax(-1)
    for t, (tok, lp, top) in enumerate(
        zip(g.response_ids, g.logprobs, g.top_logprobs, strict=True)
    ):
        assert len(top) == 2  # top-k 2: the other 3 asked for cannot be drawn (-inf): left out
        values, ids = logp[t].topk(2)
        assert [i for i, _ in top] == ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), values, atol=1e-4)
        assert dict(top)[tok] == pytest.approx(lp, abs=1e-6)
    (plain,) = _run(engine, [req], GREEDY)
    assert plain.top_logprobs == ()  # not asked: nothing recorded


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


def _first_token_distribution(
    engine: HFEngine, req, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(V,) the distribution of the first response token, built by hand from the logits."""
    enc = engine.processor.encode(req.messages)
    ids = torch.tensor([list(enc.input_ids)])
    with torch.no_grad():
        z = (
            engine.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=enc.pixel_values,
                image_grid_thw=enc.image_grid_thw,
            )
            .logits[0, -1]
            .float()
        )
    z[engine.suppressed] = -float("inf")
    z = z / temperature
    if top_k:
        z[z < z.sort(descending=True).values[top_k - 1]] = -float("inf")
    if top_p < 1:
        p = z.softmax(-1)
        sorted_p, order = p.sort(descending=True)
        drop = (sorted_p.cumsum(0) - sorted_p) >= top_p
        z[order[drop]] = -float("inf")
    return z.softmax(-1)


def _first_tokens(engine: HFEngine, req, sp: SamplingParams, n: int) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    enc = engine.processor.encode(req.messages)
    tokens, logprobs = [], []
    for _ in range(n // 500):
        for g in engine.generate_sync([enc] * 500, [sp] * 500, 0):
            tokens.append(g.response_ids[0])
            logprobs.append(g.logprobs[0])
    return tokens, logprobs


def _with_generation_defaults(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model with a checkpoint's own sampling defaults, as Qwen's models ship them
    (transformers fills every unset generation field from these)."""
    import json
    import shutil

    out = tmp_path / "model"
    shutil.copytree(tiny_model_dir, out)
    cfg = json.loads((out / "generation_config.json").read_text())
    cfg.update(do_sample=True, top_k=5, top_p=0.5, temperature=0.2, repetition_penalty=1.3)
    (out / "generation_config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "defaults"),
    [(3.0, 0, 1.0, "plain"), (1.5, 120, 0.95, "plain"), (3.0, 0, 1.0, "checkpoint-defaults")],
    # the checkpoint's defaults (top-k 5, top-p 0.5, temperature 0.2, repetition penalty 1.3)
    # would each show in the flat case's tail mass and chi-square; a fourth case with the
    # request's own top-k and top-p would catch nothing the flat one does not
    ids=["flat", "top-k-and-top-p", "flat-checkpoint-defaults"],
)
def test_sampled_frequencies_match_the_recorded_distribution(
    tiny_model_dir: Path,
    tmp_path: Path,
    temperature: float,
    top_k: int,
    top_p: float,
    defaults: str,
) -> None:
    """3,000 first tokens of one prompt, sampled through the engine, against the distribution
    built by hand: recorded log-probs equal it, frequencies pass a chi-square test, and tokens
    ranked 50 and beyond appear as often as their mass says (at temperature 3 that mass is
    most of the distribution; transformers' default top-k of 50 once sampled none of them).
    With a checkpoint that ships its own sampling defaults, nothing changes."""
    model_dir = tiny_model_dir
    if defaults == "checkpoint-defaults":
        model_dir = _with_generation_defaults(tiny_model_dir, tmp_path)
    engine = HFEngine(model_dir)
    torch.manual_seed(0)
    req = request()
    sp = SamplingParams(temperature, top_p, max_new_tokens=1, top_k=top_k)
    tokens, logprobs = _first_tokens(engine, req, sp, 3000)
    p = _first_token_distribution(engine, req, temperature, top_k, top_p)
    stats = check_samples(tokens, logprobs, p)
    if temperature == 3.0:
        assert stats["tail_mass"] > 0.5  # the test has teeth: most mass lies beyond rank 50


def test_greedy_ignores_checkpoint_defaults(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A repetition penalty in the checkpoint's generation config must not change answers."""
    req = request()
    plain = _run(HFEngine(tiny_model_dir), [req])[0]
    rigged = _run(HFEngine(_with_generation_defaults(tiny_model_dir, tmp_path)), [req])[0]
    assert plain.response_ids == rigged.response_ids
    assert plain.logprobs == pytest.approx(rigged.logprobs, abs=1e-5)


def test_an_update_lands_mid_response_and_the_rest_is_sampled_by_the_new_weights(
    tiny_model_dir: Path,
) -> None:
    """Partial rollouts: with `interrupt_on_update` the update does not wait for the response
    in flight; it loads at the next token boundary and the tokens after it are drawn from
    the new weights. The new weights zero the output layer, so their distribution is uniform
    over the tokens not suppressed: every token after the switch has exactly that log-prob
    and entropy, and no token before it does."""
    e = HFEngine(tiny_model_dir, interrupt_on_update=True)
    state = e.model.state_dict()
    new = {k: torch.zeros_like(v) if k == "lm_head.weight" else v for k, v in state.items()}
    vocab = state["lm_head.weight"].shape[0]
    uniform = torch.log_softmax(
        process_logits(
            torch.zeros(1, vocab), SamplingSpec(1.0, 0, 1.0), torch.tensor(e.suppressed)
        ),
        -1,
    ).max()
    torch.manual_seed(0)

    async def scenario() -> tuple[Generation, float]:
        sp = SamplingParams(temperature=1.0, max_new_tokens=200)
        gen = asyncio.create_task(e.generate([e.prepare(request(), sp)]))
        await asyncio.sleep(0.03)  # a few tokens in (200 take ~0.3 s here)
        await e.update_weights(1, pack(new))
        return (await gen)[0], e.gate.wait_s

    g, waited = asyncio.run(scenario())
    assert g.weight_version == 0 and g.token_versions, "the update did not land mid-response"
    k = g.token_versions.index(1)
    assert k > 0 and g.token_versions == (0,) * k + (1,) * (len(g.response_ids) - k)
    after = torch.tensor(g.logprobs[k:])
    assert torch.allclose(after, uniform.expand_as(after), atol=1e-5)
    assert torch.allclose(torch.tensor(g.entropy[k:]), -uniform.expand_as(after), atol=1e-4)
    assert all(abs(lp - float(uniform)) > 1e-3 for lp in g.logprobs[:k])
    assert waited < g.latency_s / 2  # one token's wait, not the rest of the response


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0, max_new_tokens=20),
        SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=20),
        SamplingParams(temperature=1.3, top_k=40, max_new_tokens=20, stop=(")",)),
    ],
    ids=["greedy", "top-p", "top-k-stop"],
)
def test_the_lean_loop_draws_what_generate_draws(engine: HFEngine, sp: SamplingParams) -> None:
    """`HFEngine._decode` (one prefill, a forward a token on the KV cache, positions shifted
    by `rope_deltas`) against transformers' `generate` driving the same sampler: from the same
    seed, the same tokens, log-probs and finish reasons, for a left-padded batch of prompts
    with one, two and three screenshots and one without any."""
    shots = [
        tuple(png((60 * i, 90, 40 * k), box=10 * i) for k in range(1 + i % 3)) for i in range(5)
    ]
    encoded = [engine.processor.encode(request(screens=s).messages) for s in [*shots, ()]]
    assert len({len(e.input_ids) for e in encoded}) >= 3  # padding is exercised
    out = {}
    for mode in ("generate", "lean"):
        engine.decode = mode  # type: ignore[assignment]
        torch.manual_seed(5)
        out[mode] = engine.generate_sync(encoded, [sp] * len(encoded), 0)
    engine.decode = "lean"
    for g, lean in zip(out["generate"], out["lean"], strict=True):
        assert lean.response_ids == g.response_ids and lean.finish_reason == g.finish_reason
        assert lean.logprobs == pytest.approx(g.logprobs, abs=1e-5)
        assert lean.entropy == pytest.approx(g.entropy, abs=1e-5)
    if sp.stop:
        assert any(g.finish_reason == "stop" and ")" not in g.text for g in out["lean"])

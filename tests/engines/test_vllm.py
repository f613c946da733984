"""The vLLM engine on CPU (marker `vllm`): runs in .venv-vllm (`make test-vllm`).

Greedy answers must be those of the transformers engine on the same folder (prompt ids,
response ids, log-probs), and an in-place weight update must change them to what the
transformers engine answers with the new weights, with no engine restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM lives in .venv-vllm: run `make test-vllm`")

from dart_ray.engines.base import Generation, SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.engines.vllm import VLLMEngine, checkpoint_name
from dart_ray.models.weights import pack
from tests.policy_helpers import GREEDY, logits_in_3d, png, request

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the module: AsyncLLM binds to the loop it first runs on."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir: Path, loop: asyncio.AbstractEventLoop) -> Iterator[VLLMEngine]:
    async def make() -> VLLMEngine:
        # logprobs_topk=-1: the whole (631-token) distribution comes back, entropy is exact
        return VLLMEngine(tiny_model_dir, logprobs_topk=-1, kv_cache_mb=128, max_model_len=2048)

    engine = loop.run_until_complete(make())
    yield engine
    loop.run_until_complete(engine.close())


def _gen(
    engine: Any, loop: asyncio.AbstractEventLoop, reqs: list, sp: SamplingParams
) -> list[Generation]:  # type: ignore[type-arg]
    return loop.run_until_complete(engine.generate([engine.prepare(r, sp) for r in reqs]))


REQUESTS = [request(screens=(png((50 * i, 90, 200 - 40 * i), box=12 * i),)) for i in range(4)]


def test_greedy_matches_the_transformers_engine(
    vllm_engine: VLLMEngine, tiny_model_dir: Path, loop: asyncio.AbstractEventLoop
) -> None:
    hf = HFEngine(tiny_model_dir)
    ours, theirs = _gen(vllm_engine, loop, REQUESTS, GREEDY), _gen(hf, loop, REQUESTS, GREEDY)
    for v, h in zip(ours, theirs, strict=True):
        assert v.prompt_ids == h.prompt_ids  # vLLM's processor expands images as ours does
        assert v.response_ids == h.response_ids
        assert v.logprobs == pytest.approx(h.logprobs, abs=1e-4)  # M-RoPE on both sides
        assert v.entropy == pytest.approx(h.entropy, abs=5e-3) and v.entropy_exact
        assert v.model_sizes == h.model_sizes and v.weight_version == 0


def _logits(hf: HFEngine, req: Any, g: Generation) -> torch.Tensor:
    """(T, V) transformers logits for vLLM's response tokens, special tokens suppressed."""
    enc = hf.processor.encode(req.messages)
    ids = torch.tensor([list(g.prompt_ids) + list(g.response_ids)])
    z = logits_in_3d(hf.model, ids, enc)[0, len(g.prompt_ids) - 1 : -1]
    z[:, hf.suppressed] = -float("inf")
    return z


def test_sampled_logprobs_are_those_of_the_sampling_distribution(
    vllm_engine: VLLMEngine, tiny_model_dir: Path, loop: asyncio.AbstractEventLoop
) -> None:
    hf = HFEngine(tiny_model_dir)
    sp = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10)
    (g,) = _gen(vllm_engine, loop, REQUESTS[:1], sp)
    z = _logits(hf, REQUESTS[0], g)
    logp = (z / 0.7).log_softmax(-1)  # top_p only removes mass from tokens not sampled
    p_sorted = logp.exp().sort(-1, descending=True).values
    kept_mass = torch.tensor(
        [
            p_sorted[t][: (p_sorted[t].cumsum(0) - p_sorted[t] < 0.9).sum()].sum()
            for t in range(len(z))
        ]
    )
    want = logp.gather(-1, torch.tensor(g.response_ids)[:, None])[:, 0] - kept_mass.log()
    assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-2)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(2.0, 0, 1.0), (1.5, 120, 0.95)],
    ids=["flat", "top-k-and-top-p"],
)
def test_sampled_frequencies_match_the_recorded_distribution(
    vllm_engine: VLLMEngine,
    tiny_model_dir: Path,
    loop: asyncio.AbstractEventLoop,
    temperature: float,
    top_k: int,
    top_p: float,
) -> None:
    """(Runs before the in-place update test below, which changes the module's engine's
    weights: the transformers reference here is built from the folder's.)

    3,000 first tokens of one prompt through vLLM (temperature 2 is its maximum): the log-probs it records (processed
    mode, whole vocabulary) describe the distribution its tokens are drawn from (chi-square,
    the mass beyond rank 50), and that distribution is the one built by hand from the
    transformers logits (temperature, top-k, top-p), to float noise."""
    from tests.engines.sampling_stats import check_samples

    sp = SamplingParams(temperature, top_p, max_new_tokens=1, top_k=top_k)
    req = REQUESTS[0]
    gens = _gen(vllm_engine, loop, [req] * 3000, sp)
    first = gens[0]
    # the whole processed distribution of the first token, as vLLM returns it (logprobs -1)
    prepared = vllm_engine.prepare(req, sp)

    async def distribution() -> dict[int, float]:
        prompt = {
            "prompt": prepared.prompt_text,
            "multi_modal_data": {"image": list(prepared.images)},
        }
        final = None
        async for out in vllm_engine.llm.generate(prompt, vllm_engine._params(sp), "dist"):
            final = out
        assert final is not None
        return {t: lp.logprob for t, lp in final.outputs[0].logprobs[0].items()}

    dist = loop.run_until_complete(distribution())
    p = torch.zeros(len(vllm_engine.processor.tokenizer), dtype=torch.float64)
    for tok, lp in dist.items():
        p[tok] = torch.tensor(lp, dtype=torch.float64).exp()
    tokens = [g.response_ids[0] for g in gens]
    stats = check_samples(tokens, [g.logprobs[0] for g in gens], p)
    hf = HFEngine(tiny_model_dir)
    z = _logits(hf, req, first)[0].double() / temperature
    if top_k:
        z[z < z.sort(descending=True).values[top_k - 1]] = -float("inf")
    if top_p < 1:
        q = z.softmax(-1)
        sorted_q, order = q.sort(descending=True)
        z[order[(sorted_q.cumsum(0) - sorted_q) >= top_p]] = -float("inf")
    want = z.softmax(-1)
    assert 0.5 * (p - want).abs().sum() < 0.01  # total variation, vLLM vs transformers
    if temperature == 2.0:  # vLLM's highest; most of the mass still lies beyond rank 50
        assert stats["tail_mass"] > 0.4


def test_in_place_update_changes_the_answers(
    vllm_engine: VLLMEngine, tiny_model_dir: Path, loop: asyncio.AbstractEventLoop
) -> None:
    before = _gen(vllm_engine, loop, REQUESTS, GREEDY)
    hf = HFEngine(tiny_model_dir)
    new = {k: v * 1.3 for k, v in hf.model.state_dict().items()}
    hf.model.load_state_dict(new)
    seconds = loop.run_until_complete(vllm_engine.update_weights(1, pack(new)))
    after, want = _gen(vllm_engine, loop, REQUESTS, GREEDY), _gen(hf, loop, REQUESTS, GREEDY)
    assert seconds > 0 and vllm_engine.version == 1
    assert [g.response_ids for g in after] != [g.response_ids for g in before]
    same = 0
    for req, v, h in zip(REQUESTS, after, want, strict=True):
        assert v.weight_version == 1
        same += v.response_ids == h.response_ids
        # Scored by transformers with the new weights, every token vLLM chose is an argmax
        # (to float noise: two float32 kernels can break a near-tie differently) and its
        # log-prob is vLLM's. With the old weights still loaded both would be far off.
        z = _logits(hf, req, v)
        chosen = z.gather(-1, torch.tensor(v.response_ids)[:, None])[:, 0]
        assert torch.all(z.max(-1).values - chosen < 2e-2)
        want_lp = z.log_softmax(-1).gather(-1, torch.tensor(v.response_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(v.logprobs), want_lp, atol=2e-2)
    assert same >= 2  # and most answers are token for token the same


def test_lora_adapters_publish_in_place_and_answer_as_the_transformers_engine(
    tiny_model_dir: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """`train.lora` on vLLM: each published adapter version is added as a LoRA adapter on
    the base weights (no restart), and vLLM answers as the transformers engine holding the
    same adapters does; a second version replaces the first."""
    from dart_ray.models import lora
    from dart_ray.models.loading import load_model

    spec = lora.AdapterSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))

    def adapters(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        m = lora.add_adapters(load_model(tiny_model_dir), spec)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if ".lora_B." in n:
                    p.normal_(0, 0.3)
        return lora.adapter_state(m)

    async def make() -> VLLMEngine:
        return VLLMEngine(
            tiny_model_dir, logprobs_topk=-1, kv_cache_mb=128, max_model_len=2048, max_lora_rank=8
        )

    engine = loop.run_until_complete(make())
    hf = HFEngine(tiny_model_dir)
    try:
        base = _gen(engine, loop, REQUESTS, GREEDY)
        for version, seed in ((1, 1), (2, 2)):
            weights = pack(adapters(seed), spec)
            loop.run_until_complete(engine.update_weights(version, weights))
            loop.run_until_complete(hf.update_weights(version, weights))
            ours = _gen(engine, loop, REQUESTS, GREEDY)
            assert engine._lora.lora_int_id == version
            for req, v in zip(REQUESTS, ours, strict=True):
                # scored by transformers with the same adapters: every token vLLM chose is an
                # argmax (to float noise at a near-tie) and its log-prob is vLLM's
                assert v.weight_version == version
                z = _logits(hf, req, v)
                chosen = z.gather(-1, torch.tensor(v.response_ids)[:, None])[:, 0]
                assert torch.all(z.max(-1).values - chosen < 2e-2)
                want = z.log_softmax(-1).gather(-1, torch.tensor(v.response_ids)[:, None])[:, 0]
                assert torch.allclose(torch.tensor(v.logprobs), want, atol=5e-3)
        assert [g.response_ids for g in ours] != [g.response_ids for g in base]
    finally:
        loop.run_until_complete(engine.close())


def test_checkpoint_names_are_the_saved_layout() -> None:
    assert checkpoint_name("model.language_model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert (
        checkpoint_name("model.visual.patch_embed.proj.weight") == "visual.patch_embed.proj.weight"
    )
    assert checkpoint_name("lm_head.weight") == "lm_head.weight"

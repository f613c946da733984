"""The timing engine and trainer: the latencies of a 7B model on GPUs, hand-derived."""

from __future__ import annotations

import asyncio
import io
import time

import pyarrow as pa
import pytest
from PIL import Image

from dart_ray.config import TimingConfig
from dart_ray.engines.base import GenerateRequest, Generation, SamplingParams
from dart_ray.engines.timing import SimulatedGPU, TimingEngine, decode_step_s, prefill_s
from dart_ray.records import ActionKind
from dart_ray.train.timing import timed_step, train_step_s
from dart_ray.uitars.actions import parse_response
from dart_ray.uitars.prompts import ChatMessage, ImagePart, TextPart

# a GPU with easy numbers: 10 prompt tokens at 10,000/s (1 ms), steps of 1 ms + 1 ms/sequence
SIMPLE = TimingConfig(
    enabled=True,
    prompt_tokens=10,
    prefill_tokens_per_s=10_000,
    vision_s_per_image=0.0,
    decode_step_s=0.001,
    decode_step_s_per_seq=0.001,
)


def test_the_defaults_are_a_7b_model_on_h100s() -> None:
    """Prefill 14,000 / 30,000 s + 5 x 30 ms = 0.617 s; a decode step 7 ms alone, 23 ms with
    64 sequences; a DART-GUI step of 8 tasks x 8 rollouts x ~15 steps = 960 samples takes
    5 + 960 x 14,100 / 42,000 = 327 s ("minutes per step")."""
    t = TimingConfig()
    assert prefill_s(t, 5) == pytest.approx(0.6167, abs=1e-4)
    assert decode_step_s(t, 1) == pytest.approx(0.00725)
    assert decode_step_s(t, 64) == pytest.approx(0.023)
    assert train_step_s(t, 960) == pytest.approx(327.29, abs=0.01)


def _timed(coro_factory, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    async def main() -> list[float]:
        t0 = time.monotonic()

        async def one() -> float:
            await coro_factory()
            return time.monotonic() - t0

        return list(await asyncio.gather(*(one() for _ in range(n))))

    return asyncio.run(main())


async def _run(gpu: SimulatedGPU, tokens: int) -> None:
    async with gpu.gate.generating() as lease:
        await gpu.run(0, tokens, lease)


def test_decoding_batches_sequences_on_one_gpu() -> None:
    """50 tokens alone: 1 ms prefill + 50 x 2 ms = 0.101 s. Four at once: the prefills take
    turns (1 ms each), then all four decode together at 5 ms a step: ~0.25 s for all, not
    the 0.4 s of four in a row."""
    gpu = SimulatedGPU(SIMPLE)
    [alone] = _timed(lambda: _run(gpu, 50), 1)
    assert alone == pytest.approx(0.101, abs=0.03)
    gpu = SimulatedGPU(SIMPLE)
    four = _timed(lambda: _run(gpu, 50), 4)
    assert max(four) == pytest.approx(0.254, abs=0.05)
    assert gpu.work == 0 and gpu.busy_s == pytest.approx(max(four), abs=0.03)


def test_the_kv_cache_bounds_the_batch() -> None:
    """max_running 2: of four sequences two decode (3 ms a step, 50 tokens: 0.15 s), then the
    other two: ~0.30 s in all, where all four together took 0.25 s."""
    gpu = SimulatedGPU(SIMPLE.model_copy(update={"max_running": 2}))
    four = _timed(lambda: _run(gpu, 50), 4)
    assert max(four) == pytest.approx(0.30, abs=0.05)


def test_scale_shrinks_every_latency() -> None:
    gpu = SimulatedGPU(SIMPLE.model_copy(update={"scale": 0.5}))
    [alone] = _timed(lambda: _run(gpu, 50), 1)
    assert alone == pytest.approx(0.0505, abs=0.02)


def _request(w: int = 320, h: int = 240) -> GenerateRequest:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, format="PNG")
    msg = ChatMessage("user", (TextPart("click OK"), ImagePart(buf.getvalue())))
    return GenerateRequest((msg,), SamplingParams(max_new_tokens=500))


def test_the_engine_spreads_requests_over_its_gpus_and_answers_in_the_ui_tars_format() -> None:
    """Two GPUs, two requests: one each, so both take a single request's time."""
    t = SIMPLE.model_copy(update={"rollout_gpus": 2, "response_tokens_sigma": 0.0})
    engine = TimingEngine(t, seed=3)
    req = engine.prepare(_request(), SamplingParams())

    async def main() -> list:  # type: ignore[type-arg]
        t0 = time.monotonic()
        gens = await asyncio.gather(engine.generate([req]), engine.generate([req]))
        return [time.monotonic() - t0, [g for gs in gens for g in gs]]

    elapsed, gens = asyncio.run(main())
    # 100 tokens alone: 1 ms + 100 x 2 ms = 0.201 s; together on one GPU it would be 0.301 s
    assert elapsed == pytest.approx(0.201, abs=0.05)
    assert all(g.weight_version == 0 and g.model_sizes == ((320, 240),) for g in gens)
    for g in gens:
        action = parse_response(g.text).action
        assert action.kind in (ActionKind.CLICK, ActionKind.FINISHED), g.text
        if action.kind is ActionKind.CLICK:
            assert action.point is not None
            assert 0 <= action.point[0] < 320 and 0 <= action.point[1] < 240
        assert len(g.response_ids) == len(g.logprobs) == len(g.entropy) > 0
    u = engine.utilisation()
    assert u["gpus"] == 2 and u["gpu_busy_s"] == pytest.approx(2 * 0.201, abs=0.08)


def test_finish_prob_one_ends_every_episode() -> None:
    engine = TimingEngine(SIMPLE.model_copy(update={"finish_prob": 1.0}))
    assert parse_response(engine.respond((100, 100))).action.kind is ActionKind.FINISHED


def test_a_weight_load_takes_its_time_and_bumps_the_version() -> None:
    engine = TimingEngine(SIMPLE.model_copy(update={"weight_load_s": 0.2}))
    t0 = time.monotonic()
    asyncio.run(engine.update_weights(1, None))  # type: ignore[arg-type]
    assert time.monotonic() - t0 == pytest.approx(0.2, abs=0.05)
    assert engine.version == 1


def test_the_timed_trainer_step_sleeps_for_its_samples() -> None:
    """4 samples: 0.05 + 4 x 1,000 / 100,000 = 0.09 s."""
    t = TimingConfig(train_overhead_s=0.05, train_tokens_per_sample=1000, train_tokens_per_s=1e5)
    shard = pa.RecordBatch.from_pydict({"x": [1, 2, 3, 4]})
    t0 = time.monotonic()
    m = timed_step(shard, t)
    assert time.monotonic() - t0 == pytest.approx(0.09, abs=0.03)
    assert m["tokens"] == 4000 and m["simulated_step_s"] == pytest.approx(0.09)


@pytest.mark.parametrize("interrupt", [False, True])
def test_an_update_drains_the_decode_batch_or_lands_between_its_steps(interrupt: bool) -> None:
    """100 tokens at 2 ms a step (0.201 s); an update (50 ms load) asks at 50 ms. Draining,
    it waits ~150 ms for the response to finish, which is all version 0. Interrupting, it
    waits for the decode loop's next step (~2 ms), the batch pauses 50 ms while it loads,
    and the last ~3/4 of the response is version 1's."""
    t = SIMPLE.model_copy(update={"response_tokens_sigma": 0.0, "weight_load_s": 0.05})
    engine = TimingEngine(t, interrupt_on_update=interrupt)
    req = engine.prepare(_request(), SamplingParams())

    async def main() -> tuple[Generation, float]:
        t0 = time.monotonic()
        gen = asyncio.create_task(engine.generate([req]))
        await asyncio.sleep(0.05)
        await engine.update_weights(1, None)  # type: ignore[arg-type]
        [g] = await gen
        return g, time.monotonic() - t0

    g, elapsed = asyncio.run(main())
    assert g.weight_version == 0 and engine.version == 1
    if not interrupt:
        assert g.token_versions == ()
        assert engine.gate.wait_s == pytest.approx(0.15, abs=0.04)
        assert elapsed == pytest.approx(0.25, abs=0.05)
        return
    assert engine.gate.wait_s < 0.02
    k = g.token_versions.index(1)
    assert g.token_versions == (0,) * k + (1,) * (len(g.response_ids) - k)
    assert k / len(g.response_ids) == pytest.approx(0.25, abs=0.1)
    assert elapsed == pytest.approx(0.251, abs=0.05)  # the response, paused for the load


def test_an_update_waits_for_no_request_queued_for_prefill() -> None:
    """Interrupting, requests waiting for the prefill lane are paused where they wait: two
    requests with 100 ms prefills, the update asks 10 ms in; it waits for the first prefill
    (~90 ms), not for the second; the first response's first token is the old prefill's,
    every later token the new weights', and the second request is all version 1."""
    t = SIMPLE.model_copy(
        update={
            "prompt_tokens": 1000,
            "prefill_tokens_per_s": 10_000,
            "response_tokens_sigma": 0.0,
            "weight_load_s": 0.05,
            "rollout_gpus": 1,
        }
    )
    engine = TimingEngine(t, interrupt_on_update=True)
    req = engine.prepare(_request(), SamplingParams())

    async def main() -> list[Generation]:
        gens = [asyncio.create_task(engine.generate([req])) for _ in range(2)]
        await asyncio.sleep(0.01)
        await engine.update_weights(1, None)  # type: ignore[arg-type]
        return [g for task in gens for g in await task]

    first, second = asyncio.run(main())
    assert engine.gate.wait_s == pytest.approx(0.09, abs=0.04)
    # the first token came from the prefill on version 0; the rest from version 1's steps
    assert first.weight_version == 0 and first.token_versions[0] == 0
    assert set(first.token_versions[1:]) == {1}
    assert second.weight_version == 1 and second.token_versions == ()

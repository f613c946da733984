"""The timing engine: a policy replica that takes as long as a 7B model on GPUs, without one.

The timing mode (`[timing]`, dart_ray.config.timing) replaces compute by calibrated latencies
and keeps every other part real. This engine stands for `timing.rollout_gpus` GPUs, each
serving one copy of the model the way vLLM does:

    prefill   one request at a time per GPU (compute-bound):
              prompt_tokens / prefill_tokens_per_s + images x vision_s_per_image
    decode    every running sequence advances one token per step (memory-bound):
              step = decode_step_s + decode_step_s_per_seq x running,  running <= max_running

so a GPU's decode throughput grows with the batch until the KV cache is full, and a request's
latency grows with the load: the shape that decides how busy a decoupled or a synchronous
pipeline keeps its rollout GPUs. A request goes to the GPU with the least work (least-loaded
routing, as DART-GUI's model service does). Every figure is multiplied by `timing.scale`.

A response is a simulated policy's: with probability `finish_prob` it ends the episode
(`finished()`), otherwise it clicks a uniformly random point of the current screenshot; its
length in simulated tokens (lognormal, `response_tokens_median`, `response_tokens_sigma`) sets
the decode time. The returned ids are the UTF-8 bytes of the text with the log-probability of
a uniform byte (log 1/256) each: the timing trainer does not score them, it takes as long as
a 7B step on `timing.train_tokens_per_sample` per sample. Weight loads take `weight_load_s`,
behind the same version gate as a real engine: in-flight generations finish first, or with
`policy.interrupt_on_update` (partial rollouts) each GPU's decode loop pauses at its next step
while the weights load and every running sequence resumes on the new version (a request
waiting for prefill or for room in the batch is paused where it waits). The simulated tokens
after the switch map onto the returned ids proportionally (`Generation.token_versions`).

`busy_s` is the time each GPU had work (prefilling or decoding), for the rollout utilisation.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image

from dart_ray.config.timing import TimingConfig
from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    Lease,
    PreparedRequest,
    SamplingParams,
    VersionGate,
    refuse_forced,
)
from dart_ray.models.weights import PackedWeights
from dart_ray.records import Action, ActionKind
from dart_ray.uitars.actions import format_response

BYTE_LOGPROB = -math.log(256)


def prefill_s(t: TimingConfig, images: int) -> float:
    """Seconds to prefill one turn's prompt (unscaled)."""
    return t.prompt_tokens / t.prefill_tokens_per_s + images * t.vision_s_per_image


def decode_step_s(t: TimingConfig, running: int) -> float:
    """Seconds of one decode step with `running` sequences (unscaled)."""
    return t.decode_step_s + t.decode_step_s_per_seq * running


@dataclass
class _Seq:
    remaining: float
    done: asyncio.Future[None]
    lease: Lease
    tokens: int

    @property
    def next_token(self) -> int:
        """Index of the simulated token the next decode step samples."""
        return round(self.tokens - self.remaining)


@dataclass
class SimulatedGPU:
    """One GPU: a prefill lane and a decode batch, simulated in real (scaled) time."""

    t: TimingConfig
    gate: VersionGate = field(default_factory=VersionGate)
    """The replica's gate: on an interruptible one, the decode loop pauses for updates."""
    tick_s: float = 0.05
    """Longest real sleep of the decode loop; an arrival wakes it sooner, to join the batch."""
    running: list[_Seq] = field(default_factory=list)
    waiting: list[_Seq] = field(default_factory=list)
    work: int = 0
    """Requests on this GPU (prefilling, waiting or decoding): the router's load."""
    busy_s: float = 0.0
    _busy_since: float | None = None
    _prefill: asyncio.Lock = field(default_factory=asyncio.Lock)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _loop: asyncio.Task[None] | None = None

    def _enter(self) -> None:
        if self.work == 0:
            self._busy_since = time.monotonic()
        self.work += 1

    def _leave(self) -> None:
        self.work -= 1
        if self.work == 0 and self._busy_since is not None:
            self.busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    def busy(self) -> float:
        """Seconds this GPU has had work so far (the current stretch included)."""
        live = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self.busy_s + live

    def wake(self) -> None:
        """Make the decode loop look at the gate now (an update is waiting)."""
        self._wake.set()

    async def run(self, images: int, tokens: int, lease: Lease) -> None:
        """Prefill, then decode `tokens` tokens alongside the other running sequences."""
        self._enter()
        try:
            if self.gate.interruptible:  # waiting for the prefill lane holds no compute
                async with self.gate.paused([lease], [0]):
                    await self._prefill.acquire()
            else:
                await self._prefill.acquire()
            try:
                await asyncio.sleep(prefill_s(self.t, images) * self.t.scale)
            finally:
                self._prefill.release()
            await lease.boundary(1)  # the prefill's forward pass gave token 0
            seq = _Seq(float(tokens), asyncio.get_running_loop().create_future(), lease, tokens)
            self.waiting.append(seq)
            if self._loop is None or self._loop.done():
                self._loop = asyncio.create_task(self._decode())
            self._wake.set()
            await seq.done
        finally:
            self._leave()

    async def _decode(self) -> None:
        while self.running or self.waiting:
            if self.gate.update_waiting:  # partial rollouts: the update lands between steps
                seqs = self.running + self.waiting
                async with self.gate.paused([s.lease for s in seqs], [s.next_token for s in seqs]):
                    pass
            room = self.t.max_running - len(self.running)
            self.running += self.waiting[:room]
            del self.waiting[:room]
            step = decode_step_s(self.t, len(self.running)) * self.t.scale
            first = min(s.remaining for s in self.running)
            dt = min(first * step, self.tick_s)
            self._wake.clear()
            t0 = time.monotonic()
            with contextlib.suppress(TimeoutError):  # an arrival joins at once
                await asyncio.wait_for(self._wake.wait(), timeout=dt)
            tokens = (time.monotonic() - t0) / step if step > 0 else first
            for s in self.running:
                s.remaining -= tokens
            for s in [s for s in self.running if s.remaining <= 1e-9]:
                s.done.set_result(None)
            self.running = [s for s in self.running if s.remaining > 1e-9]


class TimingEngine(Engine):
    """`timing.rollout_gpus` simulated GPUs behind one replica (see the module docstring)."""

    name = "timing"

    def __init__(
        self, timing: TimingConfig, interrupt_on_update: bool = False, seed: int = 0
    ) -> None:
        super().__init__(interrupt_on_update)
        self.t = timing
        self.gpus = [SimulatedGPU(timing, self.gate) for _ in range(timing.rollout_gpus)]
        self.gate.on_update.extend(g.wake for g in self.gpus)
        self.rng = random.Random(seed)
        self.started = time.monotonic()

    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        refuse_forced(request, "timing")
        images = tuple(
            Image.open(io.BytesIO(b))  # the header only: the size, not the pixels
            for m in request.messages
            for b in m.images
        )
        return PreparedRequest(request.sampling or defaults, images=images)

    def respond(self, size: tuple[int, int]) -> str:
        """The simulated policy's next response for a screenshot of `size`."""
        if self.rng.random() < self.t.finish_prob:
            return format_response("done.", Action(ActionKind.FINISHED, text=""))
        w, h = size
        point = (self.rng.randrange(w), self.rng.randrange(h))
        return format_response("simulated.", Action(ActionKind.CLICK, point=point), None, False)

    def response_tokens(self, limit: int) -> int:
        t = self.t
        n = t.response_tokens_median * math.exp(t.response_tokens_sigma * self.rng.gauss(0, 1))
        return max(1, min(limit, round(n)))

    async def _one(self, r: PreparedRequest) -> Generation:
        t0 = time.perf_counter()
        size = r.images[-1].size if r.images else (1920, 1080)
        text = self.respond(size)
        tokens = self.response_tokens(r.sampling.max_new_tokens)
        finish = "length" if tokens >= r.sampling.max_new_tokens else "stop"
        gpu = min(self.gpus, key=lambda g: g.work)
        async with self.gate.generating() as lease:
            await gpu.run(len(r.images), tokens, lease)
        ids = tuple(text.encode())
        # the simulated tokens' switches, onto the returned ids in proportion
        lease.switches = [(math.ceil(k * len(ids) / tokens), v) for k, v in lease.switches]
        version, token_versions = lease.versions(len(ids))
        return Generation(
            text=text,
            response_ids=ids,
            prompt_ids=tuple(b"<simulated prompt>"),
            logprobs=(BYTE_LOGPROB,) * len(ids),
            entropy=(-BYTE_LOGPROB,) * len(ids),
            weight_version=version,
            finish_reason=finish,
            model_sizes=(size,),
            latency_s=time.perf_counter() - t0,
            token_versions=token_versions,
        )

    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        """One generation per request, each holding the gate on its own."""
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _load(self, weights: PackedWeights) -> None:
        """A 7B load takes `weight_load_s`; the tiny weights published for real are dropped."""
        await asyncio.sleep(self.t.weight_load_s * self.t.scale)

    def utilisation(self) -> dict[str, float]:
        """Busy seconds of the GPUs and the replica's age, for the rollout utilisation."""
        return {
            "gpus": float(len(self.gpus)),
            "gpu_busy_s": sum(g.busy() for g in self.gpus),
            "alive_s": time.monotonic() - self.started,
        }

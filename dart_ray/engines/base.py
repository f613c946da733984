"""The engine interface the policy server drives, and the records it exchanges.

An engine turns chat messages with screenshots into a `Generation`: the text and everything
the trainer needs to learn from it without re-tokenising (prompt ids with image tokens
expanded, response ids, per-token log-probs and entropy under the distribution the token was
actually sampled from) and the weight version that produced it.

Versions are the contract that makes decoupled RL sound: the trainer corrects for the policy
that acted (truncated importance sampling), so a response must never mix two weight versions
and must say which one it came from. `VersionGate` guarantees that for both engines: a
generation holds the gate for its whole run; an update waits until the generations in flight
finish, keeps new ones waiting while it loads, then bumps the version. So a request that
started before an update finishes on the old weights and reports the old version.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image

from dart_ray.algo.sampling import SamplingSpec
from dart_ray.models.loading import EncodedPrompt
from dart_ray.prompts import ChatMessage
from dart_ray.weights import PackedWeights


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one response. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    """Strings that end the response; the text is cut before the first one."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 keeps all."""

    def __post_init__(self) -> None:
        self.spec  # noqa: B018  (validates temperature, top_k and top_p)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def spec(self) -> SamplingSpec:
        """The distribution-shaping part, shared with the trainer."""
        return SamplingSpec(self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams | None = None
    """None: the server's defaults from `policy.*` config."""


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request checked and turned into model inputs, ready to join a batch.

    Preparing happens per request, before batching, so one malformed request fails alone.
    """

    sampling: SamplingParams
    encoded: EncodedPrompt | None = None
    """Token ids and pixels (the transformers engine)."""
    prompt_text: str = ""
    """Chat-template text with one image pad per image (the vLLM engine)."""
    images: tuple[Image.Image, ...] = ()


@dataclass(frozen=True, slots=True)
class Generation:
    """One response, with what training and coordinate mapping need."""

    text: str
    """Decoded response, special tokens skipped, cut before a stop string."""
    response_ids: tuple[int, ...]
    """Sampled tokens, the end token included when the model emitted it."""
    prompt_ids: tuple[int, ...]
    """The prompt as the model saw it (image pads expanded)."""
    logprobs: tuple[float, ...]
    """log pi(token) under the distribution sampled from (after temperature, top-k and
    top-p; for greedy decoding, the model's distribution at temperature 1)."""
    entropy: tuple[float, ...]
    """Entropy of that distribution at each response token (nats)."""
    weight_version: int
    finish_reason: Literal["stop", "length"]
    model_sizes: tuple[tuple[int, int], ...] = ()
    """(width, height) each prompt image was resized to: the model's coordinate frame."""
    entropy_exact: bool = True
    """False where the engine only sees the top log-probs (vLLM): a lower bound then."""
    latency_s: float = 0.0
    batch_size: int = 1
    """How many requests shared the forward passes that produced this one."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.logprobs) != n or len(self.entropy) != n:
            raise ValueError(
                f"{n} response tokens but {len(self.logprobs)} log-probs, "
                f"{len(self.entropy)} entropies"
            )


@dataclass
class VersionGate:
    """Readers (generations) share it; a writer (weight update) waits for them to drain."""

    version: int = 0
    _active: int = 0
    _updating: bool = False
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    @asynccontextmanager
    async def generating(self) -> AsyncIterator[int]:
        """Hold the current version for the duration of one generation; yields it."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._active += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def updating(self, version: int) -> AsyncIterator[None]:
        """Exclusive access to load weights; the version becomes `version` on success."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._updating = True
            await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
            self.version = version
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()


class Engine(ABC):
    """Generation and in-place weight loading; every method is async (the server's loop)."""

    name: str

    def __init__(self) -> None:
        self.gate = VersionGate()
        self.last_update_s = 0.0

    @property
    def version(self) -> int:
        return self.gate.version

    @abstractmethod
    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        """Check and encode one request; raises BadRequest naming what is wrong."""

    @abstractmethod
    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        """One Generation per request, in order; each on a single weight version."""

    @abstractmethod
    async def _load(self, weights: PackedWeights) -> None:
        """Copy the weights into the running model (no restart)."""

    async def update_weights(self, version: int, weights: PackedWeights) -> float:
        """Load `weights` in place as `version` once in-flight generations finish; seconds.

        Loading the version already loaded is a no-op (so a retried publish is harmless);
        an older version is refused.
        """
        if version == self.version:
            return 0.0
        if version < self.version:
            raise ValueError(f"version {version} is older than the loaded {self.version}")
        async with self.gate.updating(version):
            t0 = time.perf_counter()
            await self._load(weights)
            self.last_update_s = time.perf_counter() - t0
        return self.last_update_s

    async def close(self) -> None:  # noqa: B027  (optional hook)
        """Release engine resources."""

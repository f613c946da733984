"""The engine interface the policy server drives, and the records it exchanges.

An engine turns chat messages with screenshots into a `Generation`: the text and everything
the trainer needs to learn from it without re-tokenising (prompt ids with image tokens
expanded, response ids, per-token log-probs and entropy under the distribution the token was
actually sampled from) and the weight version that produced it.

Versions are the contract that makes decoupled RL sound: the trainer corrects for the policy
that acted (truncated importance sampling on per-token behaviour log-probs), so every token
must say which weights sampled it. `VersionGate` guarantees that for every engine, in one of
two ways (`policy.interrupt_on_update`):

- drain (the default): a generation holds the gate for its whole run; an update waits until
  the generations in flight finish, keeps new ones waiting while it loads, then bumps the
  version. A response never mixes two versions.
- interrupt (partial rollouts): an update waits only until every generation in flight reaches
  a token boundary (`Lease.boundary`, called by the engine between decode steps), loads while
  they are paused there, and they resume on the new weights. A long response can then span
  versions: `Generation.token_versions` says which version sampled each token, and
  `weight_version` is the oldest (staleness is measured from it). The update no longer waits
  for the longest response in flight (seconds at 500 tokens), only for one decode step.
  The keys and values cached for the tokens before the boundary were computed by the old
  weights and are kept (recomputing them would cost a prefill per sequence); the log-probs
  recorded are those of the distribution each token was actually drawn from either way.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image

from dart_ray.algo.sampling import SamplingSpec
from dart_ray.models.loading import EncodedPrompt
from dart_ray.models.weights import PackedWeights
from dart_ray.uitars.prompts import ChatMessage


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
    top_logprobs: int = 0
    """Also record the k most likely tokens and their log-probs at each response token
    (`Generation.top_logprobs`; the OpenAI route's `top_logprobs`). 0: none."""

    def __post_init__(self) -> None:
        self.spec  # noqa: B018  (validates temperature, top_k and top_p)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")

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
    forced: str = ""
    """A response to score instead of sampling one (teacher forcing): the engine answers
    with its tokens, the end token appended, and their log-probs and entropies under the
    current weights and `sampling`'s distribution, as if it had drawn them. What seeds the
    success-replay pool with written solutions (`rollout.replay_seeds`). Engines that cannot
    score (vLLM here, the script engine) refuse it when preparing."""


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
    forced_ids: tuple[int, ...] = ()
    """`GenerateRequest.forced` as token ids (the end token last): score these, sample nothing."""


def refuse_forced(request: GenerateRequest, engine: str) -> None:
    """For an engine's `prepare` where it cannot score a forced response: a clear error."""
    if request.forced:
        raise ValueError(
            f"policy.engine = {engine!r} cannot score a forced response (teacher forcing, "
            "what rollout.replay_seeds needs); use policy.engine = 'hf'"
        )


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
    token_versions: tuple[int, ...] = ()
    """The weight version that sampled each response token, where a weight update landed
    mid-response (`policy.interrupt_on_update`); empty when every token is `weight_version`'s."""
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    """Per response token, (token id, log-prob) of the most likely tokens, best first, under
    the distribution `logprobs` is of (tokens it cannot draw left out), when the request
    asked (`SamplingParams.top_logprobs`); empty otherwise."""
    replica: str = ""
    """The policy server replica that produced it (its Serve replica id; empty from an engine
    called directly): what tells which replica answered, e.g. a new one's first requests."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.logprobs) != n or len(self.entropy) != n:
            raise ValueError(
                f"{n} response tokens but {len(self.logprobs)} log-probs, "
                f"{len(self.entropy)} entropies"
            )
        if self.top_logprobs and len(self.top_logprobs) != n:
            raise ValueError(f"{n} response tokens but {len(self.top_logprobs)} top log-probs")
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"{n} response tokens but {len(self.token_versions)} token versions")
        if self.token_versions and min(self.token_versions) != self.weight_version:
            raise ValueError(
                f"weight_version {self.weight_version} is not the oldest token version "
                f"{min(self.token_versions)}"
            )

    @property
    def newest_version(self) -> int:
        return max(self.token_versions, default=self.weight_version)


def versions_per_token(
    n: int, start: int, switches: Sequence[tuple[int, int]]
) -> tuple[int, tuple[int, ...]]:
    """For `n` tokens sampled on `start` until each switch (first token, new version): the
    oldest version that sampled a token, and each token's version as
    `Generation.token_versions` wants it (empty when they are all one version)."""
    version, at, out = start, 0, []
    for first, new in sorted(switches):
        first = min(max(first, at), n)
        out += [version] * (first - at)
        version, at = new, first
    out += [version] * (n - at)
    if not out:
        return start, ()
    if min(out) == max(out):
        return out[0], ()
    return min(out), tuple(out)


@dataclass
class Lease:
    """One generation's hold on the gate: the version it runs on, and where that changed."""

    gate: VersionGate
    version: int
    start_version: int
    switches: list[tuple[int, int]] = field(default_factory=list)
    """(index of the first token sampled by the new weights, new version), in order."""
    _paused: bool = False

    def versions(self, n: int) -> tuple[int, tuple[int, ...]]:
        """`Generation.weight_version` and `token_versions` for a response of `n` tokens."""
        return versions_per_token(n, self.start_version, self.switches)

    async def boundary(self, next_token: int) -> int:
        """A point between two decode steps, before the token at index `next_token` is
        sampled. On an interruptible gate with an update waiting, the update lands here (this
        generation pauses while the weights load); returns the version the next token is
        sampled on. On a draining gate it never pauses."""
        if self.gate.update_waiting:
            async with self.gate.paused([self], [next_token]):
                pass
        return self.version


@dataclass
class VersionGate:
    """Generations share it; a weight update waits for them to drain, or, on an interruptible
    gate, for each to pause at a token boundary (see the module docstring)."""

    version: int = 0
    interruptible: bool = False
    _active: int = 0
    _paused: int = 0
    _updating: bool = False
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    updates: int = 0
    wait_s: float = 0.0
    """Total seconds updates waited for generations in flight (to finish, or to pause)."""
    blocked_s: float = 0.0
    """Total seconds updates held the gate (waiting and loading): new generations wait then."""
    on_update: list[Callable[[], None]] = field(default_factory=list)
    """Called when an update starts waiting (an engine's decode loop may be asleep)."""

    @property
    def update_waiting(self) -> bool:
        """An update waits for the generations in flight to pause (interruptible gates only:
        a draining gate lets them run to their end)."""
        return self.interruptible and self._updating

    @asynccontextmanager
    async def generating(self) -> AsyncIterator[Lease]:
        """Hold the gate for one generation (or one batch of them); yields its lease."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._active += 1
            lease = Lease(self, self.version, self.version)
        try:
            yield lease
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def paused(
        self, leases: Sequence[Lease], next_tokens: Sequence[int]
    ) -> AsyncIterator[None]:
        """The leases' generations hold no compute in this block (waiting at a token
        boundary, or in a queue): an update may land meanwhile. On leaving, once no update is
        loading, each lease takes the current version, recording the switch at its
        `next_tokens` entry. Holding the gate this way is only for interruptible gates."""
        async with self._cond:
            for lease in leases:
                assert not lease._paused, "a lease paused twice"
                lease._paused = True
            self._paused += len(leases)
            self._cond.notify_all()
        try:
            yield
        finally:
            async with self._cond:
                await self._cond.wait_for(lambda: not self._updating)
                self._paused -= len(leases)
                for lease, next_token in zip(leases, next_tokens, strict=True):
                    lease._paused = False
                    if lease.version != self.version:
                        lease.switches.append((next_token, self.version))
                        lease.version = self.version

    @asynccontextmanager
    async def updating(self, version: int) -> AsyncIterator[None]:
        """Exclusive access to load weights; the version becomes `version` on success."""
        t0 = time.perf_counter()
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._updating = True
            self._cond.notify_all()  # paused generations re-check; new ones wait
            for wake in self.on_update:
                wake()
            t_wait = time.perf_counter()
            await self._cond.wait_for(
                lambda: self._active == (self._paused if self.interruptible else 0)
            )
            self.wait_s += time.perf_counter() - t_wait
        try:
            yield
            self.version = version
            self.updates += 1
        finally:
            async with self._cond:
                self._updating = False
                self.blocked_s += time.perf_counter() - t0
                self._cond.notify_all()


class Engine(ABC):
    """Generation and in-place weight loading; every method is async (the server's loop)."""

    name: str

    def __init__(self, interrupt_on_update: bool = False) -> None:
        self.gate = VersionGate(interruptible=interrupt_on_update)
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
        """Load `weights` in place as `version` once in-flight generations finish (or pause,
        on an interruptible gate); seconds of loading.

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

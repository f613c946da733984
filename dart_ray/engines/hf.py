"""The transformers engine: batched generation with exact log-probs and entropy.

The engine owns its sampler. `generate` runs greedy (`do_sample=False`, so transformers adds
none of its sampling warpers), and the last logits processor, `_Sampler`, does the sampling
itself: it turns the model's logits into the distribution to sample from with the same pure
function the trainer scores with (`dart_ray.algo.sampling.process_logits`: suppress special
tokens -> temperature -> top-k -> top-p), draws the token from exactly that distribution,
records its log-prob and the distribution's entropy, and hands `generate` a row that is -inf
everywhere but the drawn token, which greedy selection then takes. What is sampled is what is
recorded, whatever warpers a transformers version would add: an earlier version of this
engine let `generate` sample, and transformers' default top-k of 50 cut the distribution
after the log-probs were recorded (at temperature 3 on the tiny model, 78% of the recorded
mass was never sampled).

The model's own `generation_config` is replaced by a neutral one at load: transformers fills
every unset generation field from it, and a checkpoint's defaults (Qwen's repetition penalty
1.05, for one) would otherwise reshape the logits before our processors see them.

The decode loop is the engine's own (`_decode`, `policy.hf_decode = "lean"`): one prefill,
then one forward a token on the KV cache with the new token's 3D position computed here.
`generate` drives the same sampler when asked (`"generate"`); from the same seed the two draw
the same tokens (a test holds them to it). The loop is 1.06x faster on rung 3's batches of
eight on a quiet machine and 1.2x on a busy one (`benchmarks/decode.py`): past `generate`'s
bookkeeping, the turn is the model's own forward passes (docs/BENCHMARKS.md).

Memory stays O(batch x vocab): only the current step's distribution is alive. Greedy decoding
records the model's distribution at temperature 1 (with suppressed tokens removed).

Requests of one batch may differ in length and in number of images: prompts are left-padded
and the images of all requests are concatenated in order, which is how Qwen2.5-VL's forward
expects them. Requests with different sampling parameters run as separate sub-batches.

Partial rollouts (`policy.interrupt_on_update`): after drawing each token the sampler offers
the gate a boundary (`Lease.boundary`, on the server's event loop); an update waiting there
loads the new weights into the model while `generate` is paused between two forward passes,
and the next token is drawn from the new weights (`Generation.token_versions`).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from dart_ray.algo.sampling import SamplingSpec, entropy_of, process_logits
from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    Lease,
    PreparedRequest,
    SamplingParams,
    versions_per_token,
)
from dart_ray.models.loading import EncodedPrompt, PolicyProcessor, image_inputs, load_model
from dart_ray.models.weights import PackedWeights, load_into, load_packed_adapter, share_into
from dart_ray.train.forward import LOGP_FLOOR


class _Sampler(LogitsProcessor):
    """Draws each next token from the processed distribution and records its log-prob and
    the distribution's entropy; returns logits that make greedy selection pick that token."""

    def __init__(
        self,
        spec: SamplingSpec,
        suppressed: Sequence[int],
        boundary: Callable[[int], None] | None = None,
        top: int = 0,
    ) -> None:
        self.spec = spec
        self.top = top
        """Also record the `top` most likely tokens at each step (0: none)."""
        self.top_values: list[torch.Tensor] = []  # each (B, top)
        self.top_ids: list[torch.Tensor] = []  # each (B, top)
        self.suppressed = torch.tensor(list(suppressed), dtype=torch.long)
        self.boundary = boundary
        """Called with the next token's index after each draw (a weight update may land)."""
        self.logprobs: list[torch.Tensor] = []  # each (B,)
        self.entropy: list[torch.Tensor] = []  # each (B,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logp = torch.log_softmax(process_logits(scores.float(), self.spec, self.suppressed), -1)
        probs = logp.exp()
        chosen = logp.argmax(-1) if self.spec.greedy else torch.multinomial(probs, 1)[:, 0]  # (B,)
        self.logprobs.append(logp.gather(-1, chosen[:, None])[:, 0])
        self.entropy.append(entropy_of(logp))
        if self.top:
            values, ids = logp.topk(min(self.top, logp.shape[-1]), -1)
            self.top_values.append(values)
            self.top_ids.append(ids)
        out = torch.full_like(scores, float("-inf"))
        if self.boundary is not None:
            self.boundary(len(self.logprobs))
        return out.scatter_(-1, chosen[:, None], 0.0)  # type: ignore[return-value]

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) log-probs and entropies of the tokens drawn."""
        return torch.stack(self.logprobs, 1), torch.stack(self.entropy, 1)

    def top_of(self, b: int, n: int) -> tuple[tuple[tuple[int, float], ...], ...]:
        """Row `b`'s first `n` steps: (token id, log-prob) of the most likely tokens, best
        first, the ones the distribution cannot draw (log-prob -inf) left out."""
        if not self.top:
            return ()
        return tuple(
            tuple(
                (int(i), float(v))
                for v, i in zip(self.top_values[t][b], self.top_ids[t][b], strict=True)
                if math.isfinite(v)
            )
            for t in range(n)
        )


def neutral_generation_config(eos_id: int, pad_id: int) -> GenerationConfig:
    """A generation config that adds no logits processor of its own."""
    return GenerationConfig(
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        min_length=0,
        temperature=1.0,
        # None, not 0: greedy adds no top-k warper either way, and transformers warns that a
        # top_k set beside do_sample=False "may be ignored" (a job log's noise, issue 45)
        top_k=None,
        top_p=1.0,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )


class HFEngine(Engine):
    """Qwen2.5-VL through transformers, on CPU or one GPU."""

    name = "hf"

    def __init__(
        self,
        model_path: str | Path,
        allow_special_tokens: Sequence[str] = (),
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        weights_load: Literal["share", "copy"] = "share",
        interrupt_on_update: bool = False,
        decode: Literal["lean", "generate"] = "lean",
    ) -> None:
        super().__init__(interrupt_on_update)
        self.weights_load = weights_load
        self.decode = decode
        """`lean`: our own decode loop (`_decode`); `generate`: transformers' `generate`."""
        self._shared: PackedWeights | None = None  # keeps shared weights mapped
        self.processor = PolicyProcessor.from_dir(model_path)
        self.model = load_model(model_path, dtype=dtype, device=device)
        self.device = device
        self.suppressed = self.processor.suppressed_ids(allow_special_tokens)
        self.model.generation_config = neutral_generation_config(
            self.processor.eos_id, self.processor.pad_id
        )
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        """The KV cache's argument and output name (transformers 5.25 renamed it)."""

    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        return PreparedRequest(
            sampling=request.sampling or defaults,
            encoded=self.processor.encode(request.messages),
            forced_ids=self.forced_ids(request.forced) if request.forced else (),
        )

    def forced_ids(self, text: str) -> tuple[int, ...]:
        """`text` as response tokens, the end token appended; an error where the tokenizer
        cannot give the text back (the model would be taught other text than the script's)."""
        ids = self.processor.tokenizer.encode(text, add_special_tokens=False)
        if self.processor.decode(ids) != text:
            raise ValueError(f"forced response {text[:80]!r} does not round-trip the tokenizer")
        return (*ids, self.processor.eos_id)

    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        encoded = [r.encoded for r in requests if r.encoded is not None]
        if len(encoded) != len(requests):
            raise ValueError("HFEngine.generate needs requests prepared by HFEngine.prepare")
        params = [r.sampling for r in requests]
        forced = [r.forced_ids for r in requests]
        async with self.gate.generating() as lease:
            loop = asyncio.get_running_loop()

            def boundary(next_token: int) -> None:  # in generate's thread
                if self.gate.update_waiting:
                    asyncio.run_coroutine_threadsafe(lease.boundary(next_token), loop).result()

            return await asyncio.to_thread(
                self.generate_sync, encoded, params, lease, boundary, forced
            )

    async def _load(self, weights: PackedWeights) -> None:
        if weights.adapter is not None:  # LoRA: the base stays, the adapters are copied in
            await asyncio.to_thread(load_packed_adapter, self.model, weights)
        elif self.weights_load == "share" and self.device == "cpu":
            await asyncio.to_thread(share_into, self.model, weights)
            self._shared = weights  # the previous version's mapping is released here
        else:
            await asyncio.to_thread(load_into, self.model, weights)
            self._shared = None

    # ------------------------------------------------------------------ synchronous core

    def generate_sync(
        self,
        encoded: Sequence[EncodedPrompt],
        params: Sequence[SamplingParams],
        version: int | Lease,
        boundary: Callable[[int], None] | None = None,
        forced: Sequence[tuple[int, ...]] = (),
    ) -> list[Generation]:
        """Generate on this thread, on `version` (an int outside the server: no update lands)
        or on a lease of the gate, whose `boundary` lets updates land between tokens.
        `forced[i]`, where not empty, is scored for prompt i instead (`_force`)."""
        lease = version if isinstance(version, Lease) else Lease(self.gate, version, version)
        out: list[Generation | None] = [None] * len(encoded)
        for i, ids in enumerate(forced):
            if ids:
                out[i] = self._force(encoded[i], ids, params[i], lease.version)
        sampled = [i for i in range(len(encoded)) if out[i] is None]
        order = sorted(sampled, key=lambda i: hash(params[i]))
        for _, group in itertools.groupby(order, key=lambda i: params[i]):
            idx = list(group)
            gens = self._batch([encoded[i] for i in idx], params[idx[0]], lease, boundary)
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        return [g for g in out if g is not None]

    @torch.no_grad()
    def _force(
        self, e: EncodedPrompt, response: Sequence[int], sp: SamplingParams, version: int
    ) -> Generation:
        """Teacher forcing: `response`'s log-probs and entropies under the current weights,
        from one forward over prompt + response, with the distribution the sampler draws
        from (`process_logits`: temperature, top-k/p, suppressed ids), as the trainer scores
        it. The logit at position p predicts token p + 1."""
        t0 = time.perf_counter()
        whole = EncodedPrompt(
            [*e.input_ids, *response], e.pixel_values, e.image_grid_thw, e.model_sizes
        )
        self.model.model.rope_deltas = None  # positions from this forward's own images
        logits = self.model(**self._inputs([whole]), use_cache=False).logits[0]
        n = len(e.input_ids)
        suppressed = torch.tensor(list(self.suppressed), dtype=torch.long)
        z = process_logits(logits[n - 1 : n - 1 + len(response)].float(), sp.spec, suppressed)
        logp_all = torch.log_softmax(z, -1)
        ids = torch.tensor(response, device=logp_all.device)
        logp = logp_all.gather(-1, ids[:, None]).squeeze(-1).clamp(min=LOGP_FLOOR)
        return Generation(
            text=self.processor.decode(list(response)),
            response_ids=tuple(response),
            prompt_ids=tuple(e.input_ids),
            logprobs=tuple(logp.tolist()),
            entropy=tuple(entropy_of(logp_all).tolist()),
            weight_version=version,
            finish_reason="stop",
            model_sizes=e.model_sizes,
            latency_s=time.perf_counter() - t0,
        )

    def _inputs(self, batch: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in batch)
        pad = self.processor.pad_id
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, e in enumerate(batch):  # left padding: the last position is the next token's
            ids[b, width - len(e.input_ids) :] = torch.tensor(e.input_ids)
            mask[b, width - len(e.input_ids) :] = 1
        pixels = grid = None
        with_images = [e for e in batch if e.pixel_values is not None]
        if with_images:
            pixels = torch.cat([e.pixel_values for e in with_images]).to(self.model.dtype)  # type: ignore[misc]
            grid = torch.cat([e.image_grid_thw for e in with_images])  # type: ignore[misc]
        images = image_inputs(ids, pixels, grid, self.processor.image_pad_id)
        if images:  # left padding: pad ids are never image tokens
            images["mm_token_type_ids"] = images["mm_token_type_ids"] * mask.int()
        inputs = {"input_ids": ids, "attention_mask": mask, **images}
        return {k: v.to(self.device) for k, v in inputs.items()}

    @torch.no_grad()
    def _batch(
        self,
        batch: Sequence[EncodedPrompt],
        sp: SamplingParams,
        lease: Lease,
        boundary: Callable[[int], None] | None = None,
    ) -> list[Generation]:
        t0 = time.perf_counter()
        version, seen = lease.version, len(lease.switches)  # this sub-batch's own switches
        sampler = _Sampler(sp.spec, self.suppressed, boundary, sp.top_logprobs)
        config = neutral_generation_config(self.processor.eos_id, self.processor.pad_id)
        config.max_new_tokens = sp.max_new_tokens
        config.stop_strings = list(sp.stop) or None
        inputs = self._inputs(batch)
        width = inputs["input_ids"].shape[1]
        if self.decode == "lean":
            seqs = self._decode(inputs, sampler, sp)
        else:
            seqs = self.model.generate(
                **inputs,
                generation_config=config,
                logits_processor=LogitsProcessorList([sampler]),
                tokenizer=self.processor.tokenizer if sp.stop else None,
            )
        logprobs, entropy = sampler.finish()  # (B, T) each
        latency = time.perf_counter() - t0
        switches = lease.switches[seen:]
        return [
            self._one(
                e,
                seqs[b, width:].tolist(),
                logprobs[b],
                entropy[b],
                sp,
                (version, switches),
                latency,
                len(batch),
                partial(sampler.top_of, b),
            )
            for b, e in enumerate(batch)
        ]

    def _decode(
        self, inputs: dict[str, torch.Tensor], sampler: _Sampler, sp: SamplingParams
    ) -> torch.Tensor:
        """`generate`'s greedy loop over our sampler, without its machinery: one prefill
        (which computes the batch's 3D positions and `rope_deltas`), then one forward per
        token on the KV cache, the new token's position being its row's count of real tokens
        so far shifted by the row's `rope_deltas`, as transformers computes it. The same
        draws in the same order as `generate` with `_Sampler` (rows that finished keep
        drawing, as there, and get the pad token), so with the same seed the same tokens and
        log-probs; a test holds the two to that. Returns (B, prompt + new) ids like
        `generate`."""
        model, eos, pad = self.model, self.processor.eos_id, self.processor.pad_id
        model.model.rope_deltas = None  # computed afresh by this batch's prefill
        extra = {}
        if "pixel_values" not in inputs:  # text only: positions count the real tokens
            mask = inputs["attention_mask"]
            first = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
            extra["position_ids"] = first[None].expand(3, *mask.shape)
        out = model(**inputs, **extra, use_cache=True, logits_to_keep=1)
        cache, deltas = getattr(out, self._cache_arg), model.model.rope_deltas  # (B, 1)
        mask = inputs["attention_mask"]
        ids = inputs["input_ids"]
        b = ids.shape[0]
        if deltas is None:  # no image in the batch: 1D positions
            deltas = torch.zeros((b, 1), dtype=torch.long, device=ids.device)
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        drawn: list[torch.Tensor] = []
        for t in range(sp.max_new_tokens):
            nxt = sampler(ids, out.logits[:, -1]).argmax(-1)  # type: ignore[arg-type]
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            drawn.append(nxt)
            done |= nxt == eos
            if sp.stop:
                for r in range(b):
                    if not done[r]:
                        tail = self.processor.decode([int(x[r]) for x in drawn])
                        done[r] = any(s in tail for s in sp.stop)
            if bool(done.all()) or t == sp.max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=mask.device)], 1)
            position = (mask.sum(-1, keepdim=True) - 1 + deltas).expand(3, b, 1)
            out = model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=position,
                use_cache=True,
                **{self._cache_arg: cache},
            )
        return torch.cat([ids, torch.stack(drawn, 1)], 1)

    def _one(
        self,
        e: EncodedPrompt,
        tokens: list[int],
        logprobs: torch.Tensor,
        entropy: torch.Tensor,
        sp: SamplingParams,
        versions: tuple[int, Sequence[tuple[int, int]]],
        latency: float,
        batch_size: int,
        top_of: Callable[[int], tuple[tuple[tuple[int, float], ...], ...]],
    ) -> Generation:
        eos = self.processor.eos_id
        n, finish = len(tokens), "length"
        if eos in tokens:
            n, finish = tokens.index(eos) + 1, "stop"
        text = self.processor.decode(tokens[:n])
        for s in sp.stop:
            cut = text.find(s)
            if cut >= 0:  # keep tokens up to the one that completed the stop string
                k = next(j for j in range(1, n + 1) if s in self.processor.decode(tokens[:j]))
                n, finish, text = k, "stop", self.processor.decode(tokens[:k])
                text = text[: text.find(s)]
        oldest, token_versions = versions_per_token(n, *versions)
        return Generation(
            text=text,
            response_ids=tuple(tokens[:n]),
            prompt_ids=tuple(e.input_ids),
            logprobs=tuple(logprobs[:n].tolist()),
            entropy=tuple(entropy[:n].tolist()),
            weight_version=oldest,
            finish_reason=finish,  # type: ignore[arg-type]
            model_sizes=e.model_sizes,
            latency_s=latency,
            batch_size=batch_size,
            token_versions=token_versions,
            top_logprobs=top_of(n),
        )

"""The transformers engine: batched generation with exact log-probs and entropy.

Why our own logits processors instead of `generate(temperature=..., top_p=...)`: transformers
applies user processors *before* its temperature and top-p warpers, and `output_scores` keeps a
(batch, vocab) tensor per step (gigabytes at UI-TARS's 152k vocabulary and 500 tokens). So we
pass temperature 1 and top-p 1 to `generate` (it then adds no warpers, and top-k is disabled)
and run our own chain, whose output *is* the distribution `generate` samples from:

    suppress special tokens -> divide by temperature -> nucleus (top_p) -> record

The recorder keeps only the current step's log-softmax: at the next step it reads the token
that was sampled from it (the last input id) and keeps that token's log-prob and the step's
entropy, so memory stays O(batch x vocab). Greedy decoding records the model's distribution
at temperature 1 (with suppressed tokens removed).

Requests of one batch may differ in length and in number of images: prompts are left-padded
and the images of all requests are concatenated in order, which is how Qwen2.5-VL's forward
expects them. Requests with different sampling parameters run as separate sub-batches.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    PreparedRequest,
    SamplingParams,
)
from dart_ray.models.loading import EncodedPrompt, PolicyProcessor, load_model
from dart_ray.weights import PackedWeights, load_into, share_into


class _Suppress(LogitsProcessor):
    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = torch.tensor(list(ids), dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.ids):
            scores = scores.clone()
            scores[:, self.ids] = -float("inf")
        return scores


class _Temperature(LogitsProcessor):
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores / self.t


class _TopP(LogitsProcessor):
    """Keep the smallest set of tokens whose probability reaches p (the top token always)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches p
        drop_sorted = (cum - sorted_scores.softmax(-1)) >= self.p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        return scores.masked_fill(drop, -float("inf"))


class _Recorder(LogitsProcessor):
    """Log-prob of each sampled token and entropy of each step's final distribution."""

    def __init__(self) -> None:
        self.logprobs: list[torch.Tensor] = []  # each (B,)
        self.entropy: list[torch.Tensor] = []  # each (B,)
        self._prev: torch.Tensor | None = None  # (B, V) log-softmax of the previous step

    def _take(self, chosen: torch.Tensor) -> None:
        assert self._prev is not None
        self.logprobs.append(self._prev.gather(-1, chosen[:, None])[:, 0])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self._take(input_ids[:, -1])
        logp = torch.log_softmax(scores.float(), dim=-1)
        p = logp.exp()
        self.entropy.append(-torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1))
        self._prev = logp
        return scores

    def finish(self, last_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) log-probs and entropies once `generate` returned its last tokens."""
        if self._prev is not None:
            self._take(last_tokens)
            self._prev = None
        return torch.stack(self.logprobs, 1), torch.stack(self.entropy, 1)


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
    ) -> None:
        super().__init__()
        self.weights_load = weights_load
        self._shared: PackedWeights | None = None  # keeps shared weights mapped
        self.processor = PolicyProcessor.from_dir(model_path)
        self.model = load_model(model_path, dtype=dtype, device=device)
        self.device = device
        self.suppressed = self.processor.suppressed_ids(allow_special_tokens)

    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        return PreparedRequest(
            sampling=request.sampling or defaults, encoded=self.processor.encode(request.messages)
        )

    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        encoded = [r.encoded for r in requests if r.encoded is not None]
        if len(encoded) != len(requests):
            raise ValueError("HFEngine.generate needs requests prepared by HFEngine.prepare")
        params = [r.sampling for r in requests]
        async with self.gate.generating() as version:
            return await asyncio.to_thread(self.generate_sync, encoded, params, version)

    async def _load(self, weights: PackedWeights) -> None:
        if self.weights_load == "share" and self.device == "cpu":
            await asyncio.to_thread(share_into, self.model, weights)
            self._shared = weights  # the previous version's mapping is released here
        else:
            await asyncio.to_thread(load_into, self.model, weights)
            self._shared = None

    # ------------------------------------------------------------------ synchronous core

    def generate_sync(
        self, encoded: Sequence[EncodedPrompt], params: Sequence[SamplingParams], version: int
    ) -> list[Generation]:
        out: list[Generation | None] = [None] * len(encoded)
        order = sorted(range(len(encoded)), key=lambda i: hash(params[i]))
        for _, group in itertools.groupby(order, key=lambda i: params[i]):
            idx = list(group)
            gens = self._batch([encoded[i] for i in idx], params[idx[0]], version)
            for i, g in zip(idx, gens, strict=True):
                out[i] = g
        return [g for g in out if g is not None]

    def _inputs(self, batch: Sequence[EncodedPrompt]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in batch)
        pad = self.processor.pad_id
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for b, e in enumerate(batch):  # left padding: the last position is the next token's
            ids[b, width - len(e.input_ids) :] = torch.tensor(e.input_ids)
            mask[b, width - len(e.input_ids) :] = 1
        inputs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
        with_images = [e for e in batch if e.pixel_values is not None]
        if with_images:
            pixels = torch.cat([e.pixel_values for e in with_images])  # type: ignore[misc]
            grid = torch.cat([e.image_grid_thw for e in with_images])  # type: ignore[misc]
            inputs["pixel_values"] = pixels.to(self.device, self.model.dtype)
            inputs["image_grid_thw"] = grid.to(self.device)
        return inputs

    @torch.no_grad()
    def _batch(
        self, batch: Sequence[EncodedPrompt], sp: SamplingParams, version: int
    ) -> list[Generation]:
        t0 = time.perf_counter()
        recorder = _Recorder()
        chain: list[LogitsProcessor] = [_Suppress(self.suppressed)]
        if not sp.greedy:
            chain += [_Temperature(sp.temperature)] if sp.temperature != 1 else []
            chain += [_TopP(sp.top_p)] if sp.top_p < 1 else []
        chain.append(recorder)
        config = GenerationConfig(
            do_sample=not sp.greedy,
            max_new_tokens=sp.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            eos_token_id=self.processor.eos_id,
            pad_token_id=self.processor.pad_id,
            stop_strings=list(sp.stop) or None,
        )
        inputs = self._inputs(batch)
        width = inputs["input_ids"].shape[1]
        seqs = self.model.generate(
            **inputs,
            generation_config=config,
            logits_processor=LogitsProcessorList(chain),
            tokenizer=self.processor.tokenizer if sp.stop else None,
        )
        logprobs, entropy = recorder.finish(seqs[:, -1])  # (B, T) each
        latency = time.perf_counter() - t0
        return [
            self._one(
                e,
                seqs[b, width:].tolist(),
                logprobs[b],
                entropy[b],
                sp,
                version,
                latency,
                len(batch),
            )
            for b, e in enumerate(batch)
        ]

    def _one(
        self,
        e: EncodedPrompt,
        tokens: list[int],
        logprobs: torch.Tensor,
        entropy: torch.Tensor,
        sp: SamplingParams,
        version: int,
        latency: float,
        batch_size: int,
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
        return Generation(
            text=text,
            response_ids=tuple(tokens[:n]),
            prompt_ids=tuple(e.input_ids),
            logprobs=tuple(logprobs[:n].tolist()),
            entropy=tuple(entropy[:n].tolist()),
            weight_version=version,
            finish_reason=finish,  # type: ignore[arg-type]
            model_sizes=e.model_sizes,
            latency_s=latency,
            batch_size=batch_size,
        )

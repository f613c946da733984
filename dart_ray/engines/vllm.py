"""The vLLM engine: the same interface on vLLM's AsyncLLM, with in-place weight loading.

Generation: the prompt goes to vLLM as chat-template text with one `<|image_pad|>` per image
plus the images, and vLLM's own Qwen2.5-VL processor expands the pads; the prompt ids it
returns are what the trainer gets. Log-probs come from the engine in `processed_logprobs`
mode, i.e. from the distribution actually sampled from (after temperature and top-p; the
temperature-1 distribution for greedy), like the transformers engine. Entropy is exact when
`policy.vllm_logprobs_topk` is -1 (the whole vocabulary comes back: fine for the tiny model)
and otherwise a lower bound from the top-k log-probs (`entropy_exact=False`). Special tokens
other than the end token get a logit bias of -100 (vLLM's floor): e^-100 is zero in practice.

Weights: vLLM's workers live in another process, so a weight update writes the packed bytes
once into a shared-memory file (/dev/shm), and a worker extension (`vllm_worker.py`) maps it
and hands the tensors to the model's own `load_weights` (which knows vLLM's fused layouts,
e.g. q/k/v into one qkv projection). No restart; then the prefix cache and the multimodal
encoder cache are cleared, since both hold results computed with the old weights.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dart_ray.config import PolicyConfig
from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    PreparedRequest,
    SamplingParams,
    refuse_forced,
)
from dart_ray.models import lora
from dart_ray.models.loading import PolicyProcessor, check_model_dir
from dart_ray.models.weights import PackedWeights, unpack

WORKER_EXTENSION = "dart_ray.engines.vllm_worker.WeightLoaderExtension"
SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        allow_special_tokens: Sequence[str] = (),
        dtype: str = "float32",
        max_model_len: int = 8192,
        kv_cache_mb: int = 512,
        logprobs_topk: int = 20,
        max_num_seqs: int = 32,
        seed: int = 0,
        max_lora_rank: int = 0,
    ) -> None:
        super().__init__()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        path = check_model_dir(model_path)
        adapter = None
        if lora.is_adapter_checkpoint(path):  # a LoRA run's checkpoint: its base + adapters
            base, spec, state = lora.read_adapter_checkpoint(path)
            adapter, path = (spec, state), check_model_dir(base)
        self.processor = PolicyProcessor.from_dir(path)
        self.max_lora_rank = max_lora_rank
        self._lora: Any = None  # the LoRARequest of the version served, when adapters are
        self.bias = {i: -100.0 for i in self.processor.suppressed_ids(allow_special_tokens)}
        self.logprobs_topk = logprobs_topk
        args = AsyncEngineArgs(
            model=str(path),
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=kv_cache_mb << 20,
            enforce_eager=True,
            seed=seed,
            limit_mm_per_prompt={"image": 16, "video": 0},
            logprobs_mode="processed_logprobs",
            max_logprobs=logprobs_topk,
            worker_extension_cls=WORKER_EXTENSION,
            enable_lora=max_lora_rank > 0,
            max_lora_rank=max_lora_rank or None,
            max_loras=1,
        )
        self.llm: Any = AsyncLLM.from_engine_args(args)
        self._initial_adapter = adapter
        self._adapter_lock = asyncio.Lock()
        self._base_dir = path

    @classmethod
    def from_config(cls, cfg: PolicyConfig, model_path: str | Path) -> VLLMEngine:
        return cls(
            model_path,
            cfg.allow_special_tokens,
            cfg.dtype,
            cfg.vllm_max_model_len,
            cfg.vllm_kv_cache_mb,
            cfg.vllm_logprobs_topk,
            cfg.max_batch_size,
            max_lora_rank=cfg.vllm_max_lora_rank,
        )

    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        refuse_forced(request, "vllm")
        text, image_bytes = self.processor.render(request.messages)
        images = tuple(self.processor.load_images(image_bytes))
        return PreparedRequest(request.sampling or defaults, prompt_text=text, images=images)

    def _params(self, sp: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else -1,
            max_tokens=sp.max_new_tokens,
            stop=list(sp.stop) or None,
            logprobs=self.logprobs_topk,
            logit_bias=self.bias or None,
            skip_special_tokens=True,
        )

    async def _one(self, r: PreparedRequest, version: int) -> Generation:
        t0 = time.perf_counter()
        prompt: dict[str, Any] = {"prompt": r.prompt_text}
        if r.images:
            prompt["multi_modal_data"] = {"image": list(r.images)}
        final = None
        if self._initial_adapter is not None:  # started from a LoRA checkpoint
            async with self._adapter_lock:
                if self._initial_adapter is not None:
                    await self._add_adapter(*self._initial_adapter)
                    self._initial_adapter = None
        stream = self.llm.generate(
            prompt, self._params(r.sampling), uuid.uuid4().hex, lora_request=self._lora
        )
        async for out in stream:
            final = out
        assert final is not None and final.outputs
        o = final.outputs[0]
        ids = list(o.token_ids)
        logprobs, entropy = [], []
        for tok, dist in zip(ids, o.logprobs or [], strict=True):
            logprobs.append(float(dist[tok].logprob))
            ps = [math.exp(lp.logprob) for lp in dist.values() if lp.logprob > -math.inf]
            entropy.append(-sum(p * math.log(p) for p in ps if p > 0))
        grid = [(im.width, im.height) for im in r.images]
        return Generation(
            text=o.text,
            response_ids=tuple(ids),
            prompt_ids=tuple(final.prompt_token_ids or ()),
            logprobs=tuple(logprobs),
            entropy=tuple(entropy),
            weight_version=version,
            finish_reason="stop" if o.finish_reason == "stop" else "length",
            model_sizes=tuple(self._model_size(w, h) for w, h in grid),
            entropy_exact=self.logprobs_topk == -1,
            latency_s=time.perf_counter() - t0,
        )

    def _model_size(self, width: int, height: int) -> tuple[int, int]:
        from dart_ray.uitars.actions import smart_resize

        p = self.processor
        h, w = smart_resize(height, width, 28, p.min_pixels, p.max_pixels)
        return w, h

    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        async with self.gate.generating() as lease:  # drained: one version per response
            return list(await asyncio.gather(*(self._one(r, lease.version) for r in requests)))

    async def _load(self, weights: PackedWeights) -> None:
        if weights.adapter is not None:
            await self._add_adapter(weights.adapter, dict(unpack(weights)))
            return
        if self._lora is not None:
            raise ValueError("full weights for an engine serving LoRA adapters: publish adapters")
        path = SHM_DIR / f"dart-ray-weights-{uuid.uuid4().hex}.bin"
        try:
            offsets = await asyncio.to_thread(_write_flat, path, weights)
            metas = [
                (checkpoint_name(m.name), m.dtype, list(m.shape), off)
                for m, off in zip(weights.metas, offsets, strict=True)
            ]
            await self.llm.collective_rpc("dart_ray_load_weights", args=(str(path), metas))
        finally:
            path.unlink(missing_ok=True)
        # Cached prefixes and image embeddings were computed with the old weights. The worker
        # dropped its encoder outputs; the scheduler must forget them too, or it would
        # schedule an image as cached and the worker would miss it.
        await self.llm.reset_encoder_cache()
        await self.llm.reset_prefix_cache()
        await self.llm.reset_mm_cache()

    async def _add_adapter(self, spec: lora.AdapterSpec, state: dict[str, torch.Tensor]) -> None:
        """Serve these adapters from now on: written as peft's folder to shared memory, added
        to vLLM under a new id (vLLM keys its caches by adapter), the previous one removed."""
        from vllm.lora.request import LoRARequest

        if spec.rank > self.max_lora_rank:
            raise ValueError(
                f"a LoRA adapter of rank {spec.rank} for a vLLM engine started with "
                f"policy.vllm_max_lora_rank = {self.max_lora_rank}"
            )
        prev = self._lora
        n = 1 if prev is None else prev.lora_int_id + 1
        path = SHM_DIR / f"dart-ray-lora-{uuid.uuid4().hex}"
        path.mkdir()
        base = str(self._base_dir)
        await asyncio.to_thread(lora.write_adapter, path, spec, state, base)
        req = LoRARequest(f"dart-ray-{n}", n, str(path))
        await self.llm.add_lora(req)
        self._lora = req
        if prev is not None:
            await self.llm.remove_lora(prev.lora_int_id)
            shutil.rmtree(prev.lora_path, ignore_errors=True)

    async def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:  # shut down now, not from __del__ at interpreter exit
            llm.shutdown()


def checkpoint_name(name: str) -> str:
    """A transformers-5 state-dict name -> the checkpoint name vLLM's loader maps.

    transformers 5 nests Qwen2.5-VL as `model.language_model.*` and `model.visual.*` in
    memory but saves the original layout (`model.*`, `visual.*`), which is what vLLM reads;
    a name it does not know is skipped without a word, so the rename is not optional.
    """
    if name.startswith("model.language_model."):
        return "model." + name.removeprefix("model.language_model.")
    if name.startswith("model.visual."):
        return name.removeprefix("model.")
    return name


def _write_flat(path: Path, weights: PackedWeights) -> list[int]:
    """Write the arrays back to back (64-byte aligned) into one file; their offsets."""
    offsets: list[int] = []
    pos = 0
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        for arr in weights.arrays:
            pad = (-pos) % 64
            f.write(b"\0" * pad)
            pos += pad
            offsets.append(pos)
            f.write(memoryview(arr))
            pos += arr.nbytes
    return offsets

"""Optimizer steps of the policy on this rank's shard of a curated batch.

The learner is algorithm-blind beyond the loss switch: advantages and behaviour log-probs come
with the samples. Each batch goes through `ppo_epochs` passes of `minibatches` optimizer
steps. Before the first step it computes the *proximal* log-probs (the weights before this
batch's first update; no gradient), and every step scores the *current* policy against them
(decoupled PPO, `dart_ray.algo.losses`): the off-policy weight corrects behaviour ->
proximal, the PPO / GSPO clip bounds current / proximal, an optional KL term pulls toward a
frozen reference. With a single optimizer step per batch the proximal log-probs are the
current ones at the only gradient evaluation, so they come from the same forward pass (the
ratio is exactly 1 there, and a separate pass would compute the same numbers).

Log-probs are of the distribution the engine sampled from: the trainer applies the same
processing (suppressed tokens, temperature, top-k, top-p; `dart_ray.algo.sampling`).

Under FSDP every rank must run the same number of forward/backward passes, or the per-block
all-gathers deadlock. Ranks agree on the micro-batch count of every minibatch (all-reduce
MAX) and a rank with fewer pads with zero-weight dummy passes. Losses are normalised by the
*global* number of tokens (or sequences) of the minibatch, so the gradient is the same
however samples fall across ranks and micro-batches.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from PIL import Image

from dart_ray.algo.losses import (
    LossAgg,
    OffPolicy,
    aggregate,
    gspo_loss,
    kl_k3,
    masked_mean,
    mismatch_metrics,
    nll_loss,
    off_policy_weights,
    ppo_clip_loss,
)
from dart_ray.algo.sampling import SamplingSpec
from dart_ray.config import Config
from dart_ray.models import lora
from dart_ray.records import SAMPLE_SCHEMA
from dart_ray.train.forward import MicroBatch, collate, response_logprobs, score_responses
from dart_ray.train.fsdp import comm_device


@dataclass(frozen=True)
class LossSettings:
    loss: Literal["ppo", "gspo", "nll"] = "ppo"
    """`nll`: rejection-sampling fine-tuning (`algo.objective = "rft"`)."""
    eps_low: float = 0.1
    eps_high: float = 0.28
    dual_clip: float | None = 10.0
    off_policy: OffPolicy = "token_tis"
    is_cap: float = 1.0
    mask_low: float = 0.5
    mask_high: float = 2.0
    kl_beta: float = 0.0
    loss_agg: LossAgg = "token_mean"
    norm_tokens: int | None = None
    """L of `seq_mean_token_sum_norm` (required by it: a micro-batch's own padded length
    would weigh tokens by how samples fall into micro-batches)."""
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    """The distribution the rollouts were sampled from (greedy: temperature 1)."""
    ppo_epochs: int = 1
    minibatches: int = 1


def loss_settings(c: Config) -> LossSettings:
    """The loss as the run's config describes it (the rollouts' sampling included)."""
    a, p = c.algo, c.policy
    return LossSettings(
        loss="nll" if a.objective == "rft" else a.loss,
        eps_low=a.eps_low,
        eps_high=a.eps_high,
        dual_clip=a.dual_clip,
        off_policy=a.off_policy,
        is_cap=a.is_cap,
        mask_low=a.mask_low,
        mask_high=a.mask_high,
        kl_beta=a.kl_beta,
        loss_agg=a.loss_agg,
        norm_tokens=a.loss_norm_tokens or p.max_new_tokens,
        sampling=SamplingSpec(p.temperature, p.top_k, p.top_p),
        ppo_epochs=c.train.ppo_epochs,
        minibatches=c.train.minibatches,
    )


def split_micro(batch: pa.RecordBatch, max_tokens: int) -> list[pa.RecordBatch]:
    """Consecutive slices of at most `max_tokens` tokens (a longer sample goes alone)."""
    lens = (
        pc.list_value_length(batch.column("prompt_ids")).to_numpy(zero_copy_only=False)
        + pc.list_value_length(batch.column("response_ids")).to_numpy(zero_copy_only=False)
    ).tolist()
    out, start, used = [], 0, 0
    for i, n in enumerate(lens):
        if i > start and used + n > max_tokens:
            out.append(batch.slice(start, i - start))
            start, used = i, 0
        used += n
    if start < len(lens):
        out.append(batch.slice(start, len(lens) - start))
    return out


def split_rows(batch: pa.RecordBatch, parts: int) -> list[pa.RecordBatch]:
    """`parts` consecutive slices of near-equal row counts (some empty when rows < parts)."""
    n = batch.num_rows
    bounds = [n * k // parts for k in range(parts + 1)]
    return [batch.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def _all_reduce(xs: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    if not dist.is_initialized():
        return xs
    t = torch.tensor(xs, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


@dataclass
class _Part:
    """One minibatch on this rank: its micro-batches, the agreed pass count, global sizes."""

    micro: list[MicroBatch]
    passes: int
    scale_tok: float
    scale_seq: float
    prox: list[torch.Tensor | None]
    tokens: float = 0.0
    """Response tokens of the minibatch on all ranks."""
    """Proximal log-probs per micro-batch (None: take them from the step's own forward)."""


class Learner:
    def __init__(
        self,
        model: torch.nn.Module,
        image_processor: object,
        *,
        image_pad_id: int,
        pad_id: int,
        settings: LossSettings,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        tokens_per_micro: int = 8192,
        warmup_steps: int = 0,
        ref_model: torch.nn.Module | None = None,
        ref_adapters_off: bool = False,
        suppressed_ids: list[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if settings.loss_agg == "seq_mean_token_sum_norm" and settings.norm_tokens is None:
            raise ValueError("loss_agg 'seq_mean_token_sum_norm' needs norm_tokens (its L)")
        self.model = model
        self.device = torch.device(device)
        self.ref_model = ref_model
        self.ref_adapters_off = ref_adapters_off
        """LoRA: the KL reference is the policy itself with its adapters disabled (its frozen
        base), not a second copy of the model."""
        self.image_processor = image_processor
        self.image_pad_id = image_pad_id
        self.pad_id = pad_id
        self.s = settings
        self.grad_clip = grad_clip
        self.tokens_per_micro = tokens_per_micro
        trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda k: min(1.0, (k + 1) / (warmup_steps + 1))
        )
        self._dummy: MicroBatch | None = None
        self.suppressed = torch.tensor(suppressed_ids or [], dtype=torch.long)

    # ------------------------------------------------------------------ micro-batches

    def _dummy_batch(self) -> MicroBatch:
        """A one-token sample with one blank image and a zero mask: it moves no weight."""
        if self._dummy is None:
            buf = io.BytesIO()
            Image.new("RGB", (28, 28)).save(buf, format="PNG")
            grid = self.image_processor(  # type: ignore[operator]
                images=[Image.open(io.BytesIO(buf.getvalue())).convert("RGB")], return_tensors="pt"
            )["image_grid_thw"]
            merge = int(getattr(self.image_processor, "merge_size", 2))
            n = int(grid.prod()) // merge**2
            row = {
                "trajectory_id": ["<dummy>"],
                "task_id": ["<dummy>"],
                "step_idx": [0],
                "weight_version": [0],
                "prompt_ids": [[self.image_pad_id] * n],
                "response_ids": [[self.pad_id]],
                "behaviour_logprobs": [[0.0]],
                "loss_mask": [[0]],
                "advantage": [0.0],
                "images": [[buf.getvalue()]],
                "token_versions": [[]],
            }
            rb = pa.RecordBatch.from_pydict(row, schema=SAMPLE_SCHEMA)
            self._dummy = self._collate(rb)
        return self._dummy

    def _collate(self, rb: pa.RecordBatch) -> MicroBatch:
        return collate(
            rb, self.image_processor, image_pad_id=self.image_pad_id, pad_id=self.pad_id
        ).to(self.device)

    def _logprobs(
        self, model: torch.nn.Module, mb: MicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logprobs(model, mb, self.s.sampling, self.suppressed)

    def _parts(self, shard: pa.RecordBatch) -> list[_Part]:
        """Split the shard into minibatches and agree with the other ranks on their sizes."""
        k = self.s.minibatches
        micro = [
            [self._collate(b) for b in split_micro(rows, self.tokens_per_micro)]
            if rows.num_rows
            else []
            for rows in split_rows(shard, k)
        ]
        world = dist.get_world_size() if dist.is_initialized() else 1
        passes = _all_reduce([float(len(m)) for m in micro], dist.ReduceOp.MAX)
        tok = _all_reduce(
            [sum(float(b.response_mask.sum()) for b in m) for m in micro], dist.ReduceOp.SUM
        )
        seq = _all_reduce(
            [sum(float((b.response_mask.sum(1) > 0).sum()) for b in m) for m in micro],
            dist.ReduceOp.SUM,
        )
        # FSDP averages gradients over ranks: multiply back by the world size, and divide by
        # the global count so the result is the global mean of the token (sequence) losses.
        return [
            _Part(m, int(n), world / max(t, 1.0), world / max(q, 1.0), [None] * len(m), t)
            for m, n, t, q in zip(micro, passes, tok, seq, strict=True)
        ]

    @torch.no_grad()
    def _proximal(self, parts: list[_Part]) -> None:
        """Log-probs of every sample under the weights before the first update."""
        for part in parts:
            for i in range(part.passes):
                if i < len(part.micro):
                    part.prox[i] = self._logprobs(self.model, part.micro[i])[0]
                else:
                    self._logprobs(self.model, self._dummy_batch())

    # ------------------------------------------------------------------ the loss

    def _loss(
        self,
        mb: MicroBatch,
        logp_old: torch.Tensor | None,
        scale_tok: float,
        scale_seq: float,
        version: int | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        s = self.s
        mask = mb.response_mask
        kl = (self.ref_model is not None or self.ref_adapters_off) and s.kl_beta > 0
        scores = score_responses(self.model, mb, s.sampling, self.suppressed, full=kl)
        logp, entropy = scores.logp, scores.entropy
        prox = logp.detach() if logp_old is None else logp_old
        w, m_is = off_policy_weights(
            prox,
            mb.behaviour_logprobs,
            mask,
            mode=s.off_policy,
            cap=s.is_cap,
            low=s.mask_low,
            high=s.mask_high,
        )
        n_tok = float(mask.sum())
        n_seq = float((mask.sum(1) > 0).sum())
        if s.loss == "nll":
            loss, m = nll_loss(logp, mb.advantages, mask, agg=s.loss_agg, norm_tokens=s.norm_tokens)
            denom = n_tok if s.loss_agg == "token_mean" else n_seq
            scale = scale_tok if s.loss_agg == "token_mean" else scale_seq
        elif s.loss == "ppo":
            loss, m = ppo_clip_loss(
                logp,
                prox,
                mb.advantages,
                mask,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                dual_clip=s.dual_clip,
                is_weight=w,
                agg=s.loss_agg,
                norm_tokens=s.norm_tokens,
            )
            denom = n_tok if s.loss_agg == "token_mean" else n_seq
            scale = scale_tok if s.loss_agg == "token_mean" else scale_seq
        else:
            loss, m = gspo_loss(
                logp,
                prox,
                mb.advantages,
                mask,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                is_weight=w,
            )
            denom, scale = n_seq, scale_seq
        if kl and scores.logp_full is not None:
            # both sides untruncated: the KL is between the models, not their nuclei
            full = SamplingSpec(temperature=s.sampling.temperature)
            with torch.no_grad(), self._reference() as ref:
                ref_logp, _ = response_logprobs(ref, mb, full, self.suppressed)
            kl_ref = aggregate(kl_k3(scores.logp_full, ref_logp), mask, s.loss_agg, s.norm_tokens)
            loss = loss + s.kl_beta * kl_ref
            m["kl_ref"] = float(kl_ref)
        m.update(m_is)
        m.update(mismatch_metrics(prox, mb.behaviour_logprobs, mask))
        if version is not None:  # tokens sampled by the weights the trainer holds: the gap
            same = mask * (mb.weight_versions == version).unsqueeze(-1)  # is engine vs trainer
            if same.sum() > 0:
                m["onpolicy_logp_diff_abs"] = float(
                    masked_mean((prox - mb.behaviour_logprobs).abs(), same)
                )
        m["entropy"] = float(masked_mean(entropy, mask)) if n_tok else 0.0
        m["is_weight"] = float(masked_mean(w, mask)) if n_tok else 0.0
        m["tokens"] = n_tok
        return loss * denom * scale, m

    @contextlib.contextmanager
    def _reference(self) -> Iterator[torch.nn.Module]:
        """The KL's reference model: the separate one, or (LoRA) the policy with its
        adapters disabled for the duration."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with lora.adapters_off(self.model) as base:
            yield base

    # ------------------------------------------------------------------ the step

    def _update(self, part: _Part, version: int | None) -> tuple[dict[str, float], int]:
        """One optimizer step over one minibatch; (summed metrics, real micro-batches)."""
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for i in range(part.passes):
            if i < len(part.micro):
                mb, prox = part.micro[i], part.prox[i]
            else:
                mb, prox = self._dummy_batch(), None
            loss, m = self._loss(mb, prox, part.scale_tok, part.scale_seq, version)
            loss.backward()
            if i < len(part.micro):
                m["loss"] = float(loss.detach())
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        sums["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        counts["grad_norm"] = 1
        return sums, counts  # type: ignore[return-value]

    def step(self, shard: pa.RecordBatch, version: int | None = None) -> dict[str, float]:
        """`ppo_epochs` x `minibatches` optimizer steps on the shard; the metrics, averaged
        over its micro-batches and updates (`tokens` and `loss` summed per update).

        `version`: the published version the trainer's weights are right now, if they are
        one (then `onpolicy_logp_diff_abs` measures engine vs trainer on its samples)."""
        self.model.train()
        parts = self._parts(shard)
        updates = self.s.ppo_epochs * len(parts)
        if updates > 1:
            self._proximal(parts)
        world = dist.get_world_size() if dist.is_initialized() else 1
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        last_clip = 0.0
        for epoch in range(self.s.ppo_epochs):
            for part in parts:
                s, c = self._update(part, version if epoch == 0 else None)
                for k, v in s.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + c[k]
                if "clip_frac" in s:
                    last_clip = s["clip_frac"] / c["clip_frac"]
        metrics = {k: v / max(counts[k], 1) for k, v in sums.items()}
        metrics["loss"] = _all_reduce([sums.get("loss", 0.0)], dist.ReduceOp.SUM)[0] / (
            world * updates
        )
        metrics["tokens"] = sum(p.tokens for p in parts)  # response tokens, all ranks
        metrics["clip_frac_last"] = last_clip
        metrics["updates"] = float(updates)
        metrics["micro_batches"] = float(sum(p.passes for p in parts))
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

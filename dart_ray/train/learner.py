"""One optimizer step of the policy on this rank's shard of a curated step.

The learner is algorithm-blind beyond the loss switch: advantages and behaviour log-probs
come with the samples; it recomputes pi_old (one optimizer step per curated step, so pi_old
is the current policy and shares the forward pass), weights tokens by the truncated
importance ratio pi_old / pi_behaviour, and applies the PPO-clip or GSPO loss plus an
optional KL to a frozen reference.

Under FSDP every rank must run the same number of forward/backward passes, or the per-block
all-gathers deadlock. Ranks agree on the micro-batch count (all-reduce MAX) and a rank with
fewer pads with zero-weight dummy passes. Losses are normalised by the *global* number of
tokens (or sequences), so the gradient is the same however samples fall across ranks and
micro-batches.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import torch
import torch.distributed as dist
from PIL import Image

from dart_ray.algo.losses import (
    LossAgg,
    aggregate,
    gspo_loss,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    truncated_is_weight,
)
from dart_ray.records import SAMPLE_SCHEMA
from dart_ray.train.forward import MicroBatch, collate, response_logprobs
from dart_ray.train.fsdp import comm_device


@dataclass(frozen=True)
class LossSettings:
    loss: Literal["ppo", "gspo"] = "ppo"
    eps_low: float = 0.1
    eps_high: float = 0.28
    dual_clip: float | None = 10.0
    is_cap: float = 1.0
    kl_beta: float = 0.0
    loss_agg: LossAgg = "token_mean"
    temperature: float = 1.0


def split_micro(batch: pa.RecordBatch, max_tokens: int) -> list[pa.RecordBatch]:
    """Consecutive slices of at most `max_tokens` tokens (a longer sample goes alone)."""
    lens = [
        len(p) + len(r)
        for p, r in zip(
            batch.column("prompt_ids").to_pylist(),
            batch.column("response_ids").to_pylist(),
            strict=True,
        )
    ]
    out, start, used = [], 0, 0
    for i, n in enumerate(lens):
        if i > start and used + n > max_tokens:
            out.append(batch.slice(start, i - start))
            start, used = i, 0
        used += n
    if start < len(lens):
        out.append(batch.slice(start, len(lens) - start))
    return out


def _all_reduce(x: float, op: dist.ReduceOp.RedOpType) -> float:
    if not dist.is_initialized():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=op)
    return float(t.item())


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
        suppressed_ids: list[int] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.ref_model = ref_model
        self.image_processor = image_processor
        self.image_pad_id = image_pad_id
        self.pad_id = pad_id
        self.s = settings
        self.grad_clip = grad_clip
        self.tokens_per_micro = tokens_per_micro
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
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
            }
            rb = pa.RecordBatch.from_pydict(row, schema=SAMPLE_SCHEMA)
            self._dummy = collate(
                rb, self.image_processor, image_pad_id=self.image_pad_id, pad_id=self.pad_id
            ).to(self.device)
        return self._dummy

    def _loss(
        self, mb: MicroBatch, scale_tok: float, scale_seq: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        s = self.s
        mask = mb.response_mask
        logp, entropy = response_logprobs(self.model, mb, s.temperature, self.suppressed)
        logp_old = logp.detach()
        w = truncated_is_weight(logp_old, mb.behaviour_logprobs, s.is_cap) * mask
        n_tok = float(mask.sum())
        n_seq = float((mask.sum(1) > 0).sum())
        if s.loss == "ppo":
            loss, m = ppo_clip_loss(
                logp,
                logp_old,
                mb.advantages,
                mask,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                dual_clip=s.dual_clip,
                is_weight=w,
                agg=s.loss_agg,
            )
            denom = n_tok if s.loss_agg == "token_mean" else n_seq
            scale = scale_tok if s.loss_agg == "token_mean" else scale_seq
        else:
            loss, m = gspo_loss(
                logp,
                logp_old,
                mb.advantages,
                mask,
                eps_low=s.eps_low,
                eps_high=s.eps_high,
                is_weight=w,
            )
            denom, scale = n_seq, scale_seq
        if self.ref_model is not None and s.kl_beta > 0:
            with torch.no_grad():
                ref_logp, _ = response_logprobs(self.ref_model, mb, s.temperature, self.suppressed)
            kl = aggregate(kl_k3(logp, ref_logp), mask, s.loss_agg)
            loss = loss + s.kl_beta * kl
            m["kl_ref"] = float(kl)
        m["entropy"] = float(masked_mean(entropy, mask)) if n_tok else 0.0
        m["is_weight"] = float(masked_mean(w, mask)) if n_tok else 0.0
        m["tokens"] = n_tok
        return loss * denom * scale, m

    # ------------------------------------------------------------------ the step

    def step(self, shard: pa.RecordBatch) -> dict[str, float]:
        """Forward/backward over the shard in micro-batches, clip, one optimizer step."""
        self.model.train()
        micro = split_micro(shard, self.tokens_per_micro) if shard.num_rows else []
        batches = [
            collate(b, self.image_processor, image_pad_id=self.image_pad_id, pad_id=self.pad_id).to(
                self.device
            )
            for b in micro
        ]
        world = dist.get_world_size() if dist.is_initialized() else 1
        n_micro = int(_all_reduce(len(batches), dist.ReduceOp.MAX))
        tok = _all_reduce(sum(float(b.response_mask.sum()) for b in batches), dist.ReduceOp.SUM)
        seq = _all_reduce(
            sum(float((b.response_mask.sum(1) > 0).sum()) for b in batches), dist.ReduceOp.SUM
        )
        # FSDP averages gradients over ranks: multiply back by the world size, and divide by
        # the global count so the result is the global mean of the token (sequence) losses.
        scale_tok = world / max(tok, 1.0)
        scale_seq = world / max(seq, 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        real = 0
        for i in range(n_micro):
            mb = batches[i] if i < len(batches) else self._dummy_batch()
            loss, m = self._loss(mb, scale_tok, scale_seq)
            loss.backward()
            if i < len(batches):
                real += 1
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.optimizer.step()
        self.scheduler.step()
        metrics = {k: (v if k in ("tokens", "loss") else v / max(real, 1)) for k, v in sums.items()}
        metrics["loss"] = _all_reduce(metrics.get("loss", 0.0), dist.ReduceOp.SUM) / world
        metrics["tokens"] = tok  # response tokens of the step, all ranks
        metrics["grad_norm"] = grad_norm
        metrics["micro_batches"] = float(n_micro)
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

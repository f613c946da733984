"""Per-token log-probs and entropies of response tokens under the policy, from Arrow samples.

A sample is the exact prompt the policy saw (`prompt_ids`, image pads already expanded to
each image's token count) plus the response it sampled. The trainer never re-tokenises: it
concatenates the two id lists, right-pads the micro-batch, turns the sample's screenshots
into pixel values with the model's own image processor, and reads the logits that predicted
each response token. The logits go through the same processing as the engine's sampler
(`dart_ray.algo.sampling.process_logits`: suppressed tokens, temperature, top-k, top-p), so
the log-probs are of the distribution the behaviour log-probs were taken under. A sampled
token that the trainer's own truncation leaves out (its weights moved it out of the nucleus)
gets log-prob -1e4 with no gradient instead of -inf, so ratios stay finite.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, fields

import pyarrow as pa
import torch
from PIL import Image

from dart_ray.algo.sampling import SamplingSpec, entropy_of, process_logits

LOGP_FLOOR = -1e4
"""Log-prob given to a sampled token outside the trainer's truncated distribution."""


class BatchError(ValueError):
    """A sample that cannot be fed to the model, with the reason."""


@dataclass
class MicroBatch:
    """Model inputs for a micro-batch plus the response-aligned targets. B samples, L the
    padded sequence length, T the padded response length."""

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    pixel_values: torch.Tensor | None  # (patches, D)
    image_grid_thw: torch.Tensor | None  # (images, 3)
    prompt_lens: torch.Tensor  # (B,)
    response_ids: torch.Tensor  # (B, T)
    response_mask: torch.Tensor  # (B, T) 1 on real response tokens
    behaviour_logprobs: torch.Tensor  # (B, T)
    advantages: torch.Tensor  # (B,)
    weight_versions: torch.Tensor  # (B,)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with every tensor on `device` (the model's)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return MicroBatch(
            **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()}
        )


def _pad(seqs: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    n = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), n), value, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.tensor(list(s), dtype=dtype)
    return out


def collate(
    batch: pa.RecordBatch | pa.Table,
    image_processor: object,
    *,
    image_pad_id: int,
    pad_id: int,
) -> MicroBatch:
    """Build model inputs from `SAMPLE_SCHEMA` rows; checks image slots against the images."""
    rows = batch.to_pylist()
    if not rows:
        raise BatchError("empty micro-batch")
    merge = int(getattr(image_processor, "merge_size", 2))
    images: list[Image.Image] = []
    per_sample: list[int] = []
    for r in rows:
        per_sample.append(len(r["images"]))
        for k, data in enumerate(r["images"]):
            try:
                with Image.open(io.BytesIO(data)) as im:
                    images.append(im.convert("RGB"))
            except OSError as e:
                raise BatchError(
                    f"sample {r['trajectory_id']} step {r['step_idx']}: image {k} unreadable: {e}"
                ) from None
    pixel_values = grid = None
    if images:
        processed = image_processor(images=images, return_tensors="pt")  # type: ignore[operator]
        pixel_values, grid = processed["pixel_values"], processed["image_grid_thw"]
        tokens_per_image = [int(g.prod()) // merge**2 for g in grid]
        k = 0
        for r, n_img in zip(rows, per_sample, strict=True):
            want = sum(tokens_per_image[k : k + n_img])
            k += n_img
            have = sum(1 for t in r["prompt_ids"] if t == image_pad_id)
            if want != have:
                raise BatchError(
                    f"sample {r['trajectory_id']} step {r['step_idx']}: prompt has {have} image "
                    f"tokens but its {n_img} image(s) make {want} (different image processor?)"
                )
    seqs = [list(r["prompt_ids"]) + list(r["response_ids"]) for r in rows]
    input_ids = _pad(seqs, pad_id, torch.long)
    attention_mask = _pad([[1] * len(s) for s in seqs], 0, torch.long)
    resp = [r["response_ids"] for r in rows]
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pixel_values=pixel_values,
        image_grid_thw=grid,
        prompt_lens=torch.tensor([len(r["prompt_ids"]) for r in rows]),
        response_ids=_pad(resp, pad_id, torch.long),
        response_mask=_pad([r["loss_mask"] for r in rows], 0, torch.long),
        behaviour_logprobs=_pad([r["behaviour_logprobs"] for r in rows], 0.0, torch.float32),
        advantages=torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
        weight_versions=torch.tensor([r["weight_version"] for r in rows]),
    )


def response_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    sampling: SamplingSpec | None = None,
    suppressed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs of the response tokens and (B, T) entropies, response-aligned, under
    the distribution `sampling` describes (default: temperature 1, nothing truncated).

    `suppressed` token ids get no probability, as in the inference engine (which never
    samples special tokens but the end token), so both sides use the same distribution."""
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        pixel_values=mb.pixel_values,
        image_grid_thw=mb.image_grid_thw,
        use_cache=False,
    )
    logits = out.logits  # (B, L, V)
    b, t = mb.response_ids.shape
    # the logit at position p predicts token p + 1: response token j sits at prompt_len + j
    steps = torch.arange(t, device=logits.device)
    pos = (mb.prompt_lens.unsqueeze(1) - 1 + steps.unsqueeze(0)).clamp(
        max=logits.shape[1] - 1
    )  # (B, T)
    sel = logits.gather(1, pos.unsqueeze(-1).expand(b, t, logits.shape[-1])).float()  # (B, T, V)
    sel = process_logits(sel, sampling or SamplingSpec(), suppressed)
    logp_all = torch.log_softmax(sel, dim=-1)
    logp = logp_all.gather(-1, mb.response_ids.unsqueeze(-1)).squeeze(-1).clamp(min=LOGP_FLOOR)
    entropy = entropy_of(logp_all)
    # padding may hold a suppressed id: select, never multiply by the mask
    real = mb.response_mask.bool()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return torch.where(real, logp, zero), torch.where(real, entropy, zero).detach()

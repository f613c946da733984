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
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import torch
from PIL import Image

from dart_ray.algo.sampling import SamplingSpec, entropy_of, process_logits
from dart_ray.models.loading import image_inputs

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
    mm_token_type_ids: torch.Tensor | None  # (B, L) 1 on image tokens: M-RoPE's 3D positions
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


def _lists(batch: pa.RecordBatch | pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (flat values, offsets) numpy views: no Python objects per element."""
    col = batch.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False)
    return values, offsets


def _binary_lists(batch: pa.RecordBatch | pa.Table, name: str) -> tuple[pa.Array, np.ndarray]:
    """A list<binary> column as (flat binary values, offsets): each item is read from the
    Arrow buffer where it lies, with no Python list of rows."""
    col = batch.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.values, arr.offsets.to_numpy()


def _pad_lists(
    parts: list[tuple[np.ndarray, np.ndarray]], value: float, dtype: torch.dtype
) -> torch.Tensor:
    """(B, N) right-padded tensor whose row b is the concatenation of row b of each list
    column given as (values, offsets); N is the longest row."""
    lens = sum(off[1:] - off[:-1] for _, off in parts)
    out = torch.full((len(lens), int(lens.max(initial=0))), value, dtype=dtype)
    view = out.numpy()
    for b in range(len(lens)):
        at = 0
        for values, off in parts:
            seg = values[off[b] : off[b + 1]]
            view[b, at : at + len(seg)] = seg
            at += len(seg)
    return out


def collate(
    batch: pa.RecordBatch | pa.Table,
    image_processor: object,
    *,
    image_pad_id: int,
    pad_id: int,
) -> MicroBatch:
    """Build model inputs from `SAMPLE_SCHEMA` rows; checks image slots against the images.

    Token lists go from Arrow buffers to tensors through numpy views (no per-token Python
    objects); the screenshots are read from the images column's value buffer and handed to
    the image processor one by one."""
    n = batch.num_rows
    if not n:
        raise BatchError("empty micro-batch")
    prompt = _lists(batch, "prompt_ids")
    response = _lists(batch, "response_ids")
    shots, shot_off = _binary_lists(batch, "images")
    per_sample = shot_off[1:] - shot_off[:-1]
    merge = int(getattr(image_processor, "merge_size", 2))
    images: list[Image.Image] = []

    def where(b: int) -> str:  # for errors only: no Python objects per row otherwise
        tid, step = (batch.column(c)[b].as_py() for c in ("trajectory_id", "step_idx"))
        return f"sample {tid} step {step}"

    for b in range(n):
        for k, j in enumerate(range(shot_off[b], shot_off[b + 1])):
            try:
                with Image.open(io.BytesIO(shots[j].as_buffer())) as im:
                    images.append(im.convert("RGB"))
            except OSError as e:
                raise BatchError(f"{where(b)}: image {k} unreadable: {e}") from None
    pixel_values = grid = None
    if images:
        processed = image_processor(images=images, return_tensors="pt")  # type: ignore[operator]
        pixel_values, grid = processed["pixel_values"], processed["image_grid_thw"]
        tokens_per_image = (grid.prod(-1) // merge**2).tolist()
        values, off = prompt
        k = 0
        for b in range(n):
            want = sum(tokens_per_image[k : k + int(per_sample[b])])
            k += int(per_sample[b])
            have = int((values[off[b] : off[b + 1]] == image_pad_id).sum())
            if want != have:
                raise BatchError(
                    f"{where(b)}: prompt has {have} image tokens but its "
                    f"{per_sample[b]} image(s) make {want} (different image processor?)"
                )
    input_ids = _pad_lists([prompt, response], pad_id, torch.long)
    lens = (prompt[1][1:] - prompt[1][:-1]) + (response[1][1:] - response[1][:-1])
    attention_mask = (torch.arange(input_ids.shape[1]) < torch.from_numpy(lens)[:, None]).long()
    types = image_inputs(input_ids, pixel_values, grid, image_pad_id).get("mm_token_type_ids")
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        pixel_values=pixel_values,
        image_grid_thw=grid,
        mm_token_type_ids=None if types is None else types * attention_mask.int(),
        prompt_lens=torch.from_numpy((prompt[1][1:] - prompt[1][:-1]).astype(np.int64)),
        response_ids=_pad_lists([response], pad_id, torch.long),
        response_mask=_pad_lists([_lists(batch, "loss_mask")], 0, torch.long),
        behaviour_logprobs=_pad_lists([_lists(batch, "behaviour_logprobs")], 0.0, torch.float32),
        advantages=torch.from_numpy(
            batch.column("advantage").to_numpy(zero_copy_only=False).astype(np.float32)
        ),
        weight_versions=torch.from_numpy(
            batch.column("weight_version").to_numpy(zero_copy_only=False).astype(np.int64)
        ),
    )


@dataclass
class ResponseScores:
    """What one forward pass gives the loss, response-aligned (B, T), 0 on padding."""

    logp: torch.Tensor
    """Log-probs under the sampled distribution (what the behaviour log-probs are of)."""
    entropy: torch.Tensor
    """Entropies of the sampled distribution (no gradient)."""
    logp_full: torch.Tensor | None = None
    """Log-probs under the untruncated distribution (suppressed tokens removed, temperature
    applied, no top-k / top-p), when asked for: what a KL to a reference compares. Under
    truncation a token outside one model's nucleus but inside the other's sits at the -1e4
    floor and its k3 term would be ~1e4."""


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
    scores = score_responses(model, mb, sampling, suppressed)
    return scores.logp, scores.entropy


def score_responses(
    model: torch.nn.Module,
    mb: MicroBatch,
    sampling: SamplingSpec | None = None,
    suppressed: torch.Tensor | None = None,
    *,
    full: bool = False,
) -> ResponseScores:
    """`response_logprobs`, and with `full` also the untruncated log-probs from the same
    forward pass (`ResponseScores.logp_full`)."""
    images = {}
    if mb.pixel_values is not None:  # dart_ray.models.loading.image_inputs, collated
        images = {
            "pixel_values": mb.pixel_values,
            "image_grid_thw": mb.image_grid_thw,
            "mm_token_type_ids": mb.mm_token_type_ids,
        }
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False, **images)
    logits = out.logits  # (B, L, V)
    b, t = mb.response_ids.shape
    # the logit at position p predicts token p + 1: response token j sits at prompt_len + j
    steps = torch.arange(t, device=logits.device)
    pos = (mb.prompt_lens.unsqueeze(1) - 1 + steps.unsqueeze(0)).clamp(
        max=logits.shape[1] - 1
    )  # (B, T)
    sel = logits.gather(1, pos.unsqueeze(-1).expand(b, t, logits.shape[-1])).float()  # (B, T, V)
    spec = sampling or SamplingSpec()
    # padding may hold a suppressed id: select, never multiply by the mask
    real = mb.response_mask.bool()
    zero = torch.zeros((), dtype=sel.dtype, device=sel.device)

    def logp_of(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = torch.log_softmax(z, dim=-1)
        logp = logp_all.gather(-1, mb.response_ids.unsqueeze(-1)).squeeze(-1)
        return torch.where(real, logp.clamp(min=LOGP_FLOOR), zero), logp_all

    logp, logp_all = logp_of(process_logits(sel, spec, suppressed))
    entropy = torch.where(real, entropy_of(logp_all), zero).detach()
    full_logp = None
    if full:
        untruncated = SamplingSpec(temperature=spec.temperature)
        full_logp = (
            logp if not spec.truncates else logp_of(process_logits(sel, untruncated, suppressed))[0]
        )
    return ResponseScores(logp, entropy, full_logp)

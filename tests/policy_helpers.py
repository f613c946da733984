"""Small builders for the policy tests: screenshots and requests."""

from __future__ import annotations

import io
from typing import Any

import torch
from PIL import Image, ImageDraw

from dart_ray.engines.base import GenerateRequest, SamplingParams
from dart_ray.models.loading import EncodedPrompt
from dart_ray.uitars.prompts import Turn, build_messages


def png(color: tuple[int, int, int], size: tuple[int, int] = (112, 112), box: int = 0) -> bytes:
    """A solid screenshot, optionally with a white square at (box, box) to tell images apart."""
    im = Image.new("RGB", size, color)
    if box:
        ImageDraw.Draw(im).rectangle((box, box, box + 20, box + 20), fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def request(
    instruction: str = "click the OK button",
    screens: tuple[bytes, ...] = (),
    sampling: SamplingParams | None = None,
) -> GenerateRequest:
    screens = screens or (png((200, 30, 30)),)
    turns = [Turn(s, f"Thought: step {i}\nAction: wait()") for i, s in enumerate(screens[:-1])]
    turns.append(Turn(screens[-1]))
    return GenerateRequest(tuple(build_messages(instruction, turns, 5, 35)), sampling)


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def logits_in_3d(model: Any, ids: torch.Tensor, enc: EncodedPrompt) -> torch.Tensor:
    """(1, L, V) logits of one unpadded sequence whose image tokens sit at Qwen2.5-VL's own
    3D positions (time, row, column: M-RoPE), built here with the model's `get_rope_index`
    and handed to the forward as `position_ids`: the reference the engine and the trainer
    must match, computed without dart-ray's own path to those positions."""
    with torch.no_grad():
        if enc.pixel_values is None:
            return model(input_ids=ids).logits.float()
        types = (ids == model.config.image_token_id).int()
        positions, _ = model.model.get_rope_index(ids, types, enc.image_grid_thw)
        return model(
            input_ids=ids,
            position_ids=positions,
            pixel_values=enc.pixel_values,
            image_grid_thw=enc.image_grid_thw,
        ).logits.float()


def logits_in_1d(model: Any, ids: torch.Tensor, enc: EncodedPrompt) -> torch.Tensor:
    """The same forward with every token numbered 1D (what transformers 5 does when it is
    not told which tokens are image tokens): how wrong positions would show."""
    with torch.no_grad():
        return model(
            input_ids=ids, pixel_values=enc.pixel_values, image_grid_thw=enc.image_grid_thw
        ).logits.float()

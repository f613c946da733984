"""Small builders for the policy tests: screenshots and requests."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from dart_ray.engines.base import GenerateRequest, SamplingParams
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

"""Screenshot geometry: the size the model sees a screenshot at, and coordinate mapping.

Qwen2.5-VL cuts an image into 14-pixel patches and merges 2x2 of them into one token, so its
image processor first resizes the screenshot to sides that are multiples of 28 with the area
inside a pixel budget (`smart_resize`). UI-TARS-1.5 writes coordinates in that resized frame;
`CoordinateMap` takes them back to the screen. The rule must be exactly the processor's, or
every click lands off by the rounding: a test compares the two on many sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FACTOR = 28
"""Side multiple of the resized image: patch 14 x spatial merge 2."""
MIN_PIXELS = 100 * 28 * 28
"""UI-TARS-1.5's smallest resized area (78,400 px)."""
MAX_PIXELS = 16384 * 28 * 28
"""UI-TARS-1.5's largest resized area (12,845,056 px)."""


def smart_resize(
    height: int,
    width: int,
    factor: int = FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """(height, width) of the image the model sees: multiples of `factor`, area in range.

    Round each side to the nearest multiple; if the area is too large, shrink both sides by
    the same factor (flooring); if too small, grow them (ceiling). Same rule as the Qwen2-VL
    image processor, which the tests check across many sizes.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of {width}x{height} exceeds 200")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True, slots=True)
class CoordinateMap:
    """Maps model pixels (in the resized image) to screen pixels, and back."""

    screen_width: int
    screen_height: int
    model_width: int
    model_height: int

    @classmethod
    def for_screen(
        cls,
        width: int,
        height: int,
        min_pixels: int = MIN_PIXELS,
        max_pixels: int = MAX_PIXELS,
        factor: int = FACTOR,
    ) -> CoordinateMap:
        h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
        return cls(width, height, w, h)

    @classmethod
    def identity(cls, width: int, height: int) -> CoordinateMap:
        return cls(width, height, width, height)

    def to_screen(self, x: float, y: float) -> tuple[float, float]:
        """Scale by screen/model and clamp onto the screen (a model may point off-image)."""
        sx = x * self.screen_width / self.model_width
        sy = y * self.screen_height / self.model_height
        return (
            min(max(sx, 0.0), float(self.screen_width - 1)),
            min(max(sy, 0.0), float(self.screen_height - 1)),
        )

    def to_model(self, x: float, y: float) -> tuple[int, int]:
        return (
            round(x * self.model_width / self.screen_width),
            round(y * self.model_height / self.screen_height),
        )

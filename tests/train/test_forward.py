"""collate reads the screenshots of a (sliced) micro-batch from the Arrow buffers: the image
processor gets exactly the slice's images, in order, and a bad image names its sample."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image

from dart_ray.data.batches import to_record_batch
from dart_ray.data.curation import StepSample
from dart_ray.train.forward import BatchError, collate
from tests.policy_helpers import png

PAD = 9


class OneTokenPerImage:
    """An image processor that records the colour of each image it gets; every image is a
    1x1x1 grid, so with merge size 1 it takes one image pad in the prompt."""

    merge_size = 1

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, images: list[Image.Image], return_tensors: str) -> dict[str, torch.Tensor]:
        self.seen += [im.getpixel((0, 0)) for im in images]
        n = len(images)
        return {
            "pixel_values": torch.zeros(n, 3),
            "image_grid_thw": torch.ones(n, 3, dtype=torch.long),
        }


def sample(tid: str, images: tuple[bytes, ...]) -> StepSample:
    prompt = (1, *([PAD] * len(images)), 2)
    return StepSample(tid, "task", 0, 0, prompt, (5, 6), (-1.0, -1.0), 0.5, images)


RED, GREEN, BLUE = png((255, 0, 0)), png((0, 255, 0)), png((0, 0, 255))


def test_a_slice_gives_the_processor_its_own_images() -> None:
    batch = to_record_batch(
        [sample("a", (RED,)), sample("b", (GREEN,)), sample("c", (RED, BLUE)), sample("d", ())]
    )
    proc = OneTokenPerImage()
    mb = collate(batch.slice(1, 3), proc, image_pad_id=PAD, pad_id=0)
    assert proc.seen == [(0, 255, 0), (255, 0, 0), (0, 0, 255)]  # b's, then c's two; d none
    assert mb.image_grid_thw is not None and mb.image_grid_thw.shape == (3, 3)
    assert mb.input_ids[1, :4].tolist() == [1, PAD, PAD, 2]


def test_an_unreadable_image_names_the_sample_of_the_slice() -> None:
    batch = to_record_batch([sample("a", (RED,)), sample("b", (GREEN, b"not a png"))])
    with pytest.raises(BatchError, match="sample b step 0: image 1 unreadable"):
        collate(batch.slice(1, 1), OneTokenPerImage(), image_pad_id=PAD, pad_id=0)

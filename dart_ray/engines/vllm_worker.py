"""Runs inside vLLM's worker process: load weights from a shared-memory file in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so `collective_rpc` can call
`dart_ray_load_weights` on every worker. The file holds raw tensor bytes (written by
`VLLMEngine._load`); numpy maps it without reading it, torch views the mapped bytes, and the
model's in-place reload copies them into its (possibly fused and repacked) parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dart_ray.models.weights import _DTYPES


def _tensors(path: str, metas: list[tuple[str, str, list[int], int]]) -> Iterator[tuple[str, Any]]:
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    with warnings.catch_warnings():  # read-only map: only read from, by the copy into params
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, dtype, shape, offset in metas:
            dt = _DTYPES[dtype]
            n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
            flat = torch.from_numpy(np.asarray(buf[offset : offset + n]))
            yield name, flat.view(dt).reshape(shape)


class WeightLoaderExtension:
    """Mixed into vLLM's worker class, whose `reload_weights` we call."""

    reload_weights: Any

    def dart_ray_load_weights(self, path: str, metas: list[tuple[str, str, list[int], int]]) -> int:
        # vLLM's in-place reload: runs the model's load_weights (which maps checkpoint names
        # and fuses q/k/v) and redoes the post-load processing the CPU backend applied (its
        # repacked parameters no longer carry weight loaders), then clears encoder caches.
        self.reload_weights(weights_iterator=_tensors(path, metas))
        return len(metas)

"""Pack step samples into Arrow RecordBatches (`SAMPLE_SCHEMA`), one shard per trainer rank,
balanced by tokens so that no rank waits on another.

Balancing is greedy longest-first (LPT): take samples in decreasing token count and give each
to the rank with the fewest tokens so far. Its makespan is within 4/3 of optimal, and it costs
O(n log n); the trainer's step time follows the largest shard.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dart_ray.arrays import list_array
from dart_ray.data.curation import StepSample
from dart_ray.records import SAMPLE_SCHEMA


def to_record_batch(samples: Sequence[StepSample]) -> pa.RecordBatch:
    """`SAMPLE_SCHEMA` rows, one per sample. The token columns are built from each sample's
    buffers (`list_array`: one copy per row, no Python object per token); the screenshots as
    one binary array plus offsets, each image copied once."""

    def lists(name: str, rows: list[Sequence[Any]]) -> pa.ListArray:
        return list_array(rows, SAMPLE_SCHEMA.field(name).type)

    response = lists("response_ids", [s.response_ids for s in samples])
    ones = pa.array(np.ones(len(response.values), np.int8))
    return pa.RecordBatch.from_pydict(
        {
            "trajectory_id": [s.trajectory_id for s in samples],
            "task_id": [s.task_id for s in samples],
            "step_idx": [s.step_idx for s in samples],
            "weight_version": [s.weight_version for s in samples],
            "prompt_ids": lists("prompt_ids", [s.prompt_ids for s in samples]),
            "response_ids": response,
            "behaviour_logprobs": lists(
                "behaviour_logprobs", [s.behaviour_logprobs for s in samples]
            ),
            "loss_mask": pa.ListArray.from_arrays(
                response.offsets, ones, type=SAMPLE_SCHEMA.field("loss_mask").type
            ),
            "advantage": [s.advantage for s in samples],
            "images": _images(samples),
            "token_versions": lists("token_versions", [s.token_versions for s in samples]),
        },
        schema=SAMPLE_SCHEMA,
    )


def _images(samples: Sequence[StepSample]) -> pa.ListArray:
    """The `images` column: every sample's screenshots in one binary array, cut by offsets."""
    offsets = accumulate((len(s.images) for s in samples), initial=0)
    return pa.ListArray.from_arrays(
        pa.array(list(offsets), pa.int32()),
        pa.array([im for s in samples for im in s.images], pa.binary()),
        type=SAMPLE_SCHEMA.field("images").type,
    )


def shard_by_tokens(samples: Sequence[StepSample], num_ranks: int) -> list[list[StepSample]]:
    """Split samples into `num_ranks` shards of near-equal token counts (LPT)."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    shards: list[list[StepSample]] = [[] for _ in range(num_ranks)]
    heap = [(0, r) for r in range(num_ranks)]
    order = sorted(range(len(samples)), key=lambda i: -samples[i].num_tokens)
    for i in order:
        load, r = heapq.heappop(heap)
        shards[r].append(samples[i])
        heapq.heappush(heap, (load + samples[i].num_tokens, r))
    return shards


def pack(samples: Sequence[StepSample], num_ranks: int) -> list[pa.RecordBatch]:
    """One RecordBatch per rank (possibly empty: a rank with nothing still steps in lockstep)."""
    return [to_record_batch(s) for s in shard_by_tokens(samples, num_ranks)]


def batch_tokens(batch: pa.RecordBatch) -> int:
    p = batch.column("prompt_ids")
    r = batch.column("response_ids")
    return sum(int(pc.sum(pc.list_value_length(c)).as_py() or 0) for c in (p, r))


TOKEN_LAG = "token_lag_"
"""Prefix of the train-history keys counting a step's tokens by versions behind."""


def token_lags(batch: pa.RecordBatch, version: int) -> dict[int, int]:
    """Response tokens of `batch` by how many versions they are behind `version` (the weights
    that train them): each token's own version where a weight update landed mid-response
    (`token_versions`), the row's `weight_version` otherwise."""
    if batch.num_rows == 0:
        return {}
    lengths = pc.list_value_length(batch.column("response_ids")).to_numpy(zero_copy_only=False)
    per_token = batch.column("token_versions")
    mixed = pc.list_value_length(per_token).to_numpy(zero_copy_only=False) > 0
    rows = np.asarray(batch.column("weight_version").to_numpy(zero_copy_only=False))
    uniform = np.repeat(rows[~mixed], lengths[~mixed])
    spans = pc.list_flatten(per_token.filter(pa.array(mixed))).to_numpy(zero_copy_only=False)
    lags = version - np.concatenate([uniform, np.asarray(spans, dtype=np.int64)])
    values, counts = np.unique(lags, return_counts=True)
    return {int(v): int(n) for v, n in zip(values, counts, strict=True)}

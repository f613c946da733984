"""The timing mode's optimizer step: as long as a 7B step on the curated samples, no compute.

Everything around the step stays real (the shard pulled from the curator, the claims taken
over and renewed, the publish through the object store, the checkpoint rows and durable
saves); only `Learner.step` is replaced. A step on n samples takes

    train_overhead_s + n x train_tokens_per_sample / train_tokens_per_s     (x timing.scale)

(dart_ray.config.timing gives each figure's derivation).
"""

from __future__ import annotations

import time

import pyarrow as pa

from dart_ray.config.timing import TimingConfig


def train_step_s(t: TimingConfig, samples: int) -> float:
    """Seconds of one optimizer step on `samples` step samples (unscaled)."""
    return t.train_overhead_s + samples * t.train_tokens_per_sample / t.train_tokens_per_s


def timed_step(shard: pa.RecordBatch, t: TimingConfig, world: int = 1) -> dict[str, float]:
    """Sleep as long as this rank's part of the step would compute; the step's metrics.
    Every rank holds a shard of the same step, so each sleeps for the whole step's samples
    spread over `world` ranks."""
    seconds = train_step_s(t, shard.num_rows * world) * t.scale
    time.sleep(seconds)
    return {
        "tokens": float(shard.num_rows * world * t.train_tokens_per_sample),
        "simulated_step_s": seconds,
        "updates": 1.0,
    }

"""The curator's records: its settings, a packed training step, and its counters.

Kept apart from the core (`curator.py`), which fills them, so the actor, the trainer and the
report read them without the core's machinery.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from dart_ray.data.curation import CurationParams, GroupOutcome
from dart_ray.store.log import Claim


@dataclass(frozen=True)
class CuratorSettings:
    run_id: str
    num_ranks: int
    group_size: int = 8
    min_group: int = 2
    group_timeout_s: float = 120.0
    group_abandon_s: float = 600.0
    groups_per_step: int = 4
    max_staleness: int = 2
    queue_depth: int = 2
    lease_s: float = 600.0
    claim_batch: int = 256
    max_held_rows: int = 1 << 30
    """Most rows held claimed and not yet handed out (the curator's memory bound)."""
    consumer: str = "curator"
    params: CurationParams = field(default_factory=CurationParams)
    pack_as_ready: bool = True
    """Pack a step as soon as `groups_per_step` groups are ready (the decoupled mode). Off
    (the synchronous baseline): only `flush` packs, at the end of a round, every group of it."""


@dataclass
class TrainStep:
    """One optimizer step's worth of data: a shard per rank and the rows it consumes."""

    step_id: int
    shards: list[pa.RecordBatch]
    rows: list[int]
    claims: list[Claim]
    """The step's rows grouped by the claim that holds them: whoever finishes the optimizer
    step can acknowledge them in the log directly, even if this curator is gone by then."""
    num_samples: int
    num_groups: int
    mean_reward: float
    min_version: int = 0
    """The oldest weight version among the step's rows (the staleness check at hand-out)."""
    groups: list[GroupOutcome] = field(default_factory=list)
    """The curated groups it packs (a replay that goes stale is taken out, the rest kept)."""


@dataclass
class CuratorMetrics:
    queue_depth: int = 0
    pending_groups: int = 0
    """Groups still filling plus curated groups waiting for a step."""
    filling_groups: int = 0
    """Groups still waiting for members (or for their timeout)."""
    ready_groups: int = 0
    """Curated, trainable groups waiting for enough partners to make a step."""
    held_rows: int = 0
    steps_formed: int = 0
    steps_acked: int = 0
    rows_handed: int = 0
    """Rows of steps handed to a trainer (what leaves the queue by training)."""
    rows_trained: int = 0
    samples_formed: int = 0
    replays: int = 0
    replays_by_task: Counter[str] = field(default_factory=Counter)
    """`replays` by task: the tasks whose all-fail groups trained on a replayed success."""
    replays_stale: int = 0
    """All-fail groups whose task's newest success was older than the staleness bound (so
    not replayed), or whose replay went past the bound while the group waited (then the
    replay alone is taken out; the group's own samples still train)."""
    released_rows: int = 0
    """Rows of handed-out steps given back because their trainer went away."""
    dropped: Counter[str] = field(default_factory=Counter)
    quarantined: Counter[str] = field(default_factory=Counter)
    """Rows settled as bad data, by where they broke (`blob_unreadable`, `curation`,
    `packing`)."""
    stale_at: Counter[str] = field(default_factory=Counter)
    """Rows dropped as stale by where they waited when the bound passed them: `log`
    (unclaimed), `filling` (a group waiting for members), `ready` (a curated group waiting
    for partners), `queued` (a packed step waiting for a trainer)."""
    staleness: Counter[int] = field(default_factory=Counter)
    """Claimed rows by version lag (current version - row version)."""

"""What a Ray Train worker is handed (`train_loop_config`): the run's config, ids, folders,
the names of the actors and the Serve application it talks to, and where it starts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dart_ray.config import Config
from dart_ray.train.checkpointing import TrainerState


@dataclass(frozen=True)
class TrainJob:
    """Everything a train worker needs (picklable; no secrets: the DSN is resolved inside)."""

    config: Config
    run_id: str
    model_dir: str
    """Where the initial weights come from (the base model, or a checkpoint to resume)."""
    run_dir: str
    curator: str
    """Name of the Curator actor."""
    policy_app: str
    """Ray Serve application of the policy server (its `update_weights` reaches every replica)."""
    control: str
    """Name of the RunControl actor."""
    namespace: str
    session: int = field(default_factory=time.time_ns)
    """Grows with every trainer start; tells the curator a previous trainer is gone."""
    start: TrainerState = field(default_factory=lambda: TrainerState(step=0, version=0))
    poll_s: float = 2.0
    base_dir: str = ""
    """The run's initial weights, the KL reference (`algo.kl_beta`) for the whole run: a resumed
    run trains from a checkpoint (`model_dir`) but keeps its reference. Empty: `model_dir`'s
    base (the folder itself, or a LoRA checkpoint's recorded base)."""

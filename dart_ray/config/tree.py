"""`Config`, the whole tree: one section per part, the rules that span sections, and the
redacted forms a run prints and stores."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import model_validator

from dart_ray.config.base import Section
from dart_ray.config.credentials import redact
from dart_ray.config.env import EnvConfig
from dart_ray.config.policy import PolicyConfig
from dart_ray.config.rollout import CurationConfig, RolloutConfig
from dart_ray.config.run import ClusterConfig, RunConfig
from dart_ray.config.store import StoreConfig
from dart_ray.config.train import AlgoConfig, TrainConfig


class Config(Section):
    """The whole tree. Build it with `load_config`."""

    run: RunConfig = RunConfig()
    env: EnvConfig = EnvConfig()
    policy: PolicyConfig = PolicyConfig()
    rollout: RolloutConfig = RolloutConfig()
    curation: CurationConfig = CurationConfig()
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    store: StoreConfig = StoreConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _rollouts_sample(self) -> Config:
        if self.policy.temperature == 0:
            raise ValueError(
                "policy.temperature = 0: rollouts must sample (temperature > 0): greedy tokens "
                "have no log-probs to learn from; held-out evaluation is greedy by itself"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """A JSON-able dict safe to print, log or store (secrets masked)."""
        return redact(self.model_dump(mode="json"))

    def redacted_yaml(self) -> str:
        """`redacted()` as YAML: what a checkpoint row keeps in `config_yaml`."""
        return str(yaml.safe_dump(self.redacted(), sort_keys=True))

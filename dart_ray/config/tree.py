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
from dart_ray.config.timing import TimingConfig
from dart_ray.config.train import AlgoConfig, TrainConfig

LATENCY_KIND = "dart_ray.envs.latency:LatencyMiniDesk"


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
    timing: TimingConfig = TimingConfig()

    @model_validator(mode="after")
    def _timing_on_minidesk(self) -> Config:
        if self.timing.enabled and self.env.kind not in ("minidesk", LATENCY_KIND):
            raise ValueError(
                f"timing.enabled needs env.kind = 'minidesk' (got {self.env.kind!r}): the timing "
                "mode runs MiniDesk's tasks behind the simulated latencies"
            )
        return self

    def simulated(self) -> Config:
        """The config the parts of a timing-mode run are given: the environment sessions run
        LatencyMiniDesk with `[timing]`'s latencies (itself when the mode is off)."""
        if not self.timing.enabled:
            return self
        env = self.env.model_copy(
            update={"kind": LATENCY_KIND, "latency": self.timing.env_latency()}
        )
        return self.model_copy(update={"env": env})

    @model_validator(mode="after")
    def _rollouts_sample(self) -> Config:
        if self.policy.temperature == 0:
            raise ValueError(
                "policy.temperature = 0: rollouts must sample (temperature > 0): greedy tokens "
                "have no log-probs to learn from; held-out evaluation is greedy by itself"
            )
        return self

    @model_validator(mode="after")
    def _replay_seeds(self) -> Config:
        cur = self.curation
        if cur.replay_seeds is None:
            return self
        if not cur.success_replay or self.algo.objective != "grpo":
            raise ValueError(
                "curation.replay_seeds seeds success replay: it needs curation.success_replay "
                "= true and algo.objective = 'grpo'"
            )
        return self

    @model_validator(mode="after")
    def _lora_engine(self) -> Config:
        lo, p = self.train.lora, self.policy
        if lo.enabled and p.engine == "vllm" and p.vllm_max_lora_rank < lo.rank:
            raise ValueError(
                f"train.lora.rank = {lo.rank} on the vLLM engine needs policy.vllm_max_lora_rank "
                f">= {lo.rank} (got {p.vllm_max_lora_rank}): vLLM reserves LoRA slots of that "
                "rank at start"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """A JSON-able dict safe to print, log or store (secrets masked)."""
        return redact(self.model_dump(mode="json"))

    def redacted_yaml(self) -> str:
        """`redacted()` as YAML: what a checkpoint row keeps in `config_yaml`."""
        return str(yaml.safe_dump(self.redacted(), sort_keys=True))

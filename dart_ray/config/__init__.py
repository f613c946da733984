"""The configuration tree: one pydantic model per part, loaded from TOML plus `key=value`.

Every field has a docstring (it becomes the field's description, which `dart-ray config
show --docs` and the configuration reference print). Validation happens once, at load,
before any process starts; errors name the dotted key and the offending value.

Secrets never live in the config. A field that needs one names where to read it: an
environment variable (`*_env`) or a file (`*_file`). The config is therefore safe to print
and to store in the `run` table; `redacted()` masks anything that still looks like a secret
(a password inside a DSN, say) as a second line of defence.

The parts live in their own modules (`run`, `env`, `policy`, `rollout`, `train`, `store`, `timing`;
`tree` joins them into `Config`), next to the loader (`loader`), the secret helpers
(`secrets`) and the reference generator (`reference`). Import from `dart_ray.config`.
"""

from __future__ import annotations

from dart_ray.config.base import ConfigError
from dart_ray.config.credentials import read_secret, redact
from dart_ray.config.env import DesktopOptions, EnvConfig, MiniDeskOptions, MiniWobOptions
from dart_ray.config.loader import apply_override, load_config
from dart_ray.config.policy import PolicyConfig, is_loopback
from dart_ray.config.reference import field_docs, reference_markdown, resolved_docs
from dart_ray.config.rollout import CurationConfig, RolloutConfig
from dart_ray.config.run import ClusterConfig, RunConfig
from dart_ray.config.store import StoreConfig
from dart_ray.config.timing import EnvLatency, TimingConfig
from dart_ray.config.train import AlgoConfig, TrainConfig
from dart_ray.config.tree import Config

__all__ = [
    "AlgoConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "CurationConfig",
    "DesktopOptions",
    "EnvConfig",
    "EnvLatency",
    "MiniDeskOptions",
    "MiniWobOptions",
    "PolicyConfig",
    "RolloutConfig",
    "RunConfig",
    "StoreConfig",
    "TimingConfig",
    "TrainConfig",
    "apply_override",
    "field_docs",
    "is_loopback",
    "load_config",
    "read_secret",
    "redact",
    "reference_markdown",
    "resolved_docs",
]

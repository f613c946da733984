"""What every part of the configuration shares: the `Section` base model (unknown keys refused,
attribute docstrings as field descriptions, frozen) and `ConfigError`, the one error a
configuration problem raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who wrote the config."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

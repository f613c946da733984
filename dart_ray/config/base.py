"""What every part of the configuration shares: the `Section` base model (unknown keys refused,
attribute docstrings as field descriptions, frozen, `~` in paths expanded) and `ConfigError`,
the one error a configuration problem raises."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who wrote the config."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _expand_home(cls, v: Any) -> Any:
        """A path given as `~/...` (in a file or an override) is under the home of the user
        who runs the command, as a shell would read it, never a folder named `~`."""
        if isinstance(v, PurePath) and str(v).startswith("~"):
            return type(v)(v).expanduser()  # type: ignore[attr-defined]
        return v

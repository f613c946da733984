"""Loading a `Config`: a TOML file (or the defaults), `key=value` overrides in TOML syntax,
validation, and error messages that name the dotted key and the (redacted) value."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dart_ray.config.base import ConfigError
from dart_ray.config.credentials import SECRET_KEY, redact
from dart_ray.config.masking import MASK
from dart_ray.config.tree import Config


def _parse_value(raw: str) -> Any:
    """A CLI value as TOML (numbers, booleans, arrays, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` to a nested dict in place."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {override!r}: expected key=value, e.g. algo.eps_high=0.2")
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = _parse_value(raw.strip())


def _format_validation_error(err: ValidationError, source: str, tree: dict[str, Any]) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key")
            continue
        value = tree
        for p in e["loc"]:
            value = value.get(p) if isinstance(value, dict) else None  # type: ignore[assignment]
        msg = e["msg"].removeprefix("Value error, ")
        if isinstance(value, dict):  # a section's (or the tree's) rule: the message names its keys
            lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
            continue
        shown = MASK if SECRET_KEY.search(loc) else redact(value, loc)
        lines.append(f"  {loc} = {shown!r}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a TOML file (or the defaults), apply `key=value` overrides, validate."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            tree = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    for o in overrides or []:
        apply_override(tree, o)
    if overrides:
        source += " + overrides"
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source, tree)) from None

"""The configuration reference: every leaf field's dotted key, default and description (from
the field docstrings), for `dart-ray config show --docs` and docs/CONFIGURATION.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dart_ray.config.tree import Config


def field_docs(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf field, for docs and `--docs`."""
    rows: list[tuple[str, str, str]] = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(field_docs(ann, key + "."))
        else:
            d = f.default
            shown = repr(str(d)) if isinstance(d, Path) else repr(d)
            rows.append((key, shown, (f.description or "").replace("\n", " ")))
    return rows


def resolved_docs(config: Config) -> list[tuple[str, str, str, str]]:
    """(dotted key, resolved value, default, description) for every leaf field: what
    `dart-ray config show --docs` prints, the values after the file and the overrides
    (secrets masked as in `Config.redacted()`). Both are shown as JSON values in Python
    syntax, so that a default tuple and a configured list compare equal."""
    values = config.redacted()
    defaults = _defaults(Config)
    rows = []
    for key, default, doc in field_docs():
        node: Any = values
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        d = repr(defaults[key]) if key in defaults else default
        rows.append((key, d if node is _MISSING else repr(node), d, doc))
    return rows


_MISSING = object()


def _defaults(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every leaf field's default as JSON would carry it (tuples as lists, paths as text)."""
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _defaults(ann, f"{prefix}{name}.")
        elif not f.is_required() and f.default_factory is None:
            out[f"{prefix}{name}"] = json.loads(json.dumps(f.default, default=str))
    return out


def reference_markdown() -> str:
    """docs/CONFIGURATION.md, generated from the field docstrings (a test keeps it current)."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the docstrings in `dart_ray/config/` by",
        "`dart-ray config show --markdown > docs/CONFIGURATION.md`; do not edit by hand.",
        "",
        "Set a key in a TOML file under its section (`[algo]` / `eps_high = 0.2`) or on the",
        "command line as `algo.eps_high=0.2` (values in TOML syntax).",
    ]
    section = None
    for key, default, doc in field_docs():
        sec = key.split(".", 1)[0]
        if sec != section:
            section = sec
            lines += ["", f"## `[{sec}]`", "", "| key | default | meaning |", "|---|---|---|"]
        cell = doc.replace("|", r"\|")
        lines.append(f"| `{key}` | `{default}` | {cell} |")
    return "\n".join(lines) + "\n"

"""The configuration reference: every leaf field's dotted key, default and description (from
the field docstrings), for `dart-ray config show --docs` and docs/CONFIGURATION.md."""

from __future__ import annotations

from pathlib import Path

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

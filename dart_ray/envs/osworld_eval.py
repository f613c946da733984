"""OSWorld-style evaluation: a getter fetches the real end state, a metric scores it.

A task's `evaluator` names `func` (a metric, or a list of them joined by `conj`), `result` (a
getter, or a list) and optionally `expected` (a getter, usually `rule`) and `options`:

    {"func": "check_include_exclude",
     "result": {"type": "vm_file", "path": "~/notes.txt"},
     "expected": {"type": "rule", "rules": {"include": ["hello"], "exclude": []}}}

We implement the getters and metrics our desktop tasks use, under OSWorld's names where
OSWorld has one (`vm_file`, `vm_command_line`, `accessibility_tree`, `rule`, `exact_match`,
`check_include_exclude`, `is_in_list`, `infeasible`), plus `window_titles`, `list_directory`
and `terminal_output`. An unknown getter or metric is an input error naming it, never a 0.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dart_ray.envs.base import EnvInputError

if TYPE_CHECKING:
    from dart_ray.envs.osworld_client import OSWorldClient


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


def _titles(c: OSWorldClient) -> list[str]:
    root = ET.fromstring(c.accessibility())
    return [w.get("name", "") for w in root.iter("window")]


def _names(tree: dict[str, Any] | None, prefix: str = "") -> list[str]:
    """Paths of every entry of a `list_directory` tree, relative to its root."""
    if not tree:
        return []
    out = []
    for ch in tree.get("children", []):
        path = f"{prefix}{ch['name']}"
        out.append(path)
        if ch.get("type") == "directory":
            out += _names(ch, path + "/")
    return out


GETTERS: dict[str, Callable[[OSWorldClient, dict[str, Any]], Any]] = {
    "vm_file": lambda c, g: _text(c.file(g["path"])),
    "vm_command_line": lambda c, g: c.execute(g["command"], bool(g.get("shell", False)))["output"],
    "accessibility_tree": lambda c, g: c.accessibility(),
    "window_titles": lambda c, g: _titles(c),
    "list_directory": lambda c, g: _names(c.list_directory(g["path"])),
    "terminal_output": lambda c, g: c.terminal(),
    "rule": lambda c, g: g["rules"],
}


def exact_match(result: Any, rules: dict[str, Any], strip: bool = True) -> float:
    """1 if the result equals `rules["match"]` (strings compared stripped by default)."""
    if result is None:
        return 0.0
    want = rules["match"]
    if strip and isinstance(result, str) and isinstance(want, str):
        return float(result.strip() == want.strip())
    return float(result == want)


def check_include_exclude(result: Any, rules: dict[str, Any]) -> float:
    """1 if every `include` is in the result and no `exclude` is (substrings of a string,
    elements of a list)."""
    if result is None:
        return 0.0
    inc, exc = rules.get("include", []), rules.get("exclude", [])
    return float(all(i in result for i in inc) and not any(e in result for e in exc))


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    """1 if `rules["expected"]` is one of the result's elements."""
    return float(result is not None and rules["expected"] in result)


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "is_in_list": is_in_list,
}


def _as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def evaluate(client: OSWorldClient, evaluator: dict[str, Any], last_action: str | None) -> float:
    """Score the end state with the task's evaluator (0.0..1.0)."""
    funcs = _as_list(evaluator.get("func"))
    if funcs == ["infeasible"]:  # the task cannot be done; only saying so (FAIL) is right
        return float(last_action == "FAIL")
    if last_action == "FAIL":  # giving up on a feasible task
        return 0.0
    results = _as_list(evaluator.get("result"))
    expected = _as_list(evaluator.get("expected", [None] * len(funcs)))
    options = _as_list(evaluator.get("options", [{}] * len(funcs)))
    if not (len(funcs) == len(results) == len(expected) == len(options)):
        raise EnvInputError("evaluator: func, result, expected and options differ in length")
    scores = []
    for func, res, exp, opt in zip(funcs, results, expected, options, strict=True):
        if func not in METRICS:
            raise EnvInputError(f"evaluator: unknown metric {func!r}; known: {sorted(METRICS)}")
        got = _get(client, res)
        want = _get(client, exp) if exp is not None else None
        score = METRICS[func](got, want, **(opt or {})) if want is not None else METRICS[func](got)
        scores.append(score)
        if evaluator.get("conj", "and") == "and" and score == 0.0:
            return 0.0  # no need to fetch the rest
    if evaluator.get("conj", "and") == "or":
        return max(scores)
    return sum(scores) / len(scores)


def _get(client: OSWorldClient, getter: dict[str, Any]) -> Any:
    if not isinstance(getter, dict) or getter.get("type") not in GETTERS:
        kind = getter.get("type") if isinstance(getter, dict) else getter
        raise EnvInputError(f"evaluator: unknown getter {kind!r}; known: {sorted(GETTERS)}")
    try:
        return GETTERS[getter["type"]](client, getter)
    except KeyError as e:
        raise EnvInputError(f"evaluator: getter {getter['type']!r} needs {e}") from None

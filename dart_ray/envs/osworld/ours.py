"""OSWorld-style evaluation: a getter fetches the real end state, a metric scores it.

A task's `evaluator` names `func` (a metric, or a list of them joined by `conj`), `result` (a
getter, or a list) and optionally `expected` (a getter, usually `rule`), `options` and
`postconfig` (setup steps run before the getters, by the env):

    {"func": "check_include_exclude",
     "result": {"type": "vm_command_line", "command": "cat ~/notes.txt", "shell": true},
     "expected": {"type": "rule", "rules": {"include": ["hello"], "exclude": []}}}

We implement the getters and metrics our desktop tasks use, under OSWorld's names and with
its semantics (`vm_file` gives the path of a local copy, `list_directory` the directory tree,
`exact_match` compares with `rules["expected"]` exactly): `vm_file`, `vm_command_line`,
`vm_terminal_output`, `accessibility_tree`, `list_directory`, `rule`, `exact_match`,
`check_include_exclude`, `is_in_list`, `infeasible`; plus `window_titles`, which OSWorld lacks.
`tests/envs/osworld/test_official.py` checks that OSWorld's own evaluator
(`dart_ray.envs.osworld.official`) scores our desktop suite the same. An unknown getter or
metric is an input error naming it, never a 0.
"""

from __future__ import annotations

import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dart_ray.envs.base import EnvInputError

if TYPE_CHECKING:
    from dart_ray.envs.osworld.client import OSWorldClient


def _local_copy(c: OSWorldClient, path: str, cache: Path) -> str | None:
    """OSWorld's `vm_file`: the file fetched into the evaluation's cache folder, as a path
    (None when the desktop has no such file)."""
    data = c.file(path)
    if data is None:
        return None
    local = cache / Path(path).name
    local.write_bytes(data)
    return str(local)


def _titles(c: OSWorldClient) -> list[str]:
    root = ET.fromstring(c.accessibility())
    return [w.get("name", "") for w in root.iter("window")]


GETTERS: dict[str, Callable[[OSWorldClient, dict[str, Any], Path], Any]] = {
    "vm_file": lambda c, g, cache: _local_copy(c, g["path"], cache),
    "vm_command_line": lambda c, g, cache: c.execute(g["command"], bool(g.get("shell", False)))[
        "output"
    ],
    "vm_terminal_output": lambda c, g, cache: c.terminal(),
    "accessibility_tree": lambda c, g, cache: c.accessibility(),
    "list_directory": lambda c, g, cache: c.list_directory(g["path"]),
    "window_titles": lambda c, g, cache: _titles(c),
    "rule": lambda c, g, cache: g["rules"],
}


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    """1 if the result equals `rules["expected"]` exactly (OSWorld's: no stripping)."""
    if "expected" not in rules:
        raise EnvInputError(f"exact_match: rules need 'expected' (got {sorted(rules)})")
    return float(result == rules["expected"])


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
    """Score the end state with the task's evaluator (0.0..1.0); files that getters fetch
    live in a temporary folder for the evaluation."""
    with tempfile.TemporaryDirectory(prefix="dart-eval-") as cache:
        return _evaluate(client, evaluator, last_action, Path(cache))


def _evaluate(
    client: OSWorldClient, evaluator: dict[str, Any], last_action: str | None, cache: Path
) -> float:
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
        got = _get(client, res, cache)
        want = _get(client, exp, cache) if exp is not None else None
        score = METRICS[func](got, want, **(opt or {})) if want is not None else METRICS[func](got)
        scores.append(score)
        if evaluator.get("conj", "and") == "and" and score == 0.0:
            return 0.0  # no need to fetch the rest
    if evaluator.get("conj", "and") == "or":
        return max(scores)
    return sum(scores) / len(scores)


def _get(client: OSWorldClient, getter: dict[str, Any], cache: Path) -> Any:
    if not isinstance(getter, dict) or getter.get("type") not in GETTERS:
        kind = getter.get("type") if isinstance(getter, dict) else getter
        raise EnvInputError(f"evaluator: unknown getter {kind!r}; known: {sorted(GETTERS)}")
    try:
        return GETTERS[getter["type"]](client, getter, cache)
    except KeyError as e:
        raise EnvInputError(f"evaluator: getter {getter['type']!r} needs {e}") from None

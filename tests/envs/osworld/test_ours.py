"""OSWorld-style metrics and evaluator plumbing, with hand-made results."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from dart_ray.envs.base import EnvInputError
from dart_ray.envs.osworld.ours import (
    GETTERS,
    check_include_exclude,
    evaluate,
    exact_match,
    is_in_list,
)


def test_metrics() -> None:
    # OSWorld's exact_match: rules["expected"], compared exactly (no stripping)
    assert exact_match("hello world", {"expected": "hello world"}) == 1.0
    assert exact_match("hello world\n", {"expected": "hello world"}) == 0.0
    assert exact_match(None, {"expected": ""}) == 0.0  # a missing file is not an empty file
    with pytest.raises(EnvInputError, match="exact_match: rules need 'expected'"):
        exact_match("x", {"match": "x"})
    assert check_include_exclude("a b c", {"include": ["a", "c"], "exclude": ["d"]}) == 1.0
    assert check_include_exclude("a b c d", {"include": ["a"], "exclude": ["d"]}) == 0.0
    # lists compare whole elements: Pictures/photo.png does not contain the entry photo.png
    assert check_include_exclude(["Pictures/photo.png"], {"exclude": ["photo.png"]}) == 1.0
    assert is_in_list(["x", "y"], {"expected": "y"}) == 1.0
    assert is_in_list(None, {"expected": "y"}) == 0.0


class _NoServer:
    """Evaluations below only use the `rule` getter, which needs no server."""


def test_conjunctions_and_infeasible() -> None:
    rule = lambda v: {"type": "rule", "rules": v}  # noqa: E731
    both = {
        "func": ["is_in_list", "is_in_list"],
        "result": [rule(["a"]), rule(["b"])],
        "expected": [rule({"expected": "a"}), rule({"expected": "z"})],
    }
    c = _NoServer()
    assert evaluate(c, both, "code") == 0.0  # type: ignore[arg-type]
    assert evaluate(c, both | {"conj": "or"}, "code") == 1.0  # type: ignore[arg-type]
    assert evaluate(c, {"func": "infeasible"}, "FAIL") == 1.0  # type: ignore[arg-type]
    assert evaluate(c, {"func": "infeasible"}, "DONE") == 0.0  # type: ignore[arg-type]
    # giving up on a feasible task scores 0 without looking at the state
    assert (
        evaluate(
            c,
            {
                "func": "is_in_list",
                "result": rule(["a"]),  # type: ignore[arg-type]
                "expected": rule({"expected": "a"}),
            },
            "FAIL",
        )
        == 0.0
    )


def test_unknown_parts_are_named() -> None:
    c = _NoServer()
    with pytest.raises(EnvInputError, match="unknown metric 'fuzzy'"):
        evaluate(c, {"func": "fuzzy", "result": {"type": "rule", "rules": {}}}, None)  # type: ignore[arg-type]
    with pytest.raises(EnvInputError, match="unknown getter 'vm_magic'"):
        evaluate(
            c,
            {
                "func": "exact_match",
                "result": {"type": "vm_magic"},  # type: ignore[arg-type]
                "expected": {"type": "rule", "rules": {"expected": 1}},
            },
            None,
        )
    with pytest.raises(EnvInputError, match="differ in length"):
        evaluate(c, {"func": ["exact_match"], "result": []}, None)  # type: ignore[arg-type]


class _Files:
    """A desktop with one file, `~/a.txt`, and one folder listing."""

    def file(self, path: str) -> bytes | None:
        return b"text" if path == "~/a.txt" else None

    def list_directory(self, path: str) -> dict[str, object]:
        return {"name": "home", "type": "directory", "children": [{"name": "a.txt"}]}


def test_getters_return_what_osworlds_return() -> None:
    with tempfile.TemporaryDirectory() as d:
        # vm_file: the path of a local copy (metrics that compare files open it), None if absent
        local = GETTERS["vm_file"](_Files(), {"path": "~/a.txt"}, Path(d))  # type: ignore[arg-type]
        assert Path(local).read_bytes() == b"text" and Path(local).parent == Path(d)
        assert GETTERS["vm_file"](_Files(), {"path": "~/b.txt"}, Path(d)) is None  # type: ignore[arg-type]
        # list_directory: the tree as the server sends it, not flattened
        tree = GETTERS["list_directory"](_Files(), {"path": "~"}, Path(d))  # type: ignore[arg-type]
        assert tree["children"] == [{"name": "a.txt"}]

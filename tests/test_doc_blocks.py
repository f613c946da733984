"""Every ```sql and ```python block of README.md and docs/*.md runs (the commands of the
```bash blocks: tests/test_docs.py).

Every ```python block is run (in-process, in a scratch folder; a block that uses Ray runs on
the session's local Ray under the `ray` marker), unless its first line is
`# not run: <why>`: an interface sketch or a fragment of a larger loop, which is compiled
only. The marker shows in the docs, so a reader knows which snippets to paste and run.

Every ```sql block is run against a durable log filled through the real API (on SQLite, and
on MariaDB under the `mysql` marker) and must return rows, unless it starts with
`-- expect: no rows`.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.doc_common import DOC_FILES, REPO, RUN_ID, doc_queries, populate

# --------------------------------------------------------------------------- SQL


def _grafana_queries() -> list[tuple[str, str]]:
    dash = json.loads((REPO / "cluster/grafana/dart-ray-dashboard.json").read_text())
    return [
        ("dart-ray-dashboard.json", t["rawSql"].replace("$run_id", RUN_ID))
        for p in dash["panels"]
        for t in p.get("targets", [])
        if "rawSql" in t
    ]


@pytest.mark.parametrize(("where", "query"), doc_queries() + _grafana_queries())
def test_doc_sql_runs_on_a_populated_log(where: str, query: str, engine: Engine) -> None:
    populate(engine)
    with engine.connect() as c:
        rows = c.execute(sa.text(query.rstrip(";"))).all()
    if query.startswith("-- expect: no rows"):
        assert rows == [], f"{where}: {rows}"
    else:
        assert rows, f"{where}: no rows from\n{query}"


# --------------------------------------------------------------------------- Python

NOT_RUN = "# not run: "
"""First line of a ```python block that is compiled, not run; the rest says why."""
USES_RAY = re.compile(r"^(import ray\b|from (ray|actors|serve_apps)[. ])", re.M)


def doc_snippets() -> list[tuple[str, str]]:
    """(where, code) for every ```python block, indented ones (in a list item) included."""
    out = []
    for path in DOC_FILES:
        pattern = r"^([ \t]*)```python\n(.*?)^\1```"
        for i, (_, block) in enumerate(re.findall(pattern, path.read_text(), re.M | re.S)):
            out.append((f"{path.name}, python block {i + 1}", textwrap.dedent(block)))
    return out


_SNIPPETS = doc_snippets()


def _exec_snippet(where: str, code: str) -> dict[str, Any]:
    scope: dict[str, Any] = {"__name__": "__doc_snippet__"}
    exec(compile(code, where, "exec"), scope)
    return scope


def test_every_python_block_runs_or_says_why_not() -> None:
    assert len(_SNIPPETS) >= 6
    for where, code in _SNIPPETS:
        compile(code, where, "exec")  # even a block that is not run must be Python
        if code.startswith(NOT_RUN):
            reason = code.splitlines()[0].removeprefix(NOT_RUN)
            assert len(reason.split()) >= 3, f"{where}: say why it is not run"


@pytest.mark.parametrize(
    ("where", "code"),
    [s for s in _SNIPPETS if not s[1].startswith(NOT_RUN) and not USES_RAY.search(s[1])],
)
def test_doc_python_runs(
    where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _exec_snippet(where, code)


@pytest.mark.parametrize(
    ("where", "code"),
    [s for s in _SNIPPETS if not s[1].startswith(NOT_RUN) and USES_RAY.search(s[1])],
)
def test_doc_python_runs_on_ray(
    where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_local: None
) -> None:
    """On the session's Ray (a snippet's own `ray.init(..., ignore_reinit_error=True)` is
    then a no-op); the Serve applications and actors it started are removed afterwards."""
    import ray
    from ray import serve
    from ray.actor import ActorHandle

    monkeypatch.chdir(tmp_path)
    before = _serve_apps()
    scope: dict[str, Any] = {}
    try:
        scope = _exec_snippet(where, code)
    finally:
        for v in scope.values():
            if isinstance(v, ActorHandle):
                ray.kill(v)
        for app in _serve_apps() - before:
            serve.delete(app)


def _serve_apps() -> set[str]:
    """The live Serve applications (none while Serve is not running)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        return set(serve.status().applications)
    except RayServeException:
        return set()

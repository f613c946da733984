"""cluster/grafana/dart-ray-dashboard.json is built on the metrics the code registers (read
by constructing the real metric holders against a recording stand-in for ray.util.metrics)
and on metrics Ray itself defines; the table in docs/OPERATIONS.md lists the same names."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import ray
from ray.util import metrics

from actors import control, curator, env_session, rollouter

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((REPO / "cluster" / "grafana" / "dart-ray-dashboard.json").read_text())


def _exprs() -> list[str]:
    return [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"] if "expr" in t]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Prometheus names of every metric our actors register: `ray_` + name, and `_total`
    after a counter's name unless it has it (what Ray's exporter writes)."""
    names: set[str] = set()

    def recorder(kind: str) -> type:
        class Recorder:
            def __init__(self, name: str, *args: object, **kwargs: object) -> None:
                total = kind == "Counter" and not name.endswith("_total")
                names.add(f"ray_{name}" + ("_total" if total else ""))

            def set_default_tags(self, tags: dict[str, str]) -> None:
                pass

        return Recorder

    for kind in ("Counter", "Gauge", "Histogram"):
        monkeypatch.setattr(metrics, kind, recorder(kind))
    for holder in METRIC_HOLDERS.values():
        holder()
    return names


METRIC_HOLDERS = {
    "actors/rollouter.py": lambda: rollouter._Metrics("run"),
    "actors/env_session.py": lambda: env_session._Metrics("session", "minidesk"),
    "actors/curator.py": lambda: curator._BufferMetrics("run"),
    "actors/control.py": lambda: control._TrainerMetrics("run"),
}


def test_every_module_with_metrics_is_read() -> None:
    """A module that starts using ray.util.metrics must be added to METRIC_HOLDERS."""
    users = {
        str(p.relative_to(REPO))
        for d in ("actors", "dart_ray", "serve_apps")
        for p in (REPO / d).rglob("*.py")
        if re.search(r"from ray\.util import metrics|ray\.util\.metrics", p.read_text())
    }
    assert users == set(METRIC_HOLDERS)


def test_the_json_is_what_the_builder_writes() -> None:
    spec = importlib.util.spec_from_file_location(
        "build_dashboard", REPO / "cluster" / "grafana" / "build_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.OUT.read_text() == builder.render(), (
        "regenerate: python cluster/grafana/build_dashboard.py"
    )


def test_every_dart_metric_on_the_dashboard_is_registered(registered: set[str]) -> None:
    used = {m for e in _exprs() for m in re.findall(r"\bray_dart_\w+", e)}
    assert used and used <= registered
    assert registered - used == set(), "a registered metric has no panel"


def test_rays_own_metrics_on_the_dashboard_exist_in_ray() -> None:
    ray_dir = Path(ray.__file__).parent
    source = "\n".join(
        p.read_text(errors="replace")
        for sub in ("serve", "dashboard", "_private")
        for p in (ray_dir / sub).rglob("*.py")
    )
    own = {
        m
        for e in _exprs()
        for m in re.findall(r"\bray_(?!dart_)\w+", e)
        if not m.startswith("ray_dart_")
    }
    assert own
    for m in own:
        bare = re.sub(r"_(bucket|count|sum)$", "", m.removeprefix("ray_"))
        assert f'"{bare}"' in source, f"{m}: Ray defines no metric {bare!r}"


def test_the_operations_doc_lists_the_same_metrics(registered: set[str]) -> None:
    doc = (REPO / "docs" / "OPERATIONS.md").read_text()
    assert set(re.findall(r"^\| `(ray_dart_\w+)`", doc, re.M)) == registered


def test_panels_and_variables_fit_together() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    for p in DASHBOARD["panels"]:
        uid = p["datasource"]["uid"]
        assert uid.startswith("${") and uid[2:-1] in variables
        assert {"h", "w", "x", "y"} <= set(p["gridPos"])
        for t in p["targets"]:
            for ref in re.findall(r"\$(\w+)", t.get("expr", "") + t.get("rawSql", "")):
                assert ref in variables

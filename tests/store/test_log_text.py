"""The durable log stores any text verbatim on SQLite and MariaDB: ids and messages that look
like SQL, any Unicode, case-sensitive ids, runs kept apart."""

from __future__ import annotations

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.store.log import DurableLog
from dart_ray.store.runs import get_run, register_run
from tests.factories import make_trajectory
from tests.store.log_support import events, fill

SQL_LIKE = [
    "x'); DROP TABLE rollout_run; -- \\ \" `tick` % _ \u00e9\u4e2d\U0001f600",
    "'; DROP TABLE rollout_run; --",
    '" OR "1"="1',
    "' OR 1=1 #",
    "1; DELETE FROM task_stats WHERE 1=1",
    "Robert'); DROP TABLE checkpoint;--",
    "\\'; SELECT SLEEP(5); -- \\",
    "%' AND task_id LIKE '%",
    "_%_",
    "\\\\\\",
    "NULL",
    "\x00 nul \x1a ctrl-z \t tab \n newline \r cr",
    "\u202e rtl \ufeff bom \u2028 line-sep",
    "\U0001d566\U0001d55f\U0001d55a \U0001f600 \u4e2d\u6587 e\u0301",
    "$(rm -rf ~) `id` ${HOME}",
]


def _round_trip(log: DurableLog, engine: Engine, texts: list[str], run_id: str) -> None:
    """Append trajectories whose ids, task ids, instructions and URIs are `texts`; every read
    path (rows, claims, task statistics, outcomes, usage events) returns them verbatim."""
    items = [
        (
            make_trajectory(f"{t}#{i}", run_id=run_id, task_id=t, instruction=t, reward=1.0),
            f"/b/{t}",
        )
        for i, t in enumerate(texts)
    ]
    assert log.append_many(items) == len(texts)
    by_id = {f"{t}#{i}": t for i, t in enumerate(texts)}
    rows = log.get_rows(run_id, list(by_id))
    assert {(r.trajectory_id, r.task_id, r.instruction, r.uri) for r in rows} == {
        (tid, t, t, f"/b/{t}") for tid, t in by_id.items()
    }
    claim = log.claim(run_id, len(texts) + 5, consumer="c'; --", lease_s=60)
    assert sorted((r.trajectory_id, r.task_id, r.instruction) for r in claim.rows) == sorted(
        (tid, t, t) for tid, t in by_id.items()
    )
    assert claim.consumer == "c'; --"
    stats = {s.task_id: s for s in log.task_stats(run_id)}
    assert set(stats) == set(texts)
    for i, t in enumerate(texts):
        assert (stats[t].attempts, stats[t].successes) == (texts.count(t), texts.count(t))
        assert stats[t].last_success_uri == f"/b/{t}"
        assert stats[t].last_success_trajectory_id in {
            f"{t}#{j}" for j, u in enumerate(texts) if u == t
        }
        assert log.recent_outcomes(run_id, t, 10) == [1.0] * texts.count(t), i
    assert log.ack(claim) == len(texts)
    assert sum(events(engine, "ACK", run_id).values()) == len(texts)
    assert sum(log.buffer(run_id).values()) == len(texts)


def test_text_that_looks_like_sql_is_stored_verbatim(log: DurableLog, engine: Engine) -> None:
    _round_trip(log, engine, SQL_LIKE, "run-a")
    # a run id that looks like SQL is just as inert in every other table
    register_run(engine, "run-b'; --", "name'); DROP TABLE run; --", {"x": "'; --"})
    got = get_run(engine, "run-b'; --")
    assert got is not None and (got.name, got.config) == (
        "name'); DROP TABLE run; --",
        {"x": "'; --"},
    )
    reg = CheckpointRegistry(engine)
    cid = reg.create("run-b'; --", 1, config_yaml='a: "\'; DROP TABLE checkpoint; --"\n')
    reg.start(cid)
    reg.fail(cid, "x'); DELETE FROM checkpoint; --")
    [row] = reg.list("run-b'; --")
    assert (row.run_id, row.error) == ("run-b'; --", "x'); DELETE FROM checkpoint; --")
    with engine.connect() as c:
        assert set(sa.inspect(c).get_table_names()) >= {
            "rollout_run",
            "checkpoint",
            "run",
            "task_stats",
        }


_ids = st.text(min_size=1, max_size=40).filter(lambda s: s == s.strip())
_runs = iter(range(10**9))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_ids, min_size=1, max_size=4))
def test_any_text_round_trips(log: DurableLog, engine: Engine, texts: list[str]) -> None:
    _round_trip(log, engine, texts, f"run-h{next(_runs)}")


def test_ids_are_case_sensitive(log: DurableLog) -> None:
    assert log.append(make_trajectory("Traj"), "/b/1")
    assert log.append(make_trajectory("traj"), "/b/2")  # a different trajectory, not a duplicate
    assert len(log.get_rows("run-a", ["Traj", "traj"])) == 2


def test_runs_are_isolated(log: DurableLog) -> None:
    fill(log, 3, run_id="run-a")
    fill(log, 3, run_id="run-b")
    assert len(log.claim("run-b", 10, consumer="c", lease_s=60)) == 3
    assert len(log.claim("run-a", 10, consumer="c", lease_s=60)) == 3

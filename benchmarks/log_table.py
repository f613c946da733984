"""The table and the baseline of the log benchmark: a realistic `rollout_run` filled
server-side, and DART-GUI's batch assembly reproduced on it (see log_claim.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.pool import NullPool

from dart_ray.store.db import create_engine, init_schema

RUN_A = "results/bench_pass8_gpu8_env64_maxstep30_20250902_2305"
RUN_B = "results/bench_pass8_gpu8_env64_maxstep30_20250826_1854"
N_TASKS = 40
N_VERSIONS = 20
OTHER_RUN_EVERY = 11  # every 11th row belongs to RUN_B: RUN_B has 10% as many rows as RUN_A
SEQ_CHUNK = 100_000  # rows per INSERT ... SELECT
INSTRUCTIONS = (
    "Open the spreadsheet on the desktop and sum column B into cell B20",
    "Change the default search engine of Chrome to Bing and restart the browser",
    "In the terminal, find all .log files larger than 1MB under /var and list them",
    "Insert a page number in the footer of the open LibreOffice Writer document",
    "Mute the notifications of the chat application for the next eight hours please",
)


# --------------------------------------------------------------------------- helpers


def ms(seconds: list[float]) -> dict[str, float | int]:
    a = np.asarray(seconds) * 1000.0
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "n": len(a)}


@contextmanager
def timer(into: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    into[name] = into.get(name, 0.0) + time.perf_counter() - t0


def fresh_database(server: URL, name: str) -> Engine:
    """Drop and recreate database `name`, build the schema, and return an engine on it."""
    admin = sa.create_engine(server, poolclass=NullPool)
    with admin.begin() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        c.exec_driver_sql(
            f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
        )
    admin.dispose()
    engine = create_engine(server.set(database=name))
    init_schema(engine)
    return engine


# --------------------------------------------------------------------------- fill

# One chunk of rows for positions g in [base, base + 100k) of `total`; `t` is the task (40),
# `v` the version (20, rising with g as a real run's would), `h` a per-row hash for ids.
_FILL_SQL = """
INSERT INTO rollout_run (run_id, trajectory_id, task_id, trace_id, uri, reward, num_steps,
                         status, state, used, model_version, version_num, instruction)
SELECT r.run_id,
       CONCAT(r.task, '_trace_', LEFT(r.h, 12), '_', 1755501336 + r.g),
       r.task,
       CONCAT(r.task, '_trace_', LEFT(r.h, 12)),
       CONCAT('s3://dart-rollouts/', IF(r.run_id = :run_a, 'a', 'b'), '/v', r.v, '/',
              LEFT(r.h, 24), '/traj.parquet'),
       IF(MOD(CONV(SUBSTR(r.h, 13, 4), 16, 10), 100) < 10 + 12 * MOD(r.t, 7), 1.0, 0.0),
       1 + MOD(CONV(SUBSTR(r.h, 17, 4), 16, 10), 30),
       'OK', 0, 0, CONCAT('v', r.v), r.v,
       CONCAT(ELT(1 + MOD(r.t, 5), :i0, :i1, :i2, :i3, :i4), ' (task ', r.t, ')')
FROM (
    SELECT q.g, q.t, q.h,
           IF(MOD(q.g, :every) = :every - 1, :run_b, :run_a) AS run_id,
           q.g * :versions DIV :total AS v,
           CONCAT_WS('-', SUBSTR(q.m, 1, 8), SUBSTR(q.m, 9, 4), SUBSTR(q.m, 13, 4),
                     SUBSTR(q.m, 17, 4), SUBSTR(q.m, 21, 12)) AS task
    FROM (
        SELECT s.n + :base AS g,
               MOD(CRC32(CONCAT('t', s.n + :base)), :tasks) AS t,
               MD5(CONCAT('task-', MOD(CRC32(CONCAT('t', s.n + :base)), :tasks))) AS m,
               MD5(s.n + :base) AS h
        FROM bench_seq s
        WHERE s.n + :base < :total
    ) q
) r
"""


def fill(engine: Engine, n_run: int) -> dict[str, Any]:
    """Put `n_run` rows of RUN_A (and n_run/10 of RUN_B, interleaved) in `rollout_run`."""
    total = n_run * OTHER_RUN_EVERY // (OTHER_RUN_EVERY - 1)
    digits = ", ".join(f"bench_digits d{i}" for i in range(5))
    seq = " + ".join(f"{10**i} * d{i}.d" for i in range(5))
    t0 = time.perf_counter()
    with engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE bench_digits (d INT NOT NULL PRIMARY KEY)")
        c.exec_driver_sql(
            f"INSERT INTO bench_digits VALUES {','.join(f'({i})' for i in range(10))}"
        )
        c.exec_driver_sql("CREATE TABLE bench_seq (n INT NOT NULL PRIMARY KEY)")
        c.exec_driver_sql(f"INSERT INTO bench_seq SELECT {seq} FROM {digits}")
    params: dict[str, Any] = {
        "run_a": RUN_A,
        "run_b": RUN_B,
        "every": OTHER_RUN_EVERY,
        "versions": N_VERSIONS,
        "tasks": N_TASKS,
        "total": total,
        **{f"i{i}": s for i, s in enumerate(INSTRUCTIONS)},
    }
    for base in range(0, total, SEQ_CHUNK):
        with engine.begin() as c:
            c.execute(sa.text(_FILL_SQL), {**params, "base": base})
    fill_s = time.perf_counter() - t0
    with engine.begin() as c:
        c.exec_driver_sql("DROP TABLE bench_seq, bench_digits")
        c.exec_driver_sql("ANALYZE TABLE rollout_run").all()
        counts = dict(
            c.exec_driver_sql("SELECT run_id, COUNT(*) FROM rollout_run GROUP BY run_id").all()
        )
    if counts.get(RUN_A) != n_run:
        raise RuntimeError(f"fill: expected {n_run} rows of {RUN_A}, got {counts}")
    return {"fill_s": fill_s, "analyze_s": time.perf_counter() - t0 - fill_s, "rows": counts}


def dart_gui_pick(df: pd.DataFrame, rng: np.random.RandomState) -> list[int]:
    """DART-GUI's selection: unused rows of the 2 newest versions, reward != -1, tasks with
    >= 8 of them and mean reward in [0, 1), 8 rows each from up to 8 tasks."""
    top_mvs = {f"v{v}" for v in sorted(df["version_num"].unique())[-2:]}
    cand = df[(df["used"] == 0) & df["model_version"].isin(top_mvs) & (df["reward"] != -1)]
    chosen: list[pd.DataFrame] = []
    for _, group in cand.groupby("task_id", sort=False):
        if len(group) < 8 or not 0 <= group["reward"].mean() < 1:
            continue
        chosen.append(group.sample(8, random_state=rng))
        if len(chosen) == 8:
            break
    return [int(i) for i in pd.concat(chosen)["id"]]


def dart_gui_batch(engine: Engine, rng: np.random.RandomState) -> dict[str, float]:
    """One batch assembly: read the whole run, pick 64 rows, one UPDATE + commit per row."""
    phases: dict[str, float] = {}
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        with timer(phases, "read"):
            cur.execute("SELECT * FROM rollout_run WHERE run_id=%s", (RUN_A,))
            columns = [d[0] for d in cur.description]
            df = pd.DataFrame(cur.fetchall(), columns=columns)
        with timer(phases, "select"):
            ids = dart_gui_pick(df, rng)
        with timer(phases, "update"):
            for row_id in ids:
                cur.execute("UPDATE rollout_run SET used = used + 1 WHERE id = %s", (row_id,))
                if cur.rowcount != 1:
                    raise RuntimeError(f"UPDATE of row {row_id} matched {cur.rowcount} rows")
                raw.commit()
    finally:
        raw.close()
    if len(ids) != 64:
        raise RuntimeError(f"DART-GUI pick returned {len(ids)} rows, wanted 64")
    phases["total"] = phases["read"] + phases["select"] + phases["update"]
    phases["rows_read"] = float(len(df))
    return phases


def bench_dart_gui(engine: Engine, repeats: int, budget_s: float) -> dict[str, Any]:
    """Up to `repeats` batch assemblies; stops early (after at least 3) past `budget_s`."""
    rng = np.random.RandomState(0)
    reps: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while len(reps) < repeats and (len(reps) < 3 or time.perf_counter() - t0 < budget_s):
        reps.append(dart_gui_batch(engine, rng))
    with engine.connect() as c:
        twice = c.execute(sa.text("SELECT COUNT(*) FROM rollout_run WHERE used > 1")).scalar()
    if twice:
        raise RuntimeError(f"{twice} rows were marked used twice")
    out: dict[str, Any] = {f"{k}_ms": ms([r[k] for r in reps]) for k in reps[0] if k != "rows_read"}
    out["rows_read"] = int(reps[0]["rows_read"])
    out["reps"] = reps
    return out

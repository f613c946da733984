"""How fast a trainer gets its next batch out of the durable log as the run's table grows.

DART-GUI assembles a training batch by polling every 30 s: it reads *every* row of the run
from `rollout_run` into Python, filters in memory (`used == 0`, one of the 2 newest model
versions, reward != -1), groups by task, keeps tasks with >= 8 rollouts, picks 8 x 8 rows and
then marks each chosen row `used += 1` with its own UPDATE and commit. The read grows
linearly with the run: a run that logs ~10 rollouts/s reaches 1M rows in about a day.

`DurableLog.claim` is meant to follow the index `ix_rollout_run_claim` (run_id, state,
version_num, id): equality on (run_id, state), a range on version_num, and the ORDER BY is the
index order, so that InnoDB reads and locks just the n rows it returns, whatever the table
size. The script checks that it does, by counting the index entries the claim steps over.

This script measures, on MariaDB, in one run:

1. For each table size (the run's rows; another run adds 10% more rows so the run filter
   matters), filled server-side with INSERT ... SELECT over a sequence table:
   the claim of `--batch` rows (claim timed alone, ack separately); its SELECT's plan, the
   index entries one execution steps over (Handler_* counters) and its time, as `DurableLog`
   sends it and with FORCE INDEX (MariaDB may drop the version range for `ref` on
   (run_id, state), which steps over every older available row); and DART-GUI's batch
   assembly on the same table (read, select in pandas, per-row UPDATEs).
2. Append throughput on a fresh table: a new connection per trajectory (NullPool), pooled
   `append` of one trajectory, pooled `append_many` of 256.

The DART-GUI side is reproduced favourably to it: its release reads through ORM objects and
`to_dict()` per row, which is slower than the raw cursor used here, and the success-replay
step it runs on the frame is left out. The ratios reported are therefore lower bounds.

    .venv/bin/python benchmarks/log_claim.py [--rows 100000 1000000] [--dsn mysql+pymysql://...]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd
import sqlalchemy as sa
from harness import Bench, console, parser, table
from log_table import (
    INSTRUCTIONS,
    N_TASKS,
    N_VERSIONS,
    RUN_A,
    bench_dart_gui,
    fill,
    fresh_database,
    ms,
)
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

from dart_ray.records import Trajectory
from dart_ray.store.db import create_engine
from dart_ray.store.log import DurableLog
from dart_ray.testing.mariadb import TemporaryMariaDB

# --------------------------------------------------------------------------- claim


def _handler_reads(c: sa.Connection) -> dict[str, int]:
    rows = c.exec_driver_sql("SHOW SESSION STATUS LIKE 'Handler%%'").all()
    return {str(k): int(v) for k, v in rows if str(k).startswith(("Handler_read", "Handler_icp"))}


def _probe(c: sa.Connection, sql: str, repeats: int = 5) -> dict[str, Any]:
    """EXPLAIN `sql`, count the index entries one execution steps over, and time it."""
    plan = [dict(r._mapping) for r in c.exec_driver_sql(f"EXPLAIN {sql}")]
    before = _handler_reads(c)
    returned = len(c.exec_driver_sql(sql).all())
    after = _handler_reads(c)
    reads = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c.exec_driver_sql(sql).all()
        times.append(time.perf_counter() - t0)
    extra = " ".join(str(p.get("Extra") or "") for p in plan).lower()
    return {
        "sql": sql,
        "explain": plan,
        "key": [p.get("key") for p in plan],
        "access_type": [p.get("type") for p in plan],
        "uses_claim_index": [p.get("key") for p in plan] == ["ix_rollout_run_claim"],
        "filesort": "filesort" in extra,
        "rows_returned": returned,
        # Entries the index scan stepped over: those returned (Handler_read_*) plus those that
        # index condition pushdown rejected inside InnoDB, which neither Handler_read_next nor
        # ANALYZE's r_rows count (MariaDB's Handler_icp_attempts - Handler_icp_match).
        "handler_reads": reads,
        "index_entries_read": sum(v for k, v in reads.items() if k.startswith("Handler_read"))
        + reads.get("Handler_icp_attempts", 0)
        - reads.get("Handler_icp_match", 0),
        "select_ms": ms(times),
    }


def explain_claim(engine: Engine, log: DurableLog, batch: int, min_version: int) -> dict[str, Any]:
    """Probe the claim's SELECT as `DurableLog` sends it, and the same with FORCE INDEX.

    MariaDB may trade the range (run_id, state, version_num >= v) for `ref` on (run_id, state)
    when it checks that the index gives the ORDER BY for free; the scan then steps over every
    available row older than v. The forced variant shows what the range costs."""
    query = log.claim_query(RUN_A, batch, min_version)
    sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    sql = " ".join(sql.split())
    hint = "FORCE INDEX (ix_rollout_run_claim)"
    forced = sql if hint in sql else sql.replace(" FROM rollout_run ", f" FROM rollout_run {hint} ")
    with engine.begin() as c:
        as_sent = _probe(c, sql)
        if "mariadb" in str(c.exec_driver_sql("SELECT VERSION()").scalar()).lower():
            as_sent["analyze"] = [dict(r._mapping) for r in c.exec_driver_sql(f"ANALYZE {sql}")]
        as_sent["force_index"] = _probe(c, forced)
    return as_sent


def bench_claims(log: DurableLog, batch: int, repeats: int, min_version: int) -> dict[str, Any]:
    """`repeats` x (claim `batch` rows, then ack them); the first, warm-up pair is not timed."""

    def claim_once() -> tuple[float, float]:
        t0 = time.perf_counter()
        claim = log.claim(RUN_A, batch, consumer="bench", lease_s=600, min_version=min_version)
        t1 = time.perf_counter()
        if len(claim) != batch or min(r.version_num for r in claim.rows) < min_version:
            raise RuntimeError(f"claim returned {len(claim)} rows, wanted {batch}")
        log.ack(claim)
        return t1 - t0, time.perf_counter() - t1

    claim_once()
    timings = [claim_once() for _ in range(repeats)]
    claim_s = [c for c, _ in timings]
    ack_s = [a for _, a in timings]
    return {"claim_ms": ms(claim_s), "ack_ms": ms(ack_s), "claim_s": claim_s, "ack_s": ack_s}


# --------------------------------------------------------------------------- DART-GUI


# --------------------------------------------------------------------------- appends


def _factory() -> Callable[..., Trajectory]:
    from tests.factories import make_trajectory

    return make_trajectory


def _items(
    make_trajectory: Callable[..., Trajectory], prefix: str, n: int
) -> list[tuple[Trajectory, str]]:
    out: list[tuple[Trajectory, str]] = []
    for i in range(n):
        tid = f"{prefix}-{i:07d}"
        traj = make_trajectory(
            tid,
            run_id=RUN_A,
            task_id=f"task-{i % N_TASKS:02d}",
            reward=float(i % 3 == 0),
            version=i // 1000,
            n_steps=2,
            instruction=INSTRUCTIONS[i % len(INSTRUCTIONS)],
        )
        out.append((traj, f"s3://dart-rollouts/a/v{i // 1000}/{tid}/traj.parquet"))
    return out


def bench_appends(
    engine: Engine,
    counts: tuple[int, int, int],
    batch: int,
    make_trajectory: Callable[..., Trajectory],
) -> dict[str, Any]:
    """rows/s of (a) a new connection per append, (b) pooled append, (c) pooled append_many."""
    per_conn = sa.create_engine(
        engine.url,
        poolclass=NullPool,
        isolation_level="READ COMMITTED",
        connect_args={"charset": "utf8mb4"},
    )
    pooled = DurableLog(engine)
    modes: list[tuple[str, DurableLog, int, int]] = [
        ("new connection per append", DurableLog(per_conn), counts[0], 1),
        ("pooled append", pooled, counts[1], 1),
        (f"pooled append_many({batch})", pooled, counts[2], batch),
    ]
    out: dict[str, Any] = {}
    for i, (name, log, n, size) in enumerate(modes):
        items = _items(make_trajectory, f"m{i}", n)
        t0 = time.perf_counter()
        for j in range(0, n, size):
            chunk = items[j : j + size]
            new = log.append(*chunk[0]) if size == 1 else log.append_many(chunk)
            if int(new) != len(chunk):
                raise RuntimeError(f"{name}: an append was not new")
        seconds = time.perf_counter() - t0
        out[name] = {"rows": n, "batch": size, "seconds": seconds, "rows_per_s": n / seconds}
    per_conn.dispose()
    base = next(iter(out.values()))["rows_per_s"]
    for v in out.values():
        v["vs_new_connection"] = v["rows_per_s"] / base
    return out


# --------------------------------------------------------------------------- run and report


def machine_info(engine: Engine) -> dict[str, Any]:
    with engine.connect() as c:
        server = dict(
            c.exec_driver_sql(
                "SELECT VERSION() AS version, @@innodb_buffer_pool_size AS buffer_pool_bytes, "
                "@@innodb_flush_log_at_trx_commit AS flush_log_at_trx_commit, "
                "@@innodb_log_file_size AS log_file_size_bytes"
            )
            .one()
            ._mapping
        )
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "sqlalchemy": sa.__version__,
        "server": {k: (int(v) if isinstance(v, int) else str(v)) for k, v in server.items()},
    }


def bench_size(server: URL, args: argparse.Namespace, n_run: int) -> dict[str, Any]:
    engine = fresh_database(server, args.database)
    try:
        console().log(f"{n_run:,} rows: filling")
        filled = fill(engine, n_run)
        console().log(f"{n_run:,} rows: filled in {filled['fill_s']:.1f} s; claims")
        log = DurableLog(engine)
        min_version = N_VERSIONS - 1 - 2
        plan = explain_claim(engine, log, args.batch, min_version)
        claims = bench_claims(log, args.batch, args.claims, min_version)
        console().log(f"{n_run:,} rows: DART-GUI batch assembly")
        dart = bench_dart_gui(engine, args.dart_reps, args.dart_budget_s)
    finally:
        engine.dispose()
    return {
        "n_run_rows": n_run,
        "n_table_rows": sum(filled["rows"].values()),
        "fill": filled,
        "claim_plan": plan,
        "claim": claims,
        "dart_gui": dart,
        "dart_gui_over_claim": dart["total_ms"]["median"] / claims["claim_ms"]["median"],
    }


def summarize(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    first, last = sizes[0], sizes[-1]

    def growth(key: str, metric: str) -> float:
        return last[key][metric]["median"] / first[key][metric]["median"]

    return {
        "from_rows": first["n_run_rows"],
        "to_rows": last["n_run_rows"],
        "table_growth": last["n_run_rows"] / first["n_run_rows"],
        "claim_growth": growth("claim", "claim_ms"),
        "dart_gui_growth": growth("dart_gui", "total_ms"),
        "dart_gui_over_claim": {s["n_run_rows"]: s["dart_gui_over_claim"] for s in sizes},
    }


def report(results: dict[str, Any]) -> None:
    sizes = results["sizes"]
    t = table(f"Next batch of {results['args']['batch']} rows: claim vs DART-GUI poll",
              ("run rows", "table rows", "fill s", "claim med ms", "claim p90 ms", "ack med ms",
               "DART-GUI med ms", "read / select / update ms", "reps", "DART-GUI / claim"))  # fmt: skip
    for s in sizes:
        c, d = s["claim"], s["dart_gui"]
        t.add_row(
            f"{s['n_run_rows']:,}",
            f"{s['n_table_rows']:,}",
            f"{s['fill']['fill_s']:.1f}",
            f"{c['claim_ms']['median']:.2f}",
            f"{c['claim_ms']['p90']:.2f}",
            f"{c['ack_ms']['median']:.2f}",
            f"{d['total_ms']['median']:,.0f}",
            " / ".join(f"{d[k]['median']:,.0f}" for k in ("read_ms", "select_ms", "update_ms")),
            str(d["total_ms"]["n"]),
            f"{s['dart_gui_over_claim']:,.0f}x",
        )
    console().print(t)
    sm = results["summary"]
    console().print(
        f"{sm['from_rows']:,} -> {sm['to_rows']:,} rows ({sm['table_growth']:.0f}x): claim median "
        f"x{sm['claim_growth']:.2f}, DART-GUI median x{sm['dart_gui_growth']:.2f}"
    )
    cols = ("type", "key", "key_len", "ref", "rows", "Extra")
    e = table("Claim SELECT: plan (EXPLAIN), index entries read (Handler_*), time",
              ("run rows", "variant", *cols, "entries read", "SELECT med ms", "filesort"), "left")  # fmt: skip
    for s in sizes:
        for variant, p in (
            ("as sent", s["claim_plan"]),
            ("FORCE INDEX", s["claim_plan"]["force_index"]),
        ):
            row = p["explain"][0]
            e.add_row(
                f"{s['n_run_rows']:,}",
                variant,
                *(str(row.get(k)) for k in cols),
                f"{p['index_entries_read']:,}",
                f"{p['select_ms']['median']:.2f}",
                str(p["filesort"]),
            )
    console().print(e)
    console().print(f"[dim]claim SQL as sent: {sizes[0]['claim_plan']['sql']}[/]")
    for s in sizes:
        p, batch = s["claim_plan"], results["args"]["batch"]
        ok = p["uses_claim_index"] and not p["filesort"] and p["index_entries_read"] <= 2 * batch
        console().print(
            f"[{'green' if ok else 'red'}]{'OK' if ok else 'SCANS'} at {s['n_run_rows']:,} rows: "
            f"key {p['key']}, "
            f"type {p['access_type']}, filesort={p['filesort']}, "
            f"{p['index_entries_read']:,} index entries read for {p['rows_returned']} rows[/]"
        )
    a = table("Appends (fresh table)", ("mode", "rows", "seconds", "rows/s", "vs new connection"))
    for name, v in results["appends"].items():
        a.add_row(
            name,
            f"{v['rows']:,}",
            f"{v['seconds']:.2f}",
            f"{v['rows_per_s']:,.0f}",
            f"{v['vs_new_connection']:.1f}x",
        )
    console().print(a)


@contextmanager
def server_url(args: argparse.Namespace) -> Iterator[URL]:
    if args.dsn:
        yield make_url(args.dsn).set(database=None)
        return
    with TemporaryMariaDB(buffer_pool=args.buffer_pool) as db:
        yield make_url(db.url)


def parse_args(argv: list[str] | None) -> Bench:
    p = parser(__doc__, "log_claim")
    p.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--claims", type=int, default=30, help="timed claims per size")
    p.add_argument("--batch", type=int, default=64, help="rows per claim")
    p.add_argument("--dart-reps", type=int, default=5, help="DART-GUI batch assemblies per size")
    p.add_argument("--dart-budget-s", type=float, default=60.0, help="stop after 3 reps past it")
    p.add_argument("--appends", type=int, nargs=3, default=[200, 1000, 20_000])
    p.add_argument("--append-batch", type=int, default=256)
    p.add_argument("--dsn", help="an existing server (default: a temporary MariaDB)")
    p.add_argument("--database", default="dart_ray_bench", help="dropped and recreated!")
    p.add_argument("--buffer-pool", default="1G", help="of the temporary MariaDB")
    return Bench.start(p, argv)


def main(argv: list[str] | None = None) -> int:
    bench = parse_args(argv)
    args = bench.args
    make_trajectory = _factory()  # now, with the rest of the code, not minutes later
    results: dict[str, Any] = {**bench.meta}
    with server_url(args) as server:
        admin = create_engine(server)
        results["machine"] = machine_info(admin)
        results["sizes"] = [bench_size(server, args, n) for n in args.rows]
        console().log("appends")
        engine = fresh_database(server, args.database)
        try:
            results["appends"] = bench_appends(
                engine, tuple(args.appends), args.append_batch, make_trajectory
            )
        finally:
            engine.dispose()
            with admin.begin() as c:
                c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{args.database}`")
            admin.dispose()
    results["summary"] = summarize(results["sizes"])
    report(results)
    bench.write(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

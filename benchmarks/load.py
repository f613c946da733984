"""Load: the policy server under many concurrent HTTP clients, the durable log under many
concurrent writers and claimers. Loopback only, bounded in count and time.

1. Policy: the Serve application (HF engine, the tiny warm start in `fixtures/tiny-sft`) on
   127.0.0.1, `--clients` asyncio clients (default 64) posting OpenAI-style chat requests with
   a screenshot to its HTTP route for `--minutes`, while the trainer's path publishes a new
   weight version every `--update-every` seconds. Reported: requests, errors (any non-200 or
   transport failure), latency p50/p90/p99/max, requests/s, the versions answered.
2. Log: on MariaDB (a private server started for the run, or `--dsn`), `--writers` processes
   (default 8) append `--rows` trajectories between them, in batches of 1-8, while
   `--claimers` processes (default 4) claim and acknowledge until every row is consumed.
   Checked from the database: every row written is there once, consumed once, with exactly
   one ACK event. Reported: rows/s appended and acknowledged.

Exits 1 if any request failed or any row was lost or doubled. Prints a table, writes JSON to
benchmarks/results/load.json.

    .venv/bin/python benchmarks/load.py                       # 64 clients x 3 min, 8+4 x 20k rows
    .venv/bin/python benchmarks/load.py --minutes 0.5 --rows 4000   # the slow test's size
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import statistics
import sys
import time
from collections import Counter
from typing import Any

from harness import REPO_ROOT, Bench, console, local_ray, parser, table


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# --------------------------------------------------------------------------- policy


def _screenshot_b64() -> str:
    import io

    from PIL import Image, ImageDraw

    im = Image.new("RGB", (112, 112), (235, 235, 240))
    ImageDraw.Draw(im).rectangle((30, 60, 70, 80), fill=(40, 120, 200))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


async def _hammer(url: str, clients: int, seconds: float) -> dict[str, Any]:
    import aiohttp

    body = {
        "model": "tiny",
        "max_tokens": 24,
        "temperature": 1.0,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Click the blue button."},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{_screenshot_b64()}"},
                    },
                ],
            }
        ],
    }
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    versions: Counter[int] = Counter()
    end = time.perf_counter() + seconds
    timeout = aiohttp.ClientTimeout(total=120)

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                async with session.post(url, json=body) as r:
                    payload = await r.json(content_type=None)
                    if r.status != 200:
                        errors[f"HTTP {r.status}: {str(payload)[:80]}"] += 1
                        continue
                    versions[int(payload["weight_version"])] += 1
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError) as e:
                errors[f"{type(e).__name__}: {str(e)[:80]}"] += 1
                continue
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "wall_s": wall,
        "requests": len(latencies),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "requests_per_s": len(latencies) / wall,
        "latency_s": {
            "p50": _pct(latencies, 0.50),
            "p90": _pct(latencies, 0.90),
            "p99": _pct(latencies, 0.99),
            "max": max(latencies, default=0.0),
            "mean": statistics.fmean(latencies) if latencies else 0.0,
        },
        "versions_answered": {str(k): v for k, v in sorted(versions.items())},
    }


def bench_policy(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from dart_ray.config import PolicyConfig
    from dart_ray.models.loading import load_model
    from dart_ray.models.weights import pack
    from dart_ray.testing.raycluster import free_port
    from serve_apps.policy import run_policy

    port = free_port()
    cfg = PolicyConfig(http_host="127.0.0.1", http_port=port, max_batch_size=16)
    model_dir = REPO_ROOT / "fixtures" / "tiny-sft"
    with local_ray():
        handle = run_policy(cfg, model_dir, name="load", route_prefix="/load")
        state = {k: v.detach().clone() for k, v in load_model(model_dir).state_dict().items()}
        updates: list[float] = []

        async def publish_forever(stop: asyncio.Event) -> None:
            version = 0
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), timeout=args.update_every)
                except TimeoutError:
                    version += 1
                    ref = ray.put(pack(state))
                    t0 = time.perf_counter()
                    await handle.update_weights.remote(version, [ref])
                    updates.append(time.perf_counter() - t0)

        async def go() -> dict[str, Any]:
            stop = asyncio.Event()
            pub = asyncio.create_task(publish_forever(stop))
            url = f"http://127.0.0.1:{port}/load/v1/chat/completions"
            out = await _hammer(url, args.clients, args.minutes * 60)
            stop.set()
            await pub
            return out

        result = asyncio.run(go())
        result["weight_updates"] = len(updates)
        result["weight_update_s_max"] = max(updates, default=0.0)
        return result


# --------------------------------------------------------------------------- log


def _writer(dsn: str, run_id: str, index: int, n: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    import random

    from dart_ray.records import Action, ActionKind, Status, Step, Task, Trajectory
    from dart_ray.store.db import RetryPolicy, create_engine
    from dart_ray.store.log import DurableLog

    log = DurableLog(create_engine(dsn, pool_size=2), retry=RetryPolicy(retries=20))
    rng = random.Random(index)
    written, i = 0, 0
    while i < n:
        batch = []
        for _ in range(min(rng.randint(1, 8), n - i)):
            tid = f"w{index}-{i:07d}"
            step = Step(
                step_idx=0,
                prompt_ids=(1, 2, 3),
                response_ids=(4, 5),
                behaviour_logprobs=(-0.5, -0.7),
                weight_version=0,
                response_text="Action: click(start_box='(10,20)')",
                action=Action(ActionKind.CLICK, point=(10.0, 20.0)),
            )
            t = Trajectory(
                trajectory_id=tid,
                run_id=run_id,
                task=Task(f"task-{i % 13}", "click", "minidesk"),
                steps=(step,),
                reward=float(i % 2),
                status=Status.OK,
                trace_id=tid,
                group_id=f"task-{i % 13}#w{index}-{i // 4}",
                group_size=4,
                started_at=1.0,
                finished_at=2.0,
            )
            batch.append((t, f"/blobs/{tid}"))
            i += 1
        written += log.append_many(batch)
    q.put(("writer", index, written))


def _claimer(dsn: str, run_id: str, index: int, total: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    import sqlalchemy as sa

    from dart_ray.store.db import RetryPolicy, RowState, create_engine, rollout_run
    from dart_ray.store.log import DurableLog

    engine = create_engine(dsn, pool_size=2)
    log = DurableLog(engine, retry=RetryPolicy(retries=20))
    acked = 0
    while True:
        claim = log.claim(run_id, 64, consumer=f"claimer-{index}", lease_s=300)
        if claim.rows:
            acked += log.ack(claim)
            continue
        with engine.connect() as c:
            done = c.scalar(
                sa.select(sa.func.count()).where(
                    rollout_run.c.run_id == run_id, rollout_run.c.state == RowState.CONSUMED
                )
            )
        if done >= total:
            break
        time.sleep(0.05)
    q.put(("claimer", index, acked))


def bench_log(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    import sqlalchemy as sa

    from dart_ray.store.db import (
        RowState,
        create_engine,
        dataset_usage_events,
        init_schema,
        rollout_run,
    )

    engine = create_engine(dsn)
    init_schema(engine)
    run_id = f"load-{int(time.time())}"
    per = args.rows // args.writers
    total = per * args.writers
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_writer, args=(dsn, run_id, i, per, q)) for i in range(args.writers)
    ]
    procs += [
        ctx.Process(target=_claimer, args=(dsn, run_id, i, total, q)) for i in range(args.claimers)
    ]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [q.get(timeout=args.log_timeout) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=30)
    rr, ev = rollout_run.c, dataset_usage_events.c
    with engine.connect() as c:
        rows = c.scalar(sa.select(sa.func.count()).where(rr.run_id == run_id))
        distinct = c.scalar(
            sa.select(sa.func.count(sa.distinct(rr.trajectory_id))).where(rr.run_id == run_id)
        )
        consumed = c.scalar(
            sa.select(sa.func.count()).where(
                rr.run_id == run_id, rr.state == RowState.CONSUMED, rr.used == 1
            )
        )
        acks = c.execute(
            sa.select(ev.row_id, sa.func.count())
            .where(ev.run_id == run_id, ev.event_type == "ACK")
            .group_by(ev.row_id)
        ).all()
    engine.dispose()
    written = sum(n for kind, _, n in results if kind == "writer")
    acked = sum(n for kind, _, n in results if kind == "claimer")
    return {
        "writers": args.writers,
        "claimers": args.claimers,
        "rows_expected": total,
        "rows_written": written,
        "rows_in_log": rows,
        "distinct_trajectories": distinct,
        "rows_consumed_once": consumed,
        "rows_acked": acked,
        "rows_with_one_ack": sum(1 for _, n in acks if n == 1),
        "rows_with_several_acks": sum(1 for _, n in acks if n > 1),
        "wall_s": wall,
        "rows_per_s": total / wall,
        "ok": written == rows == distinct == consumed == acked == total == len(acks)
        and all(n == 1 for _, n in acks),
    }


# --------------------------------------------------------------------------- main


def _table(out: dict[str, Any]) -> None:
    t = table("load", ("part", "load", "done", "failed / lost / doubled", "rate",
                       "latency p50/p90/p99"), "left")  # fmt: skip
    if "policy" in out:
        pol, lat = out["policy"], out["policy"]["latency_s"]
        t.add_row(
            "policy server",
            f"{pol['clients']} clients, {pol['wall_s']:.0f} s, {pol['weight_updates']} versions",
            f"{pol['requests']} requests",
            str(pol["errors"]),
            f"{pol['requests_per_s']:.1f} req/s",
            f"{lat['p50']:.2f} / {lat['p90']:.2f} / {lat['p99']:.2f} s",
        )
    if "log" in out:
        lg = out["log"]
        lost = lg["rows_expected"] - lg["rows_consumed_once"]
        t.add_row(
            "durable log",
            f"{lg['writers']} writers + {lg['claimers']} claimers",
            f"{lg['rows_consumed_once']} rows consumed once",
            f"{lost} / {lg['rows_with_several_acks']}",
            f"{lg['rows_per_s']:.0f} rows/s",
            "",
        )
    console().print(t)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "load")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=3.0, help="policy load duration")
    p.add_argument("--update-every", type=float, default=20.0, help="s between weight versions")
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--claimers", type=int, default=4)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--log-timeout", type=float, default=900.0)
    p.add_argument(
        "--dsn", default=None, help="MariaDB/MySQL URL with a database (default: a private server)"
    )
    p.add_argument("--parts", default="policy,log")
    bench = Bench.start(p, argv)
    args = bench.args
    parts = {x.strip() for x in args.parts.split(",")}
    out: dict[str, Any] = {}
    if "policy" in parts:
        out["policy"] = bench_policy(args)
    if "log" in parts:
        if args.dsn:
            out["log"] = bench_log(args, args.dsn)
        else:
            import sqlalchemy as sa

            from dart_ray.store.db import create_engine
            from dart_ray.testing.mariadb import TemporaryMariaDB

            with TemporaryMariaDB(buffer_pool="256M") as server:
                e = create_engine(server.url + "/")
                with e.begin() as c:
                    c.execute(sa.text("CREATE DATABASE load_bench"))
                e.dispose()
                out["log"] = bench_log(args, server.url + "/load_bench")
    ok = True
    if "policy" in out:
        pol = out["policy"]
        lat = pol["latency_s"]
        print(f"policy: {pol['clients']} clients, {pol['wall_s']:.0f} s, {pol['requests']} requests "
              f"({pol['requests_per_s']:.1f}/s), {pol['errors']} errors, latency p50 {lat['p50']:.3f} s "
              f"p90 {lat['p90']:.3f} s p99 {lat['p99']:.3f} s max {lat['max']:.3f} s, "
              f"{pol['weight_updates']} weight versions published, answered {pol['versions_answered']}")  # fmt: skip
        ok &= pol["errors"] == 0 and pol["requests"] > 0
    if "log" in out:
        lg = out["log"]
        print(f"log: {lg['writers']} writers + {lg['claimers']} claimers, {lg['rows_expected']} rows "
              f"in {lg['wall_s']:.1f} s ({lg['rows_per_s']:.0f} rows/s written and acknowledged); "
              f"in log {lg['rows_in_log']}, consumed once {lg['rows_consumed_once']}, "
              f"with several ACKs {lg['rows_with_several_acks']}: {'OK' if lg['ok'] else 'BREACH'}")  # fmt: skip
        ok &= bool(lg["ok"])
    out["ok"] = ok
    _table(out)
    bench.write(out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

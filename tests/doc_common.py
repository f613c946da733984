"""What the docs' tests share: the doc files, their fenced blocks, and a durable log filled
through the real API for the commands and the SQL they show (tests/test_docs.py runs the
commands, tests/test_doc_blocks.py the SQL and Python blocks)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sqlalchemy.engine import Engine

from dart_ray.records import Status
from dart_ray.store.checkpoints import CheckpointRegistry
from dart_ray.store.db import init_schema
from dart_ray.store.log import DurableLog
from dart_ray.store.runs import register_run
from tests.factories import make_trajectory

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_ID = "my-run"  # the run id the SQL in the docs names


def blocks(text: str, langs: tuple[str, ...]) -> list[str]:
    pattern = r"^```(?:" + "|".join(langs) + r")\n(.*?)^```"
    return re.findall(pattern, text, flags=re.M | re.S)


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of every bash block, continuations joined
    and trailing comments removed."""
    out = []
    for path in DOC_FILES:
        for block in blocks(path.read_text(), ("bash", "sh", "shell")):
            for line in block.replace("\\\n", " ").splitlines():
                cmd = re.sub(r"\s+#.*$", "", line).strip()
                cmd = re.sub(r"\s+", " ", cmd)
                if cmd and not cmd.startswith("#"):
                    out.append((path.name, cmd))
    return out


def doc_queries() -> list[tuple[str, str]]:
    out = []
    for path in DOC_FILES:
        for block in blocks(path.read_text(), ("sql",)):
            out.append((path.name, block.strip()))
    return out


def populate(engine: Engine) -> None:
    """A small run through the real API: appends, a claim acknowledged into checkpoint v1,
    a claim dropped as stale, rows left available."""
    init_schema(engine)
    register_run(engine, RUN_ID, "docs", {"run": {"name": "docs"}})
    log = DurableLog(engine, success_threshold=1.0)
    items = [
        (
            make_trajectory(
                f"t{i}",
                run_id=RUN_ID,
                task_id=f"task-{i % 3}",
                reward=float(i % 4 == 0),
                version=i % 2,
            ),
            f"/blobs/t{i}.parquet",
        )
        for i in range(12)
    ]
    items.append(
        (make_trajectory("env", run_id=RUN_ID, status=Status.ENV_ERROR, n_steps=0), "/b/e")
    )
    log.append_many(items)
    cps = CheckpointRegistry(engine)
    trained = log.claim(RUN_ID, 4, consumer=f"curator:{RUN_ID}", lease_s=60)
    cid = cps.create(RUN_ID, 1)
    cps.start(cid)
    cps.complete(cid, "/mnt/shared/runs/my-run/checkpoints/v1")
    log.ack(trained, in_version=1)
    stale = log.claim(RUN_ID, 2, consumer=f"curator:{RUN_ID}", lease_s=60)
    log.drop(stale, stale.row_ids, "stale")

"""Ranks that were handed different curated steps under one step number (the curator
restarted between their requests) refuse to train them: both raise, in a real two-process
gloo group, instead of feeding FSDP two different batches as one step."""

from __future__ import annotations

import datetime as dt
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from dart_ray.records import Status
from dart_ray.store.log import Claim, LogRow
from dart_ray.train.worker import StepMismatchError, check_same_step, step_fingerprint


def _row(i: int) -> LogRow:
    return LogRow(
        i, "run", f"t{i}", "task", f"t{i}", "g", 2, f"/b/{i}", 1.0, 1, Status.OK, 0, "v0", ""
    )


def _claims(rows: list[int], cid: str = "c1") -> tuple[Claim, ...]:
    return (Claim(cid, "curator", "run", tuple(_row(i) for i in rows), dt.datetime(2026, 1, 1)),)


def _rank(rank: int, port: int, rows_by_rank: list[list[int]], out: dict) -> None:  # type: ignore[type-arg]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        check_same_step(7, _claims(rows_by_rank[rank]))
        out[rank] = "ok"
    except StepMismatchError as e:
        out[rank] = str(e)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("rows", "agree"), [([[1, 2], [2, 1]], True), ([[1, 2], [3, 4]], False)])
def test_ranks_agree_on_the_step_or_all_refuse(rows: list[list[int]], agree: bool) -> None:
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_rank, args=(_free_port(), rows, out), nprocs=2, join=True)
        got = dict(out)
    if agree:
        assert got == {0: "ok", 1: "ok"}
    else:
        assert all("ranks were handed different curated steps" in got[r] for r in (0, 1))


def test_fingerprint_is_of_the_rows_not_their_order() -> None:
    assert step_fingerprint(_claims([1, 2])) == step_fingerprint(_claims([2, 1]))
    assert step_fingerprint(_claims([1, 2])) != step_fingerprint(_claims([1, 3]))
    assert step_fingerprint(_claims([1, 2])) != step_fingerprint(_claims([1, 2], cid="c2"))

"""Batcher: the next batch forms when the engine is free, from everything that queued."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dart_ray.engines.batching import Batcher


class Engine:
    """Runs a batch when `release` is set (each batch clears it again); records the batches."""

    def __init__(self, block: bool = True) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        if not block:
            self.release.set()
        self.block = block
        self.fail_with: Exception | None = None

    async def run(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        self.started.set()
        await self.release.wait()
        if self.block:
            self.release.clear()
        if self.fail_with is not None:
            raise self.fail_with
        return [i * 10 for i in items]


def _run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


async def _until(cond: Callable[[], bool]) -> None:
    while not cond():
        await asyncio.sleep(0.001)


def test_requests_that_arrive_while_the_engine_works_run_as_one_batch() -> None:
    # Ray Serve's serve.batch closes a batch every batch_wait_timeout_s even while the
    # function is busy, so these 20 would have run as several small batches, one after another
    async def test() -> None:
        engine = Engine()
        b = Batcher(engine.run, max_batch_size=32, wait_s=0.001)
        first = asyncio.create_task(b.submit(0))
        await engine.started.wait()
        rest = [asyncio.create_task(b.submit(i)) for i in range(1, 21)]
        await asyncio.sleep(0.05)  # many waits' worth: still one batch in the making
        assert engine.batches == [[0]]
        engine.release.set()
        assert await first == 0
        await _until(lambda: len(engine.batches) == 2)
        engine.release.set()
        assert await asyncio.gather(*rest) == [i * 10 for i in range(1, 21)]
        assert engine.batches == [[0], list(range(1, 21))]
        assert b.batch_sizes == [1, 20]

    _run(test)


def test_a_batch_holds_at_most_max_batch_size_in_arrival_order() -> None:
    async def test() -> None:
        engine = Engine(block=False)
        b = Batcher(engine.run, max_batch_size=4, wait_s=0.0)
        got = await asyncio.gather(*(b.submit(i) for i in range(10)))
        assert got == [i * 10 for i in range(10)]
        assert [x for batch in engine.batches for x in batch] == list(range(10))
        assert max(len(batch) for batch in engine.batches) == 4

    _run(test)


def test_a_lone_request_waits_for_company_then_runs_alone() -> None:
    async def test() -> None:
        engine = Engine(block=False)
        b = Batcher(engine.run, max_batch_size=8, wait_s=0.2)
        one = asyncio.create_task(b.submit(1))
        await asyncio.sleep(0.02)  # within the first one's wait: it joins
        two = asyncio.create_task(b.submit(2))
        assert await asyncio.gather(one, two) == [10, 20]
        assert engine.batches == [[1, 2]]
        assert await b.submit(3) == 30  # alone: runs once its wait is over
        assert engine.batches[-1] == [3]

    _run(test)


def test_an_engine_error_reaches_every_request_of_its_batch_and_the_next_batch_runs() -> None:
    async def test() -> None:
        engine = Engine(block=False)
        engine.fail_with = RuntimeError("out of memory")
        b = Batcher(engine.run, max_batch_size=8, wait_s=0.05)
        got = await asyncio.gather(*(b.submit(i) for i in range(3)), return_exceptions=True)
        assert [str(e) for e in got] == ["out of memory"] * 3
        engine.fail_with = None
        assert await b.submit(4) == 40

    _run(test)


def test_a_result_count_that_does_not_match_the_batch_is_an_error() -> None:
    async def test() -> None:
        async def short(items: list[int]) -> list[int]:
            return items[:-1]

        b = Batcher(short, max_batch_size=8, wait_s=0.05)
        got = await asyncio.gather(b.submit(1), b.submit(2), return_exceptions=True)
        assert all(
            isinstance(e, RuntimeError) and "1 results for a batch of 2" in str(e) for e in got
        )

    _run(test)


def test_a_request_cancelled_while_it_queues_is_left_out_of_its_batch() -> None:
    async def test() -> None:
        engine = Engine()
        b = Batcher(engine.run, max_batch_size=8, wait_s=0.001)
        first = asyncio.create_task(b.submit(0))
        await engine.started.wait()
        gone = asyncio.create_task(b.submit(1))
        kept = asyncio.create_task(b.submit(2))
        await asyncio.sleep(0.01)
        gone.cancel()
        engine.release.set()
        await first
        await _until(lambda: len(engine.batches) == 2)
        engine.release.set()
        assert await kept == 20
        assert engine.batches == [[0], [2]]

    _run(test)


def test_close_cancels_what_is_queued() -> None:
    async def test() -> None:
        engine = Engine()
        b = Batcher(engine.run, max_batch_size=8, wait_s=0.001)
        running = asyncio.create_task(b.submit(0))
        await engine.started.wait()
        queued = asyncio.create_task(b.submit(1))
        await asyncio.sleep(0.01)
        await b.close()
        for t in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await t

    _run(test)


@pytest.mark.parametrize(
    ("size", "wait", "match"), [(0, 0.0, "max_batch_size"), (1, -1.0, "wait_s")]
)
def test_bad_settings_are_refused(size: int, wait: float, match: str) -> None:
    async def run(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match=match):
        Batcher(run, size, wait)


def test_a_batch_waits_for_the_members_it_took_that_are_still_being_prepared() -> None:
    # a burst still in preparation when the engine frees up runs as one batch, not as the
    # one or two already prepared and then the rest
    async def test() -> None:
        engine = Engine(block=False)
        b = Batcher(engine.run, max_batch_size=32, wait_s=0.001)
        gates = [asyncio.Event() for _ in range(6)]

        async def prepare(i: int) -> int:
            await gates[i].wait()
            return i

        tasks = [asyncio.create_task(b.submit(prepare(i))) for i in range(6)]
        await asyncio.sleep(0.02)  # twenty waits: all six are queued, none prepared
        assert engine.batches == []
        for g in gates:
            g.set()
            await asyncio.sleep(0.002)  # prepared one by one, as a single thread would
        assert await asyncio.gather(*tasks) == [i * 10 for i in range(6)]
        assert engine.batches == [list(range(6))]

    _run(test)


def test_a_failed_preparation_fails_its_request_alone() -> None:
    async def test() -> None:
        engine = Engine(block=False)
        b = Batcher(engine.run, max_batch_size=8, wait_s=0.05)

        async def bad() -> int:
            raise ValueError("image 0 is not a readable PNG")

        got = await asyncio.gather(
            b.submit(1), b.submit(bad()), b.submit(3), return_exceptions=True
        )
        assert got[0] == 10 and got[2] == 30
        assert isinstance(got[1], ValueError) and "readable PNG" in str(got[1])
        assert engine.batches == [[1, 3]]

    _run(test)

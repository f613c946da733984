"""Batch concurrent requests for an engine that runs one batch at a time.

Ray Serve's `serve.batch` closes a batch as soon as its wait expires, whether or not the
function can run it yet: while the engine generates one batch, the requests that arrive form
batch after small batch (each closed after `batch_wait_timeout_s`), and those queue on the
concurrency semaphore and run one after another. Measured on the tiny model with 32 clients
(benchmarks/policy.py): batches of 4.6 requests on average where 32 were waiting, and
19.6 actions/s through Serve against 54.3 for the engine alone at batch 32.

`Batcher` forms the next batch only when the engine is free, from everything that queued
meanwhile (up to `max_batch_size`), so under load a batch is as large as the load allows.
A request counts as queued from its arrival, while it is still being prepared, and a batch
waits for the preparation of the members it took. A request waits at most `wait_s` for
company, from its arrival or from the moment the engine freed up if it queued behind a batch.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: asyncio.Future[T]
    """The item, or the task still preparing it."""
    arrived: float
    future: asyncio.Future[R] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Batcher(Generic[T, R]):
    """`await submit(item)` returns `run(batch)[i]` for the batch the item ran in.

    `item` may be an awaitable that prepares it (decoding a screenshot, say): the request
    counts as arrived at once and joins a batch in arrival order, and the batch waits for the
    members it took to finish preparing, so a burst of requests still in preparation when the
    engine frees up runs as one batch rather than as a small one and then the rest. A failed
    preparation fails its request alone. `run` takes a list of items and returns one result
    per item, in order; if it raises, every request of that batch gets the exception. A
    request cancelled before its batch starts is left out of it. Batches run one at a time.
    """

    def __init__(
        self, run: Callable[[list[T]], Awaitable[Sequence[R]]], max_batch_size: int, wait_s: float
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self.run = run
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.batch_sizes: list[int] = []
        """Sizes of the batches run, newest last (the last 512 to 1,024 of them: a replica
        runs for days)."""
        self._queue: asyncio.Queue[_Pending[T, R]] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._free_at = 0.0

    async def submit(self, item: T | Awaitable[T]) -> R:
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._loop(self._queue))
        if inspect.isawaitable(item):
            ready: asyncio.Future[T] = asyncio.ensure_future(item)
        else:
            ready = asyncio.get_running_loop().create_future()
            ready.set_result(item)
        pending: _Pending[T, R] = _Pending(ready, time.monotonic())
        self._queue.put_nowait(pending)
        return await pending.future

    async def _next_batch(
        self, queue: asyncio.Queue[_Pending[T, R]]
    ) -> list[tuple[_Pending[T, R], T]]:
        batch = [await queue.get()]
        # a request waits for company at most wait_s from its arrival, or from the moment the
        # engine freed up if it queued behind a batch
        deadline = max(batch[0].arrived, self._free_at) + self.wait_s
        while len(batch) < self.max_batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), left))
            except TimeoutError:
                break
        ready: list[tuple[_Pending[T, R], T]] = []
        for p in batch:
            await asyncio.wait([p.item])  # still being prepared: it was taken, so wait
            if p.future.done():  # cancelled while it queued
                continue
            if p.item.cancelled():
                p.future.cancel()
            elif (e := p.item.exception()) is not None:
                p.future.set_exception(e)
            else:
                ready.append((p, p.item.result()))
        return ready

    async def _loop(self, queue: asyncio.Queue[_Pending[T, R]]) -> None:
        while True:
            taken = await self._next_batch(queue)
            if not taken:
                continue
            batch = [p for p, _ in taken]
            self.batch_sizes.append(len(batch))
            if len(self.batch_sizes) > 1024:
                del self.batch_sizes[:512]
            try:
                results = await self.run([item for _, item in taken])
                if len(results) != len(batch):
                    raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
            except Exception as e:  # every request of the batch learns why
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            except BaseException:  # the loop itself is cancelled: nobody is left waiting
                for p in batch:
                    p.future.cancel()
                raise
            finally:
                self._free_at = time.monotonic()
            for p, r in zip(batch, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)

    async def close(self) -> None:
        """Stop forming batches; requests still queued get CancelledError."""
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._queue is not None:
            while not self._queue.empty():
                self._queue.get_nowait().future.cancel()

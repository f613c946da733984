"""Keeping the leases of trained-but-not-yet-durable rows alive, on a heartbeat thread.

Rank 0 takes over each step's claims before its optimizer step and acknowledges them only when
the weights they trained are in a durable checkpoint (`train.save_every` versions later). In
between, the rows are CLAIMED in the log under a lease. If that lease lapsed, the rows would
go back to the pool and be trained a second time. Renewing between the trainer's phases is not
enough: a wait for data, an optimizer step, a publish to every replica or a checkpoint save
can each outlast `curation.lease_s` (a 7B save takes minutes). So the keeper renews from a
thread of its own (`start()`), whenever a third of the lease has passed since the last
renewal, whatever the trainer is doing; the database's clock sets each new expiry.

A renewal that finds rows gone (their lease lapsed anyway: the database was unreachable for
longer than the lease) cannot be repaired from the thread: the error is kept and raised by the
trainer's next `take`/`renew`, which makes it restart from its durable checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dart_ray.store.log import Claim, DurableLog, LeaseLostError

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self, log_: DurableLog, lease_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log_
        self.lease_s = lease_s
        self.clock = clock
        self.held: dict[int, list[Claim]] = {}
        """Step number -> the claims of its rows, until they are acknowledged."""
        self._renewed_at = clock()
        self._lock = threading.RLock()
        self._lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, step: int, claims: tuple[Claim, ...] | list[Claim]) -> None:
        """Take over a trained step's claims, and renew every held lease now."""
        with self._lock:
            self.held[step] = list(claims)
            self.renew()

    def take(self, step: int, claims: tuple[Claim, ...] | list[Claim]) -> bool:
        """Before training a step: renew every held lease, then the step's own claims.

        A trained step whose rows were lost raises LeaseLostError: the weights already hold
        those rows and someone else may train them, so the trainer must start again from its
        durable checkpoint. A step whose own rows are no longer held (their lease lapsed, or a
        resume settled them as trained into a checkpoint) returns False: it must not be
        trained, and nothing of it is held."""
        with self._lock:
            self.renew()
            try:
                renewed = [self.log.renew(c, self.lease_s) for c in claims]
            except LeaseLostError:
                return False
            self.held[step] = renewed
            return True

    def heartbeat(self) -> bool:
        """Renew if a third of the lease has passed since the last renewal; whether it did."""
        with self._lock:
            if self.clock() - self._renewed_at < self.lease_s / 3:
                return False
            self.renew()
            return True

    def renew(self) -> None:
        """Renew every held lease now (LeaseLostError: some held row is gone, or was found
        gone by the heartbeat thread)."""
        with self._lock:
            if self._lost is not None:
                raise self._lost
            for claims in self.held.values():
                claims[:] = [self.log.renew(c, self.lease_s) for c in claims]
            self._renewed_at = self.clock()

    def acknowledge(self, ack: Callable[[Claim], object]) -> list[int]:
        """Acknowledge every held claim with `ack` and let go of each as it is done, under the
        lock the heartbeat renews under: a beat never renews a claim already acknowledged
        (its rows are CONSUMED: the renewal would fail and be taken for a lost lease). A
        failure part-way leaves the claims not yet acknowledged held (and renewed). Returns
        the steps let go of."""
        with self._lock:
            steps = sorted(self.held)
            for step in steps:
                claims = self.held[step]
                while claims:
                    ack(claims[0])
                    claims.pop(0)
                del self.held[step]
            return steps

    def clear(self) -> None:
        """Let go of every held claim without acknowledging it (they lapse back to the pool)."""
        with self._lock:
            self.held.clear()

    # ------------------------------------------------------------------ the thread

    def start(self, period_s: float | None = None) -> LeaseKeeper:
        """Beat from a daemon thread every `period_s` (default: a tenth of the lease, at
        most 5 s) until `stop()`; each beat renews once a third of the lease has passed."""
        if self._thread is not None:
            return self
        period = period_s if period_s is not None else min(self.lease_s / 10, 5.0)
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(period):
                try:
                    self.heartbeat()
                except LeaseLostError as e:
                    with self._lock:
                        self._lost = e
                    log.error("lease heartbeat: %s; the trainer restarts from its checkpoint", e)
                    return
                except Exception:  # a database hiccup past its retries: try the next beat
                    log.exception("lease heartbeat failed; trying again")

        self._thread = threading.Thread(target=run, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_s)
            self._thread = None

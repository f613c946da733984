"""Keeping the leases of trained-but-not-yet-durable rows alive, on a heartbeat.

Rank 0 takes over each step's claims after its optimizer step and acknowledges them only when
the weights they trained are in a durable checkpoint (`train.save_every` versions later). In
between, the rows are CLAIMED in the log under a lease. If that lease lapsed, the rows would
go back to the pool and be trained a second time. Renewing only after each optimizer step is
not enough: a trainer waiting for data longer than `curation.lease_s` (a slow rollout, a
restarting environment) would lose them. So the keeper renews on a heartbeat, called every
few seconds from the trainer's wait loop as well as after each step, whenever a third of the
lease has passed since the last renewal (the database's clock sets the new expiry).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dart_ray.store.log import Claim, DurableLog, LeaseLostError


class LeaseKeeper:
    def __init__(
        self, log: DurableLog, lease_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log
        self.lease_s = lease_s
        self.clock = clock
        self.held: dict[int, list[Claim]] = {}
        """Step number -> the claims of its rows, until they are acknowledged."""
        self._renewed_at = clock()

    def hold(self, step: int, claims: tuple[Claim, ...] | list[Claim]) -> None:
        """Take over a trained step's claims, and renew every held lease now."""
        self.held[step] = list(claims)
        self.renew()

    def take(self, step: int, claims: tuple[Claim, ...] | list[Claim]) -> bool:
        """Before training a step: renew every held lease, then the step's own claims.

        A trained step whose rows were lost raises LeaseLostError: the weights already hold
        those rows and someone else may train them, so the trainer must start again from its
        durable checkpoint. A step whose own rows are no longer held (their lease lapsed, or a
        resume settled them as trained into a checkpoint) returns False: it must not be
        trained, and nothing of it is held."""
        self.renew()
        try:
            renewed = [self.log.renew(c, self.lease_s) for c in claims]
        except LeaseLostError:
            return False
        self.held[step] = renewed
        return True

    def heartbeat(self) -> bool:
        """Renew if a third of the lease has passed since the last renewal; whether it did."""
        if self.clock() - self._renewed_at < self.lease_s / 3:
            return False
        self.renew()
        return True

    def renew(self) -> None:
        for claims in self.held.values():
            claims[:] = [self.log.renew(c, self.lease_s) for c in claims]
        self._renewed_at = self.clock()

    def clear(self) -> None:
        """The held claims were acknowledged."""
        self.held.clear()

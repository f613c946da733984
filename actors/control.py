"""RunControl: the run's stop switch and the trainer's step metrics, one named actor per run.

Every train worker polls it while waiting for data, so that all ranks stop together instead
of one rank leaving its peers blocked in a collective.
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class RunControl:
    def __init__(self) -> None:
        self._stop = False
        self._reason = ""
        self._steps: list[dict[str, float]] = []

    def request_stop(self, reason: str = "") -> None:
        self._stop = True
        self._reason = reason

    def stop_requested(self) -> bool:
        return self._stop

    def reason(self) -> str:
        return self._reason

    def record(self, metrics: dict[str, float]) -> None:
        """The trainer's metrics of one optimizer step (rank 0 reports them)."""
        self._steps.append(dict(metrics))

    def history(self, since: int = 0) -> list[dict[str, float]]:
        return self._steps[since:]

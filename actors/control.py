"""RunControl: the run's stop switch and the trainer's step metrics, one named actor per run.

Every train worker polls it while waiting for data, so that all ranks stop together instead
of one rank leaving its peers blocked in a collective. The trainer's metrics it receives are
also exported through `ray.util.metrics` (the Ray dashboard, Prometheus): tokens/s, weight
sync latency, trainer utilisation, the policy version, and how far training strays from
what was sampled (clip, capped and masked fractions, engine-vs-trainer log-prob gap).
"""

from __future__ import annotations

import time

import ray
from ray.util import metrics as ray_metrics


class _TrainerMetrics:
    def __init__(self, run_id: str) -> None:
        def gauge(name: str, doc: str) -> ray_metrics.Gauge:
            g = ray_metrics.Gauge(name, doc, ("run_id",))
            g.set_default_tags({"run_id": run_id})
            return g

        self.tokens_per_s = gauge(
            "dart_train_tokens_per_s", "Response tokens trained per second of optimizer step"
        )
        self.sync_s = gauge("dart_weight_sync_seconds", "Latency of the last weight publication")
        self.utilisation = gauge(
            "dart_trainer_utilisation", "Fraction of the run the trainer spent in steps and syncs"
        )
        self.version = gauge("dart_policy_version", "Newest published weight version")
        self.clip_frac = gauge("dart_clip_fraction", "Fraction of tokens the PPO/GSPO clip bound")
        self.is_capped = gauge(
            "dart_is_capped_fraction", "Fraction of tokens whose importance weight was capped"
        )
        self.is_masked = gauge(
            "dart_is_masked_fraction", "Fraction of tokens the off-policy correction dropped"
        )
        self.mismatch_abs = gauge(
            "dart_logprob_mismatch_abs",
            "Mean |log-prob of the engine - of the trainer| on the sampled tokens",
        )
        self.mismatch_kl = gauge(
            "dart_logprob_mismatch_kl", "k3 estimate of KL(behaviour || trainer) per token"
        )
        self.steps = ray_metrics.Counter("dart_train_steps_total", "Optimizer steps", ("run_id",))
        self.steps.set_default_tags({"run_id": run_id})


@ray.remote(num_cpus=0)
class RunControl:
    def __init__(self, run_id: str = "") -> None:
        self._stop = False
        self._reason = ""
        self._steps: list[dict[str, float]] = []
        self._born = time.monotonic()
        self._busy_s = 0.0
        self._metrics = _TrainerMetrics(run_id)

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
        step_s = metrics.get("step_s", 0.0)
        self._busy_s += step_s + metrics.get("sync_s", 0.0)
        m = self._metrics
        m.steps.inc()
        if step_s > 0:
            m.tokens_per_s.set(metrics.get("tokens", 0.0) / step_s)
        if "sync_s" in metrics:
            m.sync_s.set(metrics["sync_s"])
        m.version.set(metrics.get("version", 0.0))
        for key, g in (
            ("clip_frac", m.clip_frac),
            ("is_capped_frac", m.is_capped),
            ("is_masked_frac", m.is_masked),
            ("logp_diff_abs", m.mismatch_abs),
            ("mismatch_kl_k3", m.mismatch_kl),
        ):
            if key in metrics:
                g.set(metrics[key])
        m.utilisation.set(self._busy_s / max(time.monotonic() - self._born, 1e-9))

    def history(self, since: int = 0) -> list[dict[str, float]]:
        return self._steps[since:]

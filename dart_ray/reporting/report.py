"""The end-of-run report: numbers, a table, a JSON file, a figure and TensorBoard events.

Written to the run folder: `report.json`, `curve.png` (`dart_ray.reporting.plots`: held-out success
per evaluated version with 95% intervals; sampled success per band of versions from the
durable log, and the mean reward of the trained groups per step), `system.png`
(utilisation over time, staleness, weight-sync latency), and `tb/` (TensorBoard
event files of every trainer step, held-out success, sampled success per version).
`dart-ray report RUN` redraws the figures and prints the table from the log.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from rich.console import Console
from rich.table import Table

from dart_ray.data.batches import TOKEN_LAG
from dart_ray.evaluation.suite import EvalResult
from dart_ray.reporting.families import FamilyUsage, family_table, family_usage
from dart_ray.reporting.figures import draw_curve, draw_system_figure, heldout_points
from dart_ray.reporting.plots import delta_interval
from dart_ray.reporting.summary import RunReport
from dart_ray.rollout.seeding import SeedOutcome

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from dart_ray.run.runtime import Parts


OFF_POLICY_KEYS = (
    "clip_frac",
    "clip_frac_last",
    "is_capped_frac",
    "is_masked_frac",
    "logp_diff_abs",
    "mismatch_kl_k3",
    "no_mass_frac",
    "onpolicy_logp_diff_abs",
    "sample_version_min",
    "sample_version_max",
)
"""Per-version metrics of how far training strays from what was sampled:
clip fraction (all updates, and the batch's last update), the share of tokens whose
importance weight was capped or masked, the engine-vs-trainer log-prob gap on the sampled
tokens (mean |diff| and k3 KL, staleness included, over the tokens the trainer gives mass;
`no_mass_frac` the share it gives none), and that gap on tokens sampled by the
very weights the trainer held (the pure engine-vs-trainer mismatch), and the oldest and
newest weight version among the samples trained (min and max over the version's steps)."""


def off_policy_by_version(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """`OFF_POLICY_KEYS` over the steps of each version, in version order: means, except
    that a `_min` key takes the minimum and a `_max` key the maximum."""
    acc: dict[int, dict[str, list[float]]] = {}
    for h in history:
        v = int(h.get("version", 0))
        for k in OFF_POLICY_KEYS:
            if k in h:
                acc.setdefault(v, {}).setdefault(k, []).append(float(h[k]))

    def combine(k: str, xs: list[float]) -> float:
        if k.endswith("_min"):
            return min(xs)
        if k.endswith("_max"):
            return max(xs)
        return sum(xs) / len(xs)

    return [
        {"version": float(v), **{k: combine(k, xs) for k, xs in acc[v].items()}}
        for v in sorted(acc)
    ]


def _mean_of(rows: list[dict[str, float]], key: str) -> float | None:
    xs = [r[key] for r in rows if key in r]
    return sum(xs) / len(xs) if xs else None


def build_report(
    parts: Parts,
    before: EvalResult | None,
    after: EvalResult | None,
    wall_s: float,
    seeds: Sequence[SeedOutcome] = (),
) -> RunReport:
    """`seeds`: the run's replay seeds (`curation.replay_seeds`), if it had any."""
    history: list[dict[str, float]] = ray.get(parts.control.history.remote())
    stats = ray.get([r.stats.remote() for r in parts.rollouters])
    cur = ray.get(parts.curator.metrics.remote())
    trajectories: dict[str, int] = {}
    for s in stats:
        for k, v in s.logged.items():
            trajectories[k] = trajectories.get(k, 0) + v
    episode_s = sum(s.episode_s for s in stats)
    session_s = sum(s.wall_s * s.sessions for s in stats)
    syncs = [h["sync_s"] for h in history if "sync_s" in h]
    busy = sum(h.get("step_s", 0.0) + h.get("sync_s", 0.0) for h in history)
    usage = parts.store.log.task_usage(parts.run_id)
    again: Counter[str] = Counter()
    for s in stats:
        again.update(s.seeds_again)
    report = RunReport(
        run_id=parts.run_id,
        mode=parts.config.run.mode,
        wall_s=wall_s,
        heldout_before=before.success() if before else None,
        heldout_after=after.success() if after else None,
        heldout_tasks=len(before.per_task) if before else 0,
        trajectories=trajectories,
        groups_completed=sum(s.groups_completed for s in stats),
        train_steps=len(history),
        versions=int(max((h.get("version", 0) for h in history), default=0)),
        samples_trained=int(sum(h.get("samples", 0) for h in history)),
        rows_trained=int(cur["rows_trained"]),
        dropped=dict(cur["dropped"]),
        stale_at=dict(cur.get("stale_at", {})),
        quarantined=dict(cur.get("quarantined", {})),
        heldout_split=str(parts.config.env.heldout_tasks or "the env's built-in held-out split"),
        env_utilisation=episode_s / session_s if session_s else 0.0,
        trainer_utilisation=busy / wall_s if wall_s else 0.0,
        sync_count=len(syncs),
        sync_latency_mean_s=sum(syncs) / len(syncs) if syncs else 0.0,
        sync_latency_max_s=max(syncs, default=0.0),
        policy_version=int(parts.policy.version.remote().result()),
        rewards=[float(h.get("mean_reward", 0.0)) for h in history],
        sampled=[
            [v, k, n]
            for v, (k, n) in sorted(parts.store.log.success_by_version(parts.run_id).items())
        ],
        start_version=parts.start.version,
        off_policy=off_policy_by_version(history),
        run_dir=str(parts.run_dir),
        sessions=parts.config.env.num_sessions,
        staleness={str(k): int(n) for k, n in sorted(cur["staleness"].items())},
        trainer_busy=[
            [h["t_end"] - h.get("step_s", 0.0) - h.get("sync_s", 0.0), h["t_end"]]
            for h in history
            if "t_end" in h
        ],
        sync_latency=[[h["version"], h["sync_s"]] for h in history if "sync_s" in h],
        simulated=parts.config.timing.enabled,
        token_staleness=token_staleness(history),
        rollouts_started=sum(s.started for s in stats),
        admission_held_s=sum(s.held_s for s in stats),
        backoff_skips=sum(getattr(s, "backoff_skips", 0) for s in stats),
        families=[
            f.to_json()
            for f in family_usage(
                usage,
                {t.task_id: str(t.config["family"]) for t in parts.tasks if t.config.get("family")},
            )
        ],
        replay_seeds=[
            {
                **o.as_dict(),
                "replays": int(cur.get("replays_by_task", {}).get(o.task_id, 0)),
                "again": again[o.task_id],
                "rollouts": usage.get(o.task_id, (0, 0, 0))[0],
                "trained": usage.get(o.task_id, (0, 0, 0))[1],
            }
            for o in seeds
        ],
        **rollout_stats(parts),
    )
    write(report, history, parts.run_dir, parts.store.log.episode_intervals(parts.run_id))
    return report


def seed_table(seeds: Sequence[dict[str, Any]]) -> Table:
    """The replay seeds and the signal each task gave (`RunReport.replay_seeds`): `seed`, the
    reward of its first seed episode; `again`, the times its seed was played again once it
    had aged; `replays`, the all-fail groups it gave a success; `trained`, the policy's own
    rows of the task that trained (a replayed group still queued at the end has none yet)."""
    gave = sum(int(s["replays"]) > 0 for s in seeds)
    t = Table(
        title=f"replay seeds: {sum(bool(s['seeded']) for s in seeds)} of {len(seeds)} "
        f"succeeded; {gave} tasks gave signal through them"
    )
    t.add_column("task", overflow="fold")
    for name in ("seed", "again", "replays", "rollouts", "trained"):
        t.add_column(name, justify="right", no_wrap=True)
    for s in seeds:
        seeded = f"{s['reward']:.2f}" if s["seeded"] else f"{s['reward']:.2f} ({s['status']})"
        t.add_row(
            str(s["task_id"]),
            seeded,
            *(str(s.get(k, 0)) for k in ("again", "replays", "rollouts", "trained")),
        )
    return t


def token_staleness(history: list[dict[str, float]]) -> dict[str, int]:
    """Trained response tokens by versions behind, summed over the train steps."""
    out: dict[int, int] = {}
    for h in history:
        for k, n in h.items():
            if k.startswith(TOKEN_LAG):
                lag = int(k.removeprefix(TOKEN_LAG))
                out[lag] = out.get(lag, 0) + int(n)
    return {str(k): out[k] for k in sorted(out)}


def rollout_stats(parts: Parts) -> dict[str, float | None]:
    """From every policy replica: the busy GPU-seconds over GPU-seconds
    (`rollout_utilisation`) and the mean update wait and block per update
    (`update_wait_s`, `update_blocked_s`); None where no replica answers."""
    out: dict[str, float | None] = dict.fromkeys(
        ("rollout_utilisation", "update_wait_s", "update_blocked_s")
    )
    try:
        results = parts.policy.broadcast("utilisation").results()
    except Exception as e:  # a report never fails for a figure
        log.warning("rollout utilisation: %s", e)
        return out
    busy = sum(u["gpu_busy_s"] for u in results)
    capacity = sum(u["gpus"] * u["alive_s"] for u in results)
    out["rollout_utilisation"] = busy / capacity if capacity else None
    updates = sum(u.get("updates", 0.0) for u in results)
    if updates:
        out["update_wait_s"] = sum(u["update_wait_s"] for u in results) / updates
        out["update_blocked_s"] = sum(u["update_blocked_s"] for u in results) / updates
    return out


def write(
    report: RunReport,
    history: list[dict[str, float]],
    run_dir: Path,
    episodes: Sequence[tuple[datetime, datetime]] = (),
) -> None:
    (run_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    draw_curve(report, run_dir / "curve.png", [float(h.get("version", 0)) for h in history])
    draw_system_figure(report, episodes, run_dir / "system.png")
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(run_dir / "tb")) as tb:
        for i, h in enumerate(history):
            for k, v in h.items():
                if k != "t_end":  # a wall-clock time, not a metric
                    tb.add_scalar(f"train/{k}", float(v), i + 1)
        for p in heldout_points(report):
            tb.add_scalar("heldout/success", p.rate, int(p.version))
        for v, k, n in report.sampled:
            tb.add_scalar("rollout/sampled_success", k / n if n else 0.0, v)
        for name, value in (("before", report.heldout_before), ("after", report.heldout_after)):
            if value is not None:
                tb.add_scalar(
                    f"heldout/success_{name}", value, 0 if name == "before" else len(history)
                )


def heldout_line(report: RunReport) -> str:
    """'35.3% -> 45.0% (+9.7 points, 95% CI +4.1 to +15.3; 300 tasks)'."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    before, after, n = report.heldout_before, report.heldout_after, report.heldout_tasks
    line = f"{pct(before)} -> {pct(after)}"
    if before is not None and after is not None and n:
        lo, hi = delta_interval(before, after, n)
        line += (
            f" ({100 * (after - before):+.1f} points, 95% CI {100 * lo:+.1f} to {100 * hi:+.1f}"
            f"; {n} tasks)"
        )
    elif n:
        line += f" ({n} tasks)"
    return line


def render(report: RunReport, console: Console) -> None:
    sim = " - SIMULATED (timing mode: compute replaced by latencies)" if report.simulated else ""
    t = Table(title=f"run {report.run_id} ({report.mode}){sim}", show_header=False)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    t.add_row("held-out success before -> after", heldout_line(report))
    if report.heldout_split and report.heldout_tasks:
        t.add_row(
            "held-out set",
            f"the first {report.heldout_tasks} tasks of {report.heldout_split}: no first screen "
            "and instruction of them is a training task's (greedy, one episode each)",
        )
    t.add_row(
        "trajectories", ", ".join(f"{k} {v}" for k, v in sorted(report.trajectories.items())) or "0"
    )
    stale = report.dropped.get("stale", 0)
    t.add_row(
        "rollouts started / trained / dropped stale",
        f"{report.rollouts_started} / {report.rows_trained} / {stale}"
        + (f" ({stale / report.rollouts_started:.1%})" if report.rollouts_started else ""),
    )
    if report.sessions and report.wall_s:
        held = report.admission_held_s
        t.add_row(
            "sessions held idle by admission",
            f"{held:.0f} s ({held / report.wall_s:.1%} of the run; a free session waits while "
            "new rows could not train within the staleness bound)",
        )
    t.add_row("groups completed", str(report.groups_completed))
    if report.backoff_skips:
        t.add_row("task visits skipped by back-off", str(report.backoff_skips))
    t.add_row("train steps / versions", f"{report.train_steps} / {report.versions}")
    t.add_row("samples trained (rows)", f"{report.samples_trained} ({report.rows_trained})")
    started = max(report.rollouts_started, 1)
    t.add_row(
        "dropped by reason (of rollouts started)",
        ", ".join(f"{k} {v} ({v / started:.1%})" for k, v in sorted(report.dropped.items()))
        or "none",
    )
    if report.quarantined:
        t.add_row(
            "quarantined (bad data)",
            ", ".join(f"{k} {v}" for k, v in sorted(report.quarantined.items())),
        )
    t.add_row("environment utilisation", pct(report.env_utilisation))
    t.add_row("trainer utilisation", pct(report.trainer_utilisation))
    t.add_row("rollout (policy accelerator) utilisation", pct(report.rollout_utilisation))
    t.add_row(
        "weight syncs (mean / max latency)",
        f"{report.sync_count} ({report.sync_latency_mean_s:.2f} s / {report.sync_latency_max_s:.2f} s)",
    )
    if report.update_wait_s is not None and report.update_blocked_s is not None:
        t.add_row(
            "update waits for generations / holds off new ones (mean)",
            f"{report.update_wait_s:.2f} s / {report.update_blocked_s:.2f} s",
        )
    if report.token_staleness:
        t.add_row(
            "trained tokens by versions behind",
            ", ".join(f"{k}: {v}" for k, v in report.token_staleness.items()),
        )
    rows = report.off_policy

    def mean(key: str, fmt: str) -> str:
        v = _mean_of(rows, key)
        return "-" if v is None else format(v, fmt)

    t.add_row(
        "clipped / IS-capped / masked tokens",
        f"{mean('clip_frac', '.1%')} / {mean('is_capped_frac', '.1%')} / "
        f"{mean('is_masked_frac', '.1%')}",
    )
    t.add_row(
        "|logp engine - trainer| (on-policy)",
        f"{mean('logp_diff_abs', '.2e')} ({mean('onpolicy_logp_diff_abs', '.2e')}); "
        f"KL k3 {mean('mismatch_kl_k3', '.2e')}",
    )
    t.add_row("wall time", f"{report.wall_s:.0f} s")
    console.print(t)
    if report.families:
        console.print(family_table([FamilyUsage(**f) for f in report.families]))
    if report.replay_seeds:
        console.print(seed_table(report.replay_seeds))
    # not in the table: a cell wraps or cuts a long path to the console's width
    console.print(
        f"outputs in {report.run_dir}: report.json, curve.png, system.png, tb/", soft_wrap=True
    )

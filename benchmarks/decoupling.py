"""Decoupled against synchronous training in DART-GUI's regime, simulated (the timing mode).

DART-GUI's claim is that decoupling rollout from training keeps slow GUI environments busy:
5.5x the environment utilisation, 1.6x the rollout GPU utilisation and 1.9x the training
throughput of a synchronous pipeline (REFERENCE.md). On 2 CPU cores a real run measures the
CPU, not the design (the tiny policy is the bottleneck and a train step costs seconds). So
this benchmark runs `dart_ray.run.driver.train` in the timing mode (`[timing]`,
configs/timing-osworld-7b.toml): every part runs for real (Ray actors, the Serve deployment,
the durable log, the curator, Ray Train, the object-store weight sync, the driver) and only
compute is replaced by calibrated latencies: OSWorld-shaped environment resets and steps,
UI-TARS-1.5-7B generation on simulated H100s (prefill, batched decode), a 7B FSDP train step
on the curated samples, a 7B weight load. Both modes run on the same config, one after the
other, each for the same wall-clock budget; `timing.scale` shrinks every latency alike, so
the ratios are the modelled regime's. Everything it prints is SIMULATED.

Reported per mode, and as ratios decoupled / sync (JSON keys `env_utilisation_ratio`,
`rollout_utilisation_ratio`, `samples_per_hour_ratio`) next to DART-GUI's and the targets:

- environment utilisation: session-seconds inside episodes (reset, policy calls, steps,
  evaluation) over sessions x the run's wall time;
- rollout utilisation: the simulated GPUs' busy time (prefilling or decoding) over their
  time (`RunReport.rollout_utilisation`);
- trained samples per hour of the modelled regime (samples through an optimizer step over
  wall time / timing.scale);
- the staleness histogram of the rows the curator claimed (versions behind), rows dropped as
  too stale, and the audit (`dart-ray audit`): no row lost or trained twice;
- what weight updates cost rollout: the mean time an update waited for the generations in
  flight and held new ones off, and the trained tokens by versions behind (each token's own
  version, `RunReport.token_staleness`).

A third mode, `partial` (`--modes decoupled,partial,sync`), is the decoupled mode with partial
rollouts (`policy.interrupt_on_update`): an update lands at the next token boundary of the
responses in flight instead of waiting for them to finish. Its figures are compared with the
decoupled mode's under `partial_vs_decoupled`.

Between the modes Serve and Ray are shut down, so each starts on a fresh local Ray. The
rollouter and session statistics are read just before the driver tears the parts down (a
wrapper around `runtime.stop`). A watchdog stops a run that outlives its budget by `--grace`
seconds, and no verdict is given when it had to. Prints a table and the command, writes JSON
to benchmarks/results/decoupling.json.

    .venv/bin/python benchmarks/decoupling.py --minutes 6
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a test imports this file

from harness import Bench, console, parser, stop_ray, table
from timing_run import Probe, add_run_args, before_stop, run_root, ticker, watchdog

from dart_ray.config import Config, load_config
from dart_ray.engines.timing import decode_step_s, prefill_s
from dart_ray.run import driver
from dart_ray.store import open_store
from dart_ray.store.audit import audit
from dart_ray.train.timing import train_step_s

DART_GUI = {
    "env_utilisation_ratio": 5.5,
    "rollout_utilisation_ratio": 1.6,
    "samples_per_hour_ratio": 1.9,
}
TARGETS = {
    "env_utilisation_ratio": 8.0,
    "rollout_utilisation_ratio": 1.6,
    "samples_per_hour_ratio": 2.8,
}

MODES = {
    "decoupled": ["run.mode=decoupled"],
    "sync": ["run.mode=sync", "run.sync_sampling=batch"],
    "sync-dynamic": ["run.mode=sync", "run.sync_sampling=dynamic"],
    "partial": ["run.mode=decoupled", "policy.interrupt_on_update=true"],
    "unadmitted": ["run.mode=decoupled", "rollout.admission=false"],
}
"""Each benchmark mode's config: `decoupled` with staleness-aware admission (the default),
`unadmitted` without it (rollouters start episodes as fast as sessions free up), `partial`
decoupled with partial rollouts; the two synchronous baselines, `sync` (a full batch that
fills every session, then a step on what has signal: verl's and DART-GUI's synchronous
pipeline) and `sync-dynamic` (DAPO's dynamic sampling: every session busy until a step's
groups with signal are there). The ratios are against the faster of the syncs run."""

SYNCS = ("sync", "sync-dynamic")

TRAINING_GPUS = 8
"""The GPUs the timing model's train step runs on (`timing.train_tokens_per_s`: 8 H100s)."""

ADMISSION_TARGETS = {
    "stale_dropped_frac": 0.02,  # at most
    "samples_per_hour": 9186.0,  # at least: the decoupled run before admission (2026-12-04)
    "env_utilisation": 0.90,  # at least
}


def make_config(args: argparse.Namespace, mode: str, index: int, root: Path) -> Config:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    overrides = [
        *MODES[mode],
        f'run.run_id="decoupling-{mode}-{stamp}"',
        f'run.root_dir="{root / mode}"',
        f"run.max_minutes={args.minutes}",
        "run.max_versions=100000",  # out of reach: the wall-clock budget ends the run
        "timing.enabled=true",
        f"timing.scale={args.scale}",
        f"env.num_sessions={args.sessions}",
        f"rollout.in_flight={args.sessions}",
        f"policy.http_port={args.port + index}",
        *args.set,
    ]
    cfg = load_config(args.config, overrides)
    if not cfg.timing.enabled:
        raise SystemExit("the benchmark runs in the timing mode (timing.enabled)")
    return cfg


def steady_samples_per_s(steps: list[tuple[float, float]]) -> float | None:
    """Samples trained per second between the end of the first train step and the end of the
    last: the rate of a long run, without the start-up both modes pay once (sessions, the
    trainer's workers, the first batch). None with fewer than two steps."""
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    return sum(n for _, n in steps[1:]) / (steps[-1][0] - steps[0][0])


def run_mode(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict[str, Any]:
    cfg = make_config(args, mode, index, root)
    probe = Probe()
    console().rule(f"{mode}: {args.minutes} min budget (SIMULATED, timing.scale {args.scale})")
    t0 = time.monotonic()
    try:
        with before_stop(probe.read), watchdog(cfg, args.grace) as fired:
            report = driver.train(cfg, on_tick=ticker(probe, t0))
    finally:
        if not args.same_ray:
            stop_ray()  # the next mode starts on a fresh local Ray
    store = open_store(cfg)
    try:
        checked = audit(store.engine, report.run_id)
    finally:
        store.dispose()
    wall = report.wall_s
    modelled_hours = wall / cfg.timing.scale / 3600
    trajectories = sum(report.trajectories.values())
    return {
        "mode": mode,
        "run_id": report.run_id,
        "wall_s": wall,
        "modelled_wall_s": wall / cfg.timing.scale,
        "process_s": time.monotonic() - t0,
        "env_utilisation": probe.episode_s / (probe.sessions * wall) if probe.sessions else 0.0,
        "env_utilisation_driver": report.env_utilisation,
        "env_busy_in_calls": probe.session_busy_s / probe.session_alive_s
        if probe.session_alive_s
        else 0.0,
        "rollout_utilisation": report.rollout_utilisation or 0.0,
        "trainer_utilisation": report.trainer_utilisation,
        "trajectories": trajectories,
        "trajectories_per_hour": trajectories / modelled_hours,
        "samples_trained": report.samples_trained,
        "samples_per_hour": report.samples_trained / modelled_hours,
        "steady_samples_per_hour": 3600 * cfg.timing.scale * steady
        if (steady := steady_samples_per_s(probe.steps)) is not None
        else 0.0,
        "train_steps": report.train_steps,
        "versions": report.versions,
        "staleness": report.staleness,
        "dropped": report.dropped,
        "dropped_stale": int(report.dropped.get("stale", 0)),
        "stale_at": report.stale_at,
        "stale_dropped_frac": report.dropped.get("stale", 0) / trajectories
        if trajectories
        else 0.0,
        "rollouts_started": report.rollouts_started,
        "rows_trained": report.rows_trained,
        "admission_held_s": report.admission_held_s,
        # sessions kept in episodes, per GPU of the modelled trainer: how many desktops one
        # training GPU keeps fed without wasting their rollouts
        "busy_sessions_per_training_gpu": probe.episode_s / wall / TRAINING_GPUS if wall else 0.0,
        "staleness_max": probe.staleness_max,
        "max_staleness": cfg.curation.max_staleness,
        "token_staleness": report.token_staleness,
        "token_lag_mean": mean_lag(report.token_staleness),
        "update_wait_s": report.update_wait_s,
        "update_blocked_s": report.update_blocked_s,
        "audit_ok": checked.ok,
        "audit_breaches": checked.breaches,
        "watchdog_fired_at_s": fired.get("at_s"),
        "probe": asdict(probe),
        "report": report.to_json(),
    }


RATIO_KEYS = (
    "env_utilisation",
    "rollout_utilisation",
    "trainer_utilisation",
    "trajectories_per_hour",
    "samples_per_hour",
    "steady_samples_per_hour",
    "versions",
)


SYNC_DEFINITIONS = {
    "sync": "synchronous, full batch: each round rolls out max(groups_per_step, sessions / "
    "n_rollouts) groups at fixed weights (every session busy in its first wave), waits for "
    "the slowest episode, trains one step on every group with signal, publishes, repeats",
    "sync-dynamic": "synchronous with dynamic sampling (DAPO): each round keeps every session "
    "busy at fixed weights until groups_per_step groups with signal are curated, lets the "
    "episodes in flight finish, trains one step on every group with signal, publishes, repeats",
}


def mean_lag(hist: dict[str, int]) -> float | None:
    """Mean versions behind of a {versions behind: tokens} histogram."""
    n = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / n if n else None


PARTIAL_KEYS = (
    "update_wait_s",
    "update_blocked_s",
    "token_lag_mean",
    "rollout_utilisation",
    "env_utilisation",
    "samples_per_hour",
    "steady_samples_per_hour",
)


def partial_vs_decoupled(p: dict[str, Any], d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each `PARTIAL_KEYS` figure with partial rollouts, without, and their ratio."""
    out = {}
    for k in PARTIAL_KEYS:
        a, b = p.get(k), d.get(k)
        out[k] = {"partial": a, "decoupled": b, "ratio": a / b if a is not None and b else None}
    return out


def ratios(d: dict[str, Any], s: dict[str, Any]) -> dict[str, float | None]:
    """decoupled / sync of each figure, keyed `<figure>_ratio`."""
    return {f"{k}_ratio": d[k] / s[k] if s[k] else None for k in RATIO_KEYS}


def verdict(runs: dict[str, dict[str, Any]], rt: dict[str, float | None]) -> dict[str, bool]:
    if any(m["watchdog_fired_at_s"] is not None for m in runs.values()):
        return {"no verdict: the watchdog had to stop a run": False}
    out = {f"{k} >= {v:g}x": (rt[k] or 0.0) >= v for k, v in TARGETS.items()}
    out["staleness within curation.max_staleness, nothing lost or trained twice"] = all(
        m["audit_ok"] and m["staleness_max"] <= m["max_staleness"] for m in runs.values()
    )
    d = runs["decoupled"]
    lim = ADMISSION_TARGETS
    out[f"stale drops <= {lim['stale_dropped_frac']:.0%} of trajectories (admission)"] = (
        d["stale_dropped_frac"] <= lim["stale_dropped_frac"]
    )
    out[f"samples / modelled hour >= {lim['samples_per_hour']:,.0f}"] = (
        d["samples_per_hour"] >= lim["samples_per_hour"]
    )
    out[f"environment utilisation >= {lim['env_utilisation']:.0%}"] = (
        d["env_utilisation"] >= lim["env_utilisation"]
    )
    return out


def render(results: dict[str, Any]) -> None:
    runs = {m["mode"]: m for m in results["modes"]}
    shown = [m for m in MODES if m in runs]
    rt = results.get("ratios", {})
    a = results["args"]
    base = results.get("baseline", "sync")
    t = table(f"SIMULATED: {' vs '.join(shown)} in DART-GUI's regime, {a['minutes']} min each "
              f"at timing.scale {a['scale']}, {a['sessions']} sessions",
              ("metric", *shown, f"decoupled / {base}", "DART-GUI", "target"), left={"metric"})  # fmt: skip

    def pct(v: float) -> str:
        return f"{v:.1%}"

    def num(v: float) -> str:
        return f"{v:,.0f}"

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    def hist(v: dict[str, int]) -> str:
        return ", ".join(f"{k}: {n}" for k, n in v.items()) or "-"

    def ref(k: str, table: dict[str, float]) -> str:
        return f"{table[k]:g}x" if k in table else ""

    rows: list[tuple[str, str, Callable[[Any], str]]] = [
        ("environment utilisation", "env_utilisation", pct),
        ("rollout (GPU) utilisation", "rollout_utilisation", pct),
        ("trainer utilisation", "trainer_utilisation", pct),
        ("trajectories / modelled hour", "trajectories_per_hour", num),
        ("samples trained / modelled hour", "samples_per_hour", num),
        ("  the same from the first train step on", "steady_samples_per_hour", num),
        ("versions published", "versions", num),
        ("train steps", "train_steps", num),
        ("rollouts started", "rollouts_started", num),
        ("rows trained", "rows_trained", num),
        ("rows dropped as too stale", "dropped_stale", num),
        ("  share of trajectories", "stale_dropped_frac", pct),
        ("  where they waited", "stale_at",
         lambda v: ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "-"),
        ("admission held sessions idle, s", "admission_held_s", num),
        ("busy sessions per training GPU", "busy_sessions_per_training_gpu",
         lambda v: f"{v:.1f}"),
        ("most versions a trained sample was behind", "staleness_max", num),
        ("staleness of claimed rows (versions: rows)", "staleness", hist),
        ("trained tokens by versions behind", "token_staleness", hist),
        ("  mean versions behind per token", "token_lag_mean",
         lambda v: "-" if v is None else f"{v:.3f}"),
        ("update waits for generations, s (mean)", "update_wait_s", secs),
        ("update holds off new generations, s (mean)", "update_blocked_s", secs),
        ("audit (nothing lost or trained twice)", "audit_ok", lambda v: "ok" if v else "BREACH"),
        ("wall time, s (modelled)", "wall_s", lambda v: f"{v:.0f} ({v / a['scale']:.0f})"),
    ]  # fmt: skip
    for label, key, fmt in rows:
        rk = f"{key}_ratio"
        ratio = "" if rk not in rt else "-" if rt[rk] is None else f"{rt[rk]:.2f}x"
        t.add_row(
            label,
            *(fmt(runs[m][key]) for m in shown),
            ratio,
            ref(rk, DART_GUI),
            f">= {TARGETS[rk]:g}x" if rk in TARGETS else "",
        )
    console().print(t)
    for k, v in results.get("verdict", {}).items():
        console().print(
            f"  {k}" if k.startswith("no verdict") else f"  {k}: {'met' if v else 'NOT met'}"
        )
    for k, v in results.get("partial_vs_decoupled", {}).items():
        ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        console().print(f"  partial / decoupled {k}: {ratio}")


def parse_args(argv: list[str] | None) -> Bench:
    p = parser(__doc__, "decoupling")
    p.add_argument("--minutes", type=float, default=6.0, help="wall budget of each mode")
    p.add_argument("--sessions", type=int, default=64, help="env sessions (and in flight)")
    p.add_argument("--modes", default="decoupled,sync",
                   help=f"comma-separated, of {', '.join(MODES)} (decoupled: with admission, "
                        "unadmitted: without, partial: partial rollouts, sync: a full batch "
                        "per round, sync-dynamic: DAPO's dynamic sampling)")  # fmt: skip
    p.add_argument("--grace", type=float, default=180.0, help="watchdog: seconds past budget")
    p.add_argument("--same-ray", action="store_true",
                   help="run every mode on the Ray already running (tests), not a fresh one each")  # fmt: skip
    add_run_args(p, scale=0.1, port=8240)
    return Bench.start(p, argv)


def model_figures(cfg: Config) -> dict[str, float]:
    """The timing model's headline figures at scale 1 (what the run simulates)."""
    t = cfg.timing
    return {
        "prefill_s_per_turn": prefill_s(t, cfg.policy.history_images),
        "decode_step_s_batch_1": decode_step_s(t, 1),
        "decode_step_s_batch_64": decode_step_s(t, 64),
        "train_step_s_per_64_trajectories_x_12_steps": train_step_s(t, 64 * 12),
        "weight_load_s": t.weight_load_s,
        "env_reset_median_s": t.env.reset_median_s,
        "env_step_median_s": t.env.step_median_s,
    }


def main(argv: list[str] | None = None) -> int:
    bench = parse_args(argv)
    args = bench.args
    root = run_root(args, "decoupling")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    cfg = make_config(args, modes[0], 0, root)
    results: dict[str, Any] = {
        "simulated": True,
        **bench.meta,
        "timing": cfg.timing.model_dump(mode="json"),
        "model": model_figures(cfg),
        "env_utilisation_definition": "session-seconds inside episodes / "
        "(sessions x run wall time), run wall time = RunReport.wall_s",
        "modes": [run_mode(args, m, i, root) for i, m in enumerate(modes)],
        "dart_gui": DART_GUI,
        "targets": TARGETS,
    }
    runs = {m["mode"]: m for m in results["modes"]}
    syncs = [m for m in SYNCS if m in runs]
    if "decoupled" in runs and syncs:
        # the baseline is the faster sync (samples trained per modelled hour): a ratio is
        # only as good as the baseline a peer would accept
        base = max(syncs, key=lambda m: runs[m]["samples_per_hour"])
        results["baseline"] = base
        results["baseline_definition"] = SYNC_DEFINITIONS[base]
        rt = ratios(runs["decoupled"], runs[base])
        results["ratios"] = rt
        results.update({k: rt[k] for k in TARGETS})  # the headline keys at the top level
        results["stale_dropped_frac"] = runs["decoupled"]["stale_dropped_frac"]
        if "unadmitted" in runs:
            results["stale_dropped_frac_unadmitted"] = runs["unadmitted"]["stale_dropped_frac"]
        results["verdict"] = verdict(runs, rt)
    if {"decoupled", "partial"} <= set(runs):
        results["partial_vs_decoupled"] = partial_vs_decoupled(runs["partial"], runs["decoupled"])
    render(results)
    bench.write(results, note=f"runs in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

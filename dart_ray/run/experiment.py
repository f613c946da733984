"""`dart-ray experiment`: a learning claim as arms x seeds, measured before and after on the
same held-out tasks, with intervals over seeds and tasks.

    dart-ray experiment configs/experiments/default.toml

An experiment file names a run config, the seeds, the splits to score and the arms:

- `rl`: `dart-ray train` as the config says (RL with DART's curation);
- `lr0`: the same loop with `train.lr = 0` (every part runs, the weights never move);
- `rft`: the same loop and budget, `algo.objective = "rft"` (rejection-sampling fine-tuning:
  the policy's own successes, plain NLL);
- `sft`: more SFT of the warm start on the training tasks' oracle demonstrations, for the
  wall-clock the `rl` runs took (a reference line: it reads the oracle, RL does not);
- any other name: an arm of `base` (one of the four) with its own `overrides`.

Each run is a subprocess (`python -m dart_ray.cli train ...`, its own Ray), its newest durable
checkpoint is scored greedily with `dart-ray eval`'s code on every split asked, and the warm
start once per split (the "before" every run of the experiment shares). Results accumulate in
the JSON after every run, so an interrupted experiment continues with `--resume`. The
statistics are `dart_ray.evaluation.stats`; the figure is `reporting.experiment`.

Only `validation` choices belong in a file that reads `heldout` once: run an experiment on
`validation` (`splits = ["validation"]`) to choose, then on `heldout` to report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from dart_ray.config import Config, ConfigError, load_config
from dart_ray.config.base import Section
from dart_ray.evaluation.stats import lift_difference, paired_lift

Kind = Literal["rl", "lr0", "rft", "sft"]
ARM_OVERRIDES: dict[str, tuple[str, ...]] = {
    "rl": (),
    "lr0": ("train.lr=0",),
    "rft": ("algo.objective=rft",),
    "sft": (),
}
"""What each built-in arm changes in the run config."""


class ArmSpec(Section):
    base: Kind | None = None
    """The built-in arm this one is (default: its own name, which must then be built in)."""
    overrides: tuple[str, ...] = ()
    """`key=value` overrides of this arm, after the experiment's own."""
    seeds: tuple[int, ...] | None = None
    """This arm's seeds (default: the experiment's)."""


class SftSpec(Section):
    lr: float = Field(default=1e-3, gt=0)
    """Learning rate of the `sft` arm (the warm starts' recipe: docs/LEARNING.md)."""
    batch_size: int = Field(default=16, ge=1)
    """Demonstrations per SFT step."""
    tasks: int = Field(default=1000, ge=1)
    """Training tasks the oracle demonstrates (the first N of `env.tasks`)."""
    minutes: float | None = Field(default=None, gt=0)
    """Wall-clock of each `sft` run; unset: the mean of the `rl` arm's runs."""


class ExperimentSpec(Section):
    name: str
    """Names the results: `benchmarks/results/learning/<name>.json` and `.png`."""
    config: Path
    """The run config every arm starts from."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of every arm (`run.seed`) unless the arm names its own."""
    splits: tuple[str, ...] = ("heldout",)
    """Splits scored before and after (`heldout`, and `ood` where the suite has it; only
    `validation` for an experiment that chooses something)."""
    overrides: tuple[str, ...] = ()
    """`key=value` overrides of every run."""
    arms: dict[str, ArmSpec]
    """The arms, by name (`[arms.rl]`, `[arms.lr0]`, ...)."""
    sft: SftSpec = SftSpec()
    """The `sft` arm's settings."""

    @model_validator(mode="after")
    def _arms_known(self) -> ExperimentSpec:
        for name, arm in self.arms.items():
            if arm.base is None and name not in ARM_OVERRIDES:
                raise ValueError(f"arm {name!r} is not built in: give it a base (rl, lr0, ...)")
        bad = [s for s in self.splits if s not in ("train", "validation", "heldout", "ood")]
        if bad:
            raise ValueError(f"unknown splits {bad}")
        kinds = set(self.kinds().values())
        if "sft" in kinds and self.sft.minutes is None and "rl" not in kinds:
            raise ValueError("an sft arm needs sft.minutes or an rl arm to take its time")
        return self

    def kinds(self) -> dict[str, Kind]:
        return {n: a.base or n for n, a in self.arms.items()}  # type: ignore[misc]

    def seeds_of(self, arm: str) -> tuple[int, ...]:
        return self.arms[arm].seeds or self.seeds

    def run_overrides(self, arm: str, seed: int, run_id: str) -> list[str]:
        kind = self.kinds()[arm]
        return [
            *self.overrides,
            *ARM_OVERRIDES[kind],
            *self.arms[arm].overrides,
            f"run.seed={seed}",
            f"run.run_id={run_id}",
        ]


def load_spec(path: str | Path) -> ExperimentSpec:
    p = Path(path)
    try:
        return ExperimentSpec.model_validate(tomllib.loads(p.read_text()))
    except FileNotFoundError:
        raise ConfigError(f"experiment file {p} does not exist") from None
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise ConfigError(f"experiment file {p}: {e}") from None


def git_commit() -> tuple[str, bool]:
    """(HEAD's commit, whether the work tree has uncommitted changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return head, bool(dirty)


# ---------------------------------------------------------------------------- one run


def _score(config: Config, model: Path, split: str) -> dict[str, float]:
    """Greedy success of `model` on every task of `split`: task id -> 0/1 (a task with no
    scored episode, its environment or the policy failed, is left out and said)."""
    from dart_ray.evaluation.local import run_eval

    res = run_eval(config, model, split)
    if res.unscored:
        why = ", ".join(f"{n} {s}" for s, n in res.excluded_by_status().items())
        print(f"  {split}: {len(res.unscored)} tasks not scored ({why}): {res.unscored[:3]}")
    return {
        t: float(any(r >= res.success_threshold for r in rs[:1])) for t, rs in res.per_task.items()
    }


def _train(config_path: Path, overrides: list[str], log: Path) -> None:
    """One `dart-ray train` in a process of its own (its own Ray), its output to `log`."""
    cmd = [sys.executable, "-m", "dart_ray.cli", "train", "-c", str(config_path), *overrides]
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {rc}; its output: {log}")


def _newest_checkpoint(config: Config, run_id: str) -> Path:
    from dart_ray.store import open_store
    from dart_ray.train.resume import resume_point

    store = open_store(config)
    try:
        path, _ = resume_point(store, run_id)
    finally:
        store.dispose()
    if path is None:
        raise RuntimeError(f"run {run_id} left no durable checkpoint to score")
    return Path(path)


def run_one(spec: ExperimentSpec, arm: str, seed: int, sft_minutes: float | None) -> dict[str, Any]:
    """Train (or SFT) one arm at one seed; returns its record without the scores."""
    kind = spec.kinds()[arm]
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    run_id = f"{spec.name}-{arm}-s{seed}-{stamp}"
    overrides = spec.run_overrides(arm, seed, run_id)
    config = load_config(spec.config, overrides)
    run_dir = config.run.root_dir / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if kind == "sft":
        from dart_ray.envs.suites import load_suite
        from dart_ray.warmstart.sft import sft

        assert sft_minutes is not None
        r = sft(
            config.policy.model_path,
            run_dir / "model",
            load_suite(config, "train")[: spec.sft.tasks],
            config.env,
            steps=10**9,
            batch_size=spec.sft.batch_size,
            lr=spec.sft.lr,
            seed=seed,
            history_images=config.policy.history_images,
            max_seconds=60 * sft_minutes,
        )
        return {
            "seed": seed,
            "run_id": run_id,
            "model": str(r.out),
            "versions": None,
            "sft_steps": r.steps,
            "minutes": r.seconds / 60,
            "command": f"dart-ray sft -c {spec.config} --base {config.policy.model_path} "
            f"--out {r.out} --minutes {sft_minutes:.2f} --tasks {spec.sft.tasks} "
            f"--lr {spec.sft.lr} run.seed={seed}",
        }
    log = run_dir.with_suffix(".log")
    _train(spec.config, overrides, log)
    report = json.loads((run_dir / "report.json").read_text())
    return {
        "seed": seed,
        "run_id": run_id,
        "model": str(_newest_checkpoint(config, run_id)),
        "versions": report["versions"],
        "minutes": report["wall_s"] / 60,
        "rollouts": sum(report["trajectories"].values()),
        "started": report.get("rollouts_started", 0),
        "dropped": report["dropped"],
        "admission_held_s": report.get("admission_held_s", 0.0),
        "wall_minutes": (time.monotonic() - t0) / 60,
        "command": f"dart-ray train -c {spec.config} {' '.join(overrides)}",
    }


# ---------------------------------------------------------------------------- the whole


def _before(result: dict[str, Any], arm: dict[str, Any], split: str) -> dict[str, float]:
    """The scores an arm's runs started from: its own warm start's where it names one."""
    own = arm.get("warm_start")
    if own and own != result.get("warm_start"):
        return result["warm_starts"][own][split]  # type: ignore[no-any-return]
    return result["before"][split]  # type: ignore[no-any-return]


def summarise(result: dict[str, Any]) -> None:
    """Fill every arm's statistics from its seeds' scores (in place): per split the mean
    lift with its interval and spread, and each arm against `rl`; per arm the share of its
    runs' started rollouts dropped stale. Rates are 0..1."""
    for arm in result["arms"].values():
        counted = [s for s in arm["seeds"] if s.get("started")]
        if counted:
            stale = sum(s["dropped"].get("stale", 0) for s in counted)
            arm["stale_frac"] = stale / sum(s["started"] for s in counted)
    for split, tasks in result["tasks"].items():
        scores, befores = {}, {}
        for name, arm in result["arms"].items():
            runs = [s for s in arm["seeds"] if split in s.get("scores", {})]
            if not runs:
                continue
            before = np.array([_before(result, arm, split)[t] for t in tasks])
            after = np.array([[s["scores"][split][t] for t in tasks] for s in runs])
            scores[name], befores[name] = after, before
            lift = paired_lift(before, after)
            stats = {
                "mean_lift": lift.mean,
                "lift_ci95": [lift.lo, lift.hi],
                "lift_min": lift.spread[0],
                "lift_max": lift.spread[1],
                "n_seeds": len(runs),
            }
            for s, per in zip(runs, lift.per_seed, strict=True):
                s["before" if split == "heldout" else f"{split}_before"] = float(before.mean())
                s["after" if split == "heldout" else f"{split}_after"] = float(
                    np.mean([s["scores"][split][t] for t in tasks])
                )
                s.setdefault("lift", {})[split] = per
            if split == "heldout":
                arm |= stats
            arm.setdefault("splits", {})[split] = stats
        if "rl" in scores:
            for name, after in scores.items():
                if name == "rl":
                    continue
                d, lo, hi = lift_difference(
                    befores["rl"], scores["rl"], after, other_before=befores[name]
                )
                vs = {"diff": d, "ci95": [lo, hi]}
                result["arms"][name]["splits"][split]["rl_minus_this"] = vs
                if split == "heldout":
                    result["arms"][name]["rl_minus_this"] = vs


def run_experiment(spec: ExperimentSpec, out: Path, resume: bool = False) -> dict[str, Any]:
    commit, dirty = git_commit()
    base = load_config(spec.config, list(spec.overrides))
    result: dict[str, Any]
    if resume and out.is_file():
        result = json.loads(out.read_text())
    else:
        result = {
            "name": spec.name,
            "config": str(spec.config),
            "suite": str(base.env.heldout_tasks or "built-in"),
            "units": "success rates in 0..1 (greedy, one episode per task); lifts are after - before",
            "commit": commit,
            "dirty": dirty,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "spec": json.loads(spec.model_dump_json()),
            "warm_start": str(base.policy.model_path),
            "tasks": {},
            "before": {},
            "arms": {name: {"kind": kind, "seeds": []} for name, kind in spec.kinds().items()},
        }
    for split in spec.splits:
        if split not in result["before"]:
            print(f"scoring the warm start {base.policy.model_path} on {split}", flush=True)
            scores = _score(base, base.policy.model_path, split)
            result["tasks"][split] = sorted(scores)
            result["before"][split] = scores
    for name in spec.arms:  # an arm that starts from another model: its own "before"
        own = load_config(spec.config, spec.run_overrides(name, 0, "x")).policy.model_path
        result["arms"].setdefault(name, {"kind": spec.kinds()[name], "seeds": []})
        result["arms"][name]["warm_start"] = str(own)
        for split in spec.splits:
            done = result.setdefault("warm_starts", {}).setdefault(str(own), {})
            if str(own) != result["warm_start"] and split not in done:
                print(f"scoring arm {name}'s warm start {own} on {split}", flush=True)
                done[split] = _score(base, own, split)
    result["heldout_tasks"] = len(result["tasks"].get("heldout", []))
    order = sorted(spec.arms, key=lambda n: (spec.kinds()[n] == "sft", n != "rl"))
    for arm in order:
        for seed in spec.seeds_of(arm):
            runs = result["arms"][arm]["seeds"]
            if any(s["seed"] == seed for s in runs):
                continue
            sft_minutes = spec.sft.minutes
            if spec.kinds()[arm] == "sft" and sft_minutes is None:
                rl = [
                    s["minutes"]
                    for a, r in result["arms"].items()
                    if r["kind"] == "rl"
                    for s in r["seeds"]
                ]
                sft_minutes = float(np.mean(rl))
            print(f"{spec.name}: arm {arm}, seed {seed}", flush=True)
            rec = run_one(spec, arm, seed, sft_minutes)
            config = load_config(spec.config, spec.run_overrides(arm, seed, rec["run_id"]))
            rec["scores"] = {s: _score(config, Path(rec["model"]), s) for s in spec.splits}
            rec["commit"], rec["dirty"] = commit, dirty  # a resumed file mixes commits
            runs.append(rec)
            summarise(result)
            result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(
                f"  {arm} seed {seed}: "
                + ", ".join(
                    f"{s} {np.mean(list(v.values())):.1%}" for s, v in rec["scores"].items()
                ),
                flush=True,
            )
    summarise(result)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(result: dict[str, Any]) -> list[str]:
    """The experiment as lines of a table: each arm's lift per split, in points."""
    lines = [f"experiment {result['name']} ({result['config']}, commit {result['commit'][:10]})"]
    for split, tasks in result["tasks"].items():
        before = np.mean(list(result["before"][split].values()))
        lines.append(f"{split}: {len(tasks)} tasks, warm start {before:.1%}")
        for name, arm in result["arms"].items():
            st = arm.get("splits", {}).get(split)
            if st is None:
                continue
            lo, hi = st["lift_ci95"]
            row = (
                f"  {name:<8} {st['n_seeds']} seeds  lift {100 * st['mean_lift']:+.1f} "
                f"({100 * lo:+.1f}..{100 * hi:+.1f}), runs {100 * st['lift_min']:+.1f}..{100 * st['lift_max']:+.1f}"
            )
            if "stale_frac" in arm:
                row += f", {100 * arm['stale_frac']:.1f}% stale"
            if "rl_minus_this" in st:
                d = st["rl_minus_this"]
                row += f"; rl - {name} {100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f}..{100 * d['ci95'][1]:+.1f})"
            lines.append(row)
    return lines


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("experiment", help="arms x seeds, before and after, with intervals")
    p.add_argument("spec", type=Path, help="experiment TOML (configs/experiments/*.toml)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON (default benchmarks/results/learning/NAME.json)",
    )
    p.add_argument("--resume", action="store_true", help="continue the runs the JSON lacks")

    def fn(args: argparse.Namespace, out: object) -> int:
        from dart_ray.reporting.experiment import draw_experiment

        spec = load_spec(args.spec)
        path = args.out or Path("benchmarks/results/learning") / f"{spec.name}.json"
        result = run_experiment(spec, path, resume=args.resume)
        draw_experiment(result, path.with_suffix(".png"))
        print("\n".join(table(result)))
        print(f"wrote {path} and {path.with_suffix('.png')}")
        return 0

    p.set_defaults(fn=fn)

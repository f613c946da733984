"""`dart-ray train`: run the main job with live progress and the final report."""

from __future__ import annotations

import argparse
import time

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from rich.console import Console
from rich.progress import (
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from dart_ray.config import Config
from dart_ray.envs.suites import load_suite


class RateColumn(ProgressColumn):
    """`195 (24.4/min)`: how many so far and how fast, for counts without a goal."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = f" ({task.completed / elapsed * 60:.1f}/min)" if elapsed > 1 else ""
        return Text(f"{task.completed:,.0f}{rate}")


def make_progress(out: Console) -> Progress:
    """The live lines of `dart-ray train`: trajectories, train steps and versions, each with
    its count, rate and elapsed time."""
    return Progress(
        TextColumn("{task.description:<14}"),
        RateColumn(),
        TimeElapsedColumn(),
        console=out,
        transient=False,
    )


PLAIN_EVERY_S = 30.0
"""Seconds between progress lines when stdout is not a terminal (a job's log file)."""


class TrainProgress:
    """The live counts of `dart-ray train`: rich's bars on a terminal; elsewhere (a job log,
    `ray job logs`, a file) rich draws its bars only when they stop, so one plain line every
    `every_s` seconds instead, flushed, so that a log file shows the run while it runs."""

    NAMES = ("trajectories", "train steps", "versions")

    def __init__(self, out: Console, every_s: float = PLAIN_EVERY_S) -> None:
        self.out, self.every_s = out, every_s
        self.live = out.is_terminal
        self.progress = make_progress(out)
        self._bars: dict[str, TaskID] = {}
        self._t0 = time.monotonic()
        self._last: float | None = None
        self._counts = dict.fromkeys(self.NAMES, 0)

    def __enter__(self) -> TrainProgress:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def note(self, line: str) -> None:
        """A set-up line (above the bars on a terminal), flushed."""
        print(line, file=self.out.file, flush=True)

    def show(self, counts: dict[str, int]) -> None:
        """The newest counts (keys of NAMES; a missing one keeps its last value)."""
        if not self._bars:
            for name in self.NAMES:
                self._bars[name] = self.progress.add_task(name, total=None)
        self._counts |= counts
        for name, n in counts.items():
            self.progress.update(self._bars[name], completed=n)
        now = time.monotonic()
        if self.live or (self._last is not None and now - self._last < self.every_s):
            return
        self._last = now
        elapsed = now - self._t0
        cols = []
        for name, n in self._counts.items():
            rate = f" ({n / elapsed * 60:.1f}/min)" if elapsed > 1 else ""
            cols.append(f"{name} {n:,}{rate}")
        stamp = time.strftime("%H:%M:%S", time.gmtime(elapsed))
        print(f"[{stamp}] " + ", ".join(cols), file=self.out.file, flush=True)


def run_train(config: Config, out: Console) -> int:
    from dart_ray.reporting.report import render
    from dart_ray.run import driver, preflight, runtime

    # bad task files and missing secrets fail here, in one line, before Ray starts or the
    # log is touched
    load_suite(config, "train")
    preflight.check_secrets(config)

    progress = TrainProgress(out)

    def tick(parts: runtime.Parts) -> None:
        counts: dict[str, int] = {}
        try:  # a rollouter being restarted by Ray has no stats to give this tick
            stats = ray.get([r.stats.remote() for r in parts.rollouters], timeout=10)
            counts["trajectories"] = sum(sum(s.logged.values()) for s in stats)
        except (RayActorError, ActorUnavailableError, GetTimeoutError):
            pass
        history = ray.get(parts.control.history.remote())
        counts["train steps"] = len(history)
        # no total: run.max_versions is a cap (10,000 by default), not a goal; the run ends
        # at run.max_minutes, so the counts say how much and how fast
        counts["versions"] = int(history[-1].get("version", 0)) if history else 0
        progress.show(counts)

    def started(parts: runtime.Parts) -> None:
        # whole, each on a line of its own: a console cuts long lines to its width (80 in a
        # job log)
        progress.note(f"run {parts.run_id}: outputs in {parts.run_dir}")
        progress.note(f"run {parts.run_id}: policy server at {parts.policy_url}")

    with progress:
        report = driver.train(config, on_tick=tick, on_start=started)
    render(report, out)
    return 0


def add_parser(sub: argparse._SubParsersAction, add_config_args, load) -> None:  # type: ignore[type-arg,no-untyped-def]
    p = sub.add_parser("train", help="train a policy (the main job)")
    p.add_argument("--resume", metavar="RUN_ID", default=None, help="continue this run")
    add_config_args(p)

    def fn(args: argparse.Namespace, out: Console) -> int:
        overrides = list(args.overrides)
        if args.resume:
            overrides += [f"run.run_id={args.resume}", "run.resume=true"]
            args.overrides = overrides
        return run_train(load(args), out)

    p.set_defaults(fn=fn)


def add_sft_eval(sub: argparse._SubParsersAction, add_config_args, load) -> None:  # type: ignore[type-arg,no-untyped-def]
    """`dart-ray sft` and `dart-ray eval`."""
    from pathlib import Path

    p = sub.add_parser(
        "sft", help="warm-start a model on oracle demonstrations (MiniDesk, MiniWoB++)"
    )
    p.add_argument("--base", type=Path, default=None, help="model folder (default: build tiny)")
    p.add_argument("--out", type=Path, required=True, help="folder for the fine-tuned model")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tasks", type=int, default=200, help="training tasks to demonstrate")
    p.add_argument(
        "--save-every", type=int, default=0, help="also write OUT-stepN every N steps (0: off)"
    )
    p.add_argument(
        "--minutes", type=float, default=None, help="also stop after this wall-clock (minutes)"
    )
    add_config_args(p)

    def sft_fn(args: argparse.Namespace, out: Console) -> int:
        import tempfile

        from dart_ray.models.tiny import save_tiny_model
        from dart_ray.warmstart.sft import sft

        cfg = load(args)
        base = args.base
        if base is None:
            base = save_tiny_model(Path(tempfile.mkdtemp(prefix="dart-tiny-")))
        tasks = load_suite(cfg, "train")[: args.tasks]
        r = sft(
            base,
            args.out,
            tasks,
            cfg.env,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=cfg.run.seed,
            history_images=cfg.policy.history_images,
            save_every=args.save_every,
            max_seconds=None if args.minutes is None else 60 * args.minutes,
        )
        out.print(
            f"wrote {r.out}: {r.steps} steps over {r.demonstrations} demonstrations, "
            f"final loss {r.final_loss:.3f}, {r.seconds:.0f} s"
        )
        return 0

    p.set_defaults(fn=sft_fn)

    e = sub.add_parser("eval", help="success rate of a model on a task suite")
    e.add_argument("--checkpoint", type=Path, required=True, help="model folder")
    e.add_argument(
        "--suite",
        default="heldout",
        help="a split ('train', 'validation', 'heldout', 'ood') or a JSONL file",
    )
    e.add_argument("--tasks", type=int, default=0, help="evaluate the first N tasks (0: all)")
    e.add_argument("--samples", type=int, default=1, help="episodes per task (pass@k)")
    e.add_argument("--json", type=Path, default=None, help="also write the result here")
    e.add_argument(
        "--ray",
        action="store_true",
        help="run the environments as EnvSession actors on Ray, as a run does (a local Ray, "
        "or cluster.address); the model stays in this process",
    )
    add_config_args(e)

    def eval_fn(args: argparse.Namespace, out: Console) -> int:
        import json

        from dart_ray.evaluation.local import run_eval

        cfg = load(args)
        res = run_eval(cfg, args.checkpoint, args.suite, args.tasks, args.samples, args.ray)
        title = f"{args.checkpoint} on {args.suite}, {res.sampling}"
        t = Table("task", "episodes", "success", title=title)
        for task_id, rewards in sorted(res.per_task.items()):
            wins = sum(r >= res.success_threshold for r in rewards)
            t.add_row(task_id, str(len(rewards)), f"{wins}/{len(rewards)}")
        out.print(t)
        if res.families:
            f = Table("family", "tasks", "success", title="by family (first episode)")
            for family, (solved, scored) in res.by_family().items():
                f.add_row(family, str(scored), f"{solved}/{scored} ({solved / scored:.0%})")
            out.print(f)
        for u in res.excluded:  # never a 0: the environment or the server failed, not the model
            out.print(f"not scored: {u.task_id}: {u.status.value}: {u.error}")
        summary = {
            "checkpoint": str(args.checkpoint.resolve()),
            "suite": args.suite,
            "sampling": res.sampling,
            "tasks": len(res.per_task),
            "episodes": res.episodes,
            # greedy: the success rate; sampled: the fraction of episodes that succeeded
            "success": res.success(1) if res.greedy else res.success_per_episode(),
            f"pass@{args.samples}": res.success(args.samples),
            "aborted": res.aborted,
            "not_scored": res.excluded_by_status(),
            "excluded": [
                {"task": u.task_id, "status": u.status.value, "error": u.error}
                for u in res.excluded
            ],
            "by_family": {k: {"solved": a, "tasks": b} for k, (a, b) in res.by_family().items()},
            "per_task": res.per_task,
        }
        out.print(res.headline())
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
        return 0

    e.set_defaults(fn=eval_fn)

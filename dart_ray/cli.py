"""The `dart-ray` console script.

    dart-ray config show [--config F] [--docs] [key=value ...]
    dart-ray db init     [--config F] [key=value ...]
    dart-ray status      [--config F] [--run RUN] [key=value ...]
    dart-ray model init  --out DIR [--force] [--seed N] [--min-pixels N] [--max-pixels N]
    dart-ray serve       [--model DIR] [--engine hf|vllm] [--host H] [--port N] [--config F]
                         [key=value ...]

Every command loads and validates the configuration first; any configuration or storage
problem ends the command with one clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dart_ray.config import Config, ConfigError, load_config, reference_markdown, resolved_docs
from dart_ray.config.masking import install_log_masking
from dart_ray.envs.base import EnvInputError
from dart_ray.reporting.plain import plain_streams
from dart_ray.store import StoreError, open_store
from dart_ray.store.runs import get_run, latest_run

DEFAULT_CONFIG = "configs/default.toml"


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=None, help=f"TOML file (default {DEFAULT_CONFIG})")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. algo.eps_high=0.2")


def _load(args: argparse.Namespace) -> Config:
    path = args.config
    if path is None:
        from pathlib import Path

        path = DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None
    return load_config(path, args.overrides)


def cmd_config_show(args: argparse.Namespace, out: Console) -> int:
    cfg = _load(args)
    if args.markdown:
        print(reference_markdown(), end="")
    elif args.docs:
        for key, value, default, doc in resolved_docs(cfg):
            note = "" if value == default else f"  [dim](default {escape(default)})[/]"
            out.print(f"[bold]{key}[/] = {escape(value)}{note}", highlight=False)
            out.print(f"    {doc}", highlight=False, soft_wrap=True)
    else:
        out.print_json(json.dumps(cfg.redacted()))
    return 0


def cmd_db_init(args: argparse.Namespace, out: Console) -> int:
    cfg = _load(args)
    store = open_store(cfg, init=True)
    out.print(
        f"durable log ready at {store.engine.url.render_as_string(hide_password=True)}; "
        f"blobs under {store.blobs.base}"
    )
    store.dispose()
    return 0


def cmd_status(args: argparse.Namespace, out: Console) -> int:
    from dart_ray.reporting.status import status_lines

    cfg = _load(args)
    store = open_store(cfg, existing=True)
    try:
        where = store.engine.url.render_as_string(hide_password=True)
        run = get_run(store.engine, args.run) if args.run else latest_run(store.engine)
        if run is None:
            what = f"run {args.run!r}" if args.run else "any run"
            print(f"no record of {what} in {where} (start one with `dart-ray train`)")
            return 1 if args.run else 0
        # plain print: a console would cut lines to its width when piped
        print("\n".join(status_lines(store, run, tasks=args.tasks)))
        return 0
    finally:
        store.dispose()


def cmd_audit(args: argparse.Namespace, out: Console) -> int:
    from dart_ray.store.audit import audit, render

    cfg = _load(args)
    store = open_store(cfg, existing=True)
    try:
        if get_run(store.engine, args.run) is None:
            where = store.engine.url.render_as_string(hide_password=True)
            print(f"dart-ray audit: no record of run {args.run!r} in {where}", file=sys.stderr)
            return 2
        report = audit(store.engine, args.run, live=args.live)
    finally:
        store.dispose()
    if args.json:
        print(report.to_json())
    else:
        print(render(report))
    return 0 if report.ok else 1


def cmd_report(args: argparse.Namespace, out: Console) -> int:
    """Redraw a run's figure and print its learning table from the log (and report.json)."""
    import dataclasses

    from dart_ray.reporting.families import family_table, family_usage
    from dart_ray.reporting.figures import (
        band_width,
        draw_curve,
        draw_system_figure,
        eval_point,
        eval_refusal,
        heldout_points,
        sampled_points,
    )
    from dart_ray.reporting.plots import wilson
    from dart_ray.reporting.report import RunReport, heldout_line

    cfg = _load(args)
    store = open_store(cfg, existing=True)
    try:
        run = get_run(store.engine, args.run)
        if run is None:
            where = store.engine.url.render_as_string(hide_password=True)
            print(f"dart-ray report: no record of run {args.run!r} in {where}", file=sys.stderr)
            return 2
        sampled = store.log.success_by_version(args.run)
        episodes = store.log.episode_intervals(args.run)
        usage = store.log.task_usage(args.run)
        own = {Path(c.path).resolve() for c in store.checkpoints.list(args.run) if c.path}
    finally:
        store.dispose()
    run_dir = cfg.run.root_dir / args.run
    base = run.config.get("policy", {}).get("model_path") or run_dir / "base-model"
    own |= {Path(base).resolve(), *(p.resolve() for p in run_dir.glob("checkpoints/v*"))}
    summaries = {f: json.loads(Path(f).read_text()) for f in args.eval}
    for f, summary in summaries.items():
        if (why := eval_refusal(summary, args.run, own)) is not None:
            print(
                f"dart-ray report: {f} is not a held-out point of this run: {why}", file=sys.stderr
            )
            return 2
    saved = run_dir / "report.json"
    names = {f.name for f in dataclasses.fields(RunReport)}
    if saved.is_file():
        data = {k: v for k, v in json.loads(saved.read_text()).items() if k in names}
        report = RunReport(**data)
    else:  # the run is going, or died before its report: the log's part of the figure
        report = RunReport.empty(args.run)
        report.versions = max(sampled, default=0)
    report.sampled = [[v, k, n] for v, (k, n) in sorted(sampled.items())]
    evals = [eval_point(summary) for summary in summaries.values()]
    curve = Path(args.out) if args.out else run_dir / "curve.png"
    figure = draw_curve(report, curve, evals=evals)
    system = draw_system_figure(report, episodes, curve.with_name(f"{curve.stem}-system.png")
                                if args.out else run_dir / "system.png")  # fmt: skip
    t = Table("versions", "episodes", "sampled success", title=f"run {args.run}: rollouts")
    w = band_width(report)
    for p in sampled_points(report):
        lo = round(p.version - (w - 1) / 2)
        t.add_row(f"v{lo}-{lo + w - 1}", str(p.n), f"{p.rate:.1%}")
    out.print(t)
    # from the log, whatever report.json says: a run still going is counted to now
    out.print(
        family_table(
            family_usage(usage), title=f"run {args.run}: rollouts per trained row, by family"
        )
    )
    out.print(f"held-out success before -> after: {heldout_line(report)}")
    for p in heldout_points(report, evals):
        lo, hi = wilson(p.successes, p.n)
        out.print(f"  held out at v{p.version:g}: {p.rate:.1%} ({lo:.1%}-{hi:.1%}, {p.n} tasks)")
    out.print(f"figures: {figure}, {system}")
    return 0


def cmd_model_init(args: argparse.Namespace, out: Console) -> int:
    from pathlib import Path

    from dart_ray.models.tiny import TinySpec, num_parameters, save_tiny_model

    dest = Path(args.out)
    if (dest / "config.json").exists() and not args.force:
        print(f"dart-ray model: {dest} already holds a model (use --force to replace it)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        spec = TinySpec(
            seed=args.seed,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
            hidden_size=args.hidden_size,
            num_layers=args.layers,
        )
    except ValueError as e:
        print(f"dart-ray model: {e}", file=sys.stderr)
        return 2
    save_tiny_model(dest, spec)
    from dart_ray.models.loading import load_model

    n = num_parameters(load_model(dest))
    out.print(f"tiny Qwen2.5-VL ({n:,} parameters, seed {spec.seed}) written to {dest}")
    return 0


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def quiet_third_party() -> None:
    """A healthy run prints set-up lines, progress and the report; `-v` brings back:
    - Serve's INFO lines in the driver ("Started Serve", "Application ... is ready", the
      router's replica updates). Serve sets its logger's level when it starts, so a filter
      (which it leaves alone) drops them;
    - Ray's notice that token authentication is on (it is, and that is the point);
    - the raylet messages of `RAY_NOTICES_TO_DROP`."""
    logging.getLogger("ray.serve").addFilter(_BelowWarning())
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    _drop_raylet_notices()


RAY_NOTICES_TO_DROP = (
    # The raylet warns once more than 4x `maximum_startup_concurrency` worker processes have
    # started; Ray sets that to min(cpu_count, num_cpus), 2 here, and offers no setting for
    # it (ray#3644). A run's parts are actors with fractional CPUs by design: expected.
    "PYTHON worker processes have been started",
    # Serve's shutdown kills its controller while its own long-polls are pending.
    "killed by `ray.kill`",
)
"""Raylet messages a healthy run prints that say nothing to act on (with -v they show)."""


def _drop_raylet_notices() -> None:
    """Ray prints the raylet's messages through `ray._private.worker.print_to_stdstream`
    (its error-message listener looks the function up at each call); wrap it to drop the
    known notices. A Ray without that function keeps printing them: nothing breaks."""
    from ray._private import worker

    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_dart_ray_filter", False):
        return

    def filtered(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = [
            ln for ln in data.get("lines", []) if not any(n in ln for n in RAY_NOTICES_TO_DROP)
        ]
        if lines:
            original({**data, "lines": lines}, ignore_prefix)

    filtered._dart_ray_filter = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = filtered


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dart-ray", description="Decoupled multi-turn RL for GUI agents on Ray."
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=os.environ.get("DART_RAY_VERBOSE", "") not in ("", "0"),
        help="also show Ray's and Serve's own log lines (env: DART_RAY_VERBOSE=1)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    cfg = sub.add_parser("config", help="inspect the configuration")
    cfg_sub = cfg.add_subparsers(dest="action", required=True)
    show = cfg_sub.add_parser("show", help="print the resolved configuration (secrets masked)")
    show.add_argument(
        "--docs", action="store_true", help="print every key with its resolved value and meaning"
    )
    show.add_argument("--markdown", action="store_true", help="the reference as Markdown")
    _add_config_args(show)
    show.set_defaults(fn=cmd_config_show)

    db = sub.add_parser("db", help="manage the durable log")
    db_sub = db.add_subparsers(dest="action", required=True)
    init = db_sub.add_parser("init", help="create the database and tables if missing")
    _add_config_args(init)
    init.set_defaults(fn=cmd_db_init)

    status = sub.add_parser("status", help="buffer health, per-task success, newest checkpoint")
    status.add_argument("--run", default=None, help="run id (default: the newest run)")
    status.add_argument("--tasks", action="store_true", help="every task's success, not a summary")
    _add_config_args(status)
    status.set_defaults(fn=cmd_status)

    aud = sub.add_parser(
        "audit", help="prove from the log that a run lost and replayed nothing (exit 1 if not)"
    )
    aud.add_argument("run", help="run id")
    aud.add_argument(
        "--live", action="store_true", help="the run is going: episodes in flight are no breach"
    )
    aud.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_config_args(aud)
    aud.set_defaults(fn=cmd_audit)

    rep = sub.add_parser("report", help="redraw a run's learning figure and table from the log")
    rep.add_argument("run", help="run id")
    rep.add_argument("--out", default=None, help="figure path (default: RUN_DIR/curve.png)")
    rep.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="JSON",
        help="a `dart-ray eval --json` file of one of the run's checkpoints (repeatable)",
    )
    _add_config_args(rep)
    rep.set_defaults(fn=cmd_report)

    from dart_ray.run.command import add_parser as add_train
    from dart_ray.run.command import add_sft_eval
    from dart_ray.run.experiment import add_parser as add_experiment
    from dart_ray.run.serving import add_parser as add_serve
    from dart_ray.uitars.actions import MAX_PIXELS, MIN_PIXELS

    add_train(sub, _add_config_args, _load)
    add_sft_eval(sub, _add_config_args, _load)
    add_serve(sub, _add_config_args, _load)
    add_experiment(sub)

    model = sub.add_parser("model", help="policy models")
    model_sub = model.add_subparsers(dest="action", required=True)
    minit = model_sub.add_parser(
        "init", help="build the tiny Qwen2.5-VL locally (random weights) as an HF folder"
    )
    minit.add_argument("--out", required=True, help="folder to write (created if missing)")
    minit.add_argument("--force", action="store_true", help="replace a model already there")
    minit.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    minit.add_argument("--min-pixels", type=int, default=MIN_PIXELS, help="image processor")
    minit.add_argument("--max-pixels", type=int, default=MAX_PIXELS, help="image processor")
    minit.add_argument("--hidden-size", type=int, default=64, help="text model width")
    minit.add_argument("--layers", type=int, default=2, help="text model decoder layers")
    minit.set_defaults(fn=cmd_model_init)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with `key=value` overrides anywhere after the command: argparse
    gives a trailing positional list only the words before the first option, so
    `dart-ray report RUN --eval a.json run.root_dir=x` would refuse its override."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


SERVE_QUEUE_PROBE_DEADLINES = {
    "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "1.0",
    "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "5.0",
}
"""How long Serve's router waits for a replica to say its queue length before it routes.
Serve's 0.1 s (backing off to 1 s) suits a replica whose event loop is free; a CPU engine's
replica generates in the same process, and on a machine whose cores the run keeps busy its
answer takes longer, so the router logged "Failed to get queue length ... high network
latency" (a `make run` on a 2-core machine did). The router reads these when `ray.serve` is
first imported, in the driver and in every worker the local Ray starts (they inherit the
driver's environment); a cluster's job sets them in cluster/jobs/runtime-env.yaml. Set either
in the environment to override."""


def main(argv: Sequence[str] | None = None) -> int:
    install_log_masking()  # URL passwords and secrets this process reads never reach a log
    if not sys.stdout.isatty():  # a job's log, a file: Ray's coloured worker prefixes would
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # be escape codes in the text
    for name, seconds in SERVE_QUEUE_PROBE_DEADLINES.items():
        os.environ.setdefault(name, seconds)
    plain_streams()  # and so would the colours it writes whatever the stream
    args = parse_args(argv)
    if not args.verbose:
        quiet_third_party()
    out = Console()
    try:
        return int(args.fn(args, out))
    except (ConfigError, StoreError) as e:
        print(f"dart-ray {args.command}: {e}", file=sys.stderr)  # plain: never wrapped
        return 2
    except Exception as e:
        # a part that rejects the configuration raises inside a Ray actor: say it in one line
        cause = getattr(e, "cause", None)
        if isinstance(cause, (ConfigError, EnvInputError)):
            print(f"dart-ray {args.command}: {cause}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

"""`dart-ray serve`: the policy server alone, for evaluation tools and OpenAI clients.

It starts a local Ray (or joins `cluster.address`) and deploys, from the `[policy]` section:
with the transformers engine, the policy application exactly as a run does
(`serve_apps.policy.deploy_policy`: the same engine, batching, token and limits); with
`--engine vllm`, Ray's own `ray.serve.llm` OpenAI app (`serve_apps/ray_llm.py`: vLLM's OpenAI
server behind Serve; no bearer token, so on 127.0.0.1 only). It prints the URL of the OpenAI
route and waits. Ctrl-C or
SIGTERM ends it, and it removes only what it made: on a Ray of its own, Serve and Ray; joined
to a cluster, its own application (`--app`), never another (a training run's policy, another
`dart-ray serve`), and it leaves the cluster up. Alone on Serve, the application takes the
route prefix `/`: the route is `/v1/chat/completions`, where docs/POLICY.md says; beside other
applications, `/<app>/v1/chat/completions` (it prints which).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from rich.console import Console

from dart_ray.config import Config, ConfigError


def default_app() -> str:
    """`serve-<pid>`: two `dart-ray serve` on one cluster never take each other's name (a
    run's application is `policy-<run_id>`)."""
    return f"serve-{os.getpid()}"


def serve_policy(
    config: Config,
    out: Console,
    ready: Callable[[str], None] | None = None,
    *,
    app: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve `policy.model_path` as application `app` until SIGINT or SIGTERM (or `stop` is
    set); `ready` gets the route's URL."""
    import ray
    from ray import serve

    from dart_ray.run.preflight import check_local_inputs, start_ray
    from serve_apps.policy import deploy_policy

    p = config.policy
    app = app or default_app()
    if p.model_path is None:
        raise ConfigError(
            "no model to serve: give --model DIR (or policy.model_path); build the tiny one "
            "with `dart-ray model init --out DIR`"
        )
    check_local_inputs(config)  # the model folder and the port, before Ray starts
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    own_ray = not ray.is_initialized()
    # joined to a cluster, other jobs' workers are not this terminal's business
    start_ray(config, log_to_driver=False)
    own_serve = own_ray and config.cluster.address is None  # a Ray of its own: Serve too
    deployed = False
    try:
        _refuse_a_live_name(app)
        _say_what_it_waits_for(config)
        if p.engine == "vllm":  # Ray's own OpenAI app for vLLM (serve_apps/ray_llm.py)
            url, model_id = _deploy_ray_llm(config, p.model_path.resolve(), app)
            print(f'ray.serve.llm OpenAI app; clients send "model": {model_id!r}', flush=True)
        else:
            _, url = deploy_policy(p, p.model_path.resolve(), app)
        deployed = True
        # after Ray's and Serve's own handlers are installed, so these win
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(f"policy server ({p.engine}, {p.model_path}) at {url}", flush=True)
            print(f"Serve application {app!r}; Ctrl-C or SIGTERM stops it", flush=True)
            if ready is not None:
                ready(url)
            while not stop.wait(0.5):
                pass
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    finally:
        if own_serve:
            serve.shutdown()
        elif deployed:
            serve.delete(app)  # its own application only: the cluster's others stay
        if own_ray:
            ray.shutdown()  # a Ray of its own stops; a cluster is only disconnected from
    print("policy server stopped", flush=True)
    return 0


def _deploy_ray_llm(config: Config, model_path: Path, app: str) -> tuple[str, str]:
    """`ray.serve.llm`'s OpenAI app for `model_path` as application `app`; (the URL of its
    chat route, the model id), once it is running."""
    from ray import serve

    from serve_apps.policy import policy_url, route_for
    from serve_apps.ray_llm import build_openai

    p = config.policy
    application, model_id = build_openai(p, model_path)
    serve.start(http_options={"host": p.http_host, "port": p.http_port})
    route = route_for(app)
    serve.run(application, name=app, route_prefix=route)
    return policy_url(p, route), model_id


def _refuse_a_live_name(app: str) -> None:
    """Deploying under a live application's name would replace it (a run's policy, another
    `dart-ray serve`): refuse, naming it."""
    from ray import serve

    try:
        live = serve.status().applications
    except Exception:  # Serve not started yet on this cluster: nothing to collide with
        return
    if app in live and live[app].status != "DELETING":
        raise ConfigError(
            f"a Serve application named {app!r} is already running on this cluster; "
            "choose another name with --app NAME"
        )


def _say_what_it_waits_for(config: Config) -> None:
    """Joined to a busy cluster, the replicas wait for CPUs other jobs hold: say so at once
    instead of waiting silently (Serve keeps waiting; Ctrl-C stops it)."""
    import ray

    p = config.policy
    need = p.num_cpus * p.replicas
    free = ray.available_resources().get("CPU", 0.0)
    if free < need:
        print(
            f"waiting for {need:g} CPUs for the policy replicas (policy.num_cpus x "
            f"policy.replicas); the cluster has {free:g} free now: other jobs hold the rest",
            flush=True,
        )


def add_parser(sub: argparse._SubParsersAction, add_config_args, load) -> None:  # type: ignore[type-arg,no-untyped-def]
    p = sub.add_parser(
        "serve", help="serve the policy alone (OpenAI route /v1/chat/completions) until Ctrl-C"
    )
    p.add_argument("--model", default=None, help="model folder (default: policy.model_path)")
    p.add_argument("--engine", choices=("hf", "vllm", "script"), default=None, help="policy.engine")
    p.add_argument("--host", default=None, help="policy.http_host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="policy.http_port (default 8000)")
    p.add_argument(
        "--app", default=None, help="Serve application name (default serve-<pid>; never replaced)"
    )
    add_config_args(p)

    def fn(args: argparse.Namespace, out: Console) -> int:
        flags = {
            "policy.model_path": args.model,
            "policy.engine": args.engine,
            "policy.http_host": args.host,
            "policy.http_port": args.port,
        }
        # after the file's and the command line's overrides: the flags win
        args.overrides = [
            *args.overrides,
            *(f"{k}={json.dumps(v)}" for k, v in flags.items() if v is not None),
        ]
        return serve_policy(load(args), out, app=args.app)

    p.set_defaults(fn=fn)

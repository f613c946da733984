"""`dart-ray serve`: the policy server alone, for evaluation tools and OpenAI clients.

It starts a local Ray (or joins `cluster.address`), deploys the policy application exactly as
a run does (`serve_apps.policy.deploy_policy`: the same engine, batching, token and limits,
from the same `[policy]` section), prints the URL of its OpenAI route and waits. Ctrl-C or
SIGTERM shuts Serve down (the proxy, the replicas, the weight registry) and then Ray, so the
port is free again when the command returns. Alone on Serve, the application takes the route
prefix `/`: the route is `/v1/chat/completions`, where docs/POLICY.md says.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable
from types import FrameType

from rich.console import Console

from dart_ray.config import Config, ConfigError

APP = "policy"
"""The Serve application's name (a run's is `policy-<run_id>`)."""


def serve_policy(config: Config, out: Console, ready: Callable[[str], None] | None = None) -> int:
    """Serve `policy.model_path` until SIGINT or SIGTERM; `ready` gets the route's URL."""
    import ray
    from ray import serve

    from dart_ray.run.runtime import check_local_inputs, start_ray
    from serve_apps.policy import deploy_policy

    p = config.policy
    if p.model_path is None:
        raise ConfigError(
            "no model to serve: give --model DIR (or policy.model_path); build the tiny one "
            "with `dart-ray model init --out DIR`"
        )
    check_local_inputs(config)  # the model folder and the port, before Ray starts
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    start_ray(config)
    try:
        _, url = deploy_policy(p, p.model_path.resolve(), APP)
        # after Ray's and Serve's own handlers are installed, so these win
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(f"policy server ({p.engine}, {p.model_path}) at {url}", flush=True)
            print("Ctrl-C or SIGTERM stops it", flush=True)
            if ready is not None:
                ready(url)
            while not stop.wait(0.5):
                pass
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    finally:
        serve.shutdown()
        ray.shutdown()
    print("policy server stopped", flush=True)
    return 0


def add_parser(sub: argparse._SubParsersAction, add_config_args, load) -> None:  # type: ignore[type-arg,no-untyped-def]
    p = sub.add_parser(
        "serve", help="serve the policy alone (OpenAI route /v1/chat/completions) until Ctrl-C"
    )
    p.add_argument("--model", default=None, help="model folder (default: policy.model_path)")
    p.add_argument("--engine", choices=("hf", "vllm"), default=None, help="policy.engine")
    p.add_argument("--host", default=None, help="policy.http_host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="policy.http_port (default 8000)")
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
        return serve_policy(load(args), out)

    p.set_defaults(fn=fn)

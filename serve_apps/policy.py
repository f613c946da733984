"""The policy server: a Ray Serve deployment that generates actions and takes new weights live.

One replica holds one engine (`policy.engine`: transformers or vLLM). Requests arrive through
a Serve handle (`generate(GenerateRequest) -> Generation`) from the rollouter, or over HTTP on
an OpenAI-compatible `/v1/chat/completions` route (images as data URLs; `n`, `logprobs`,
`top_logprobs`; the wire format in `serve_apps.openai_route`) so that evaluation tools can
call the policy too. `deploy_policy` puts it where docs/POLICY.md says: at `/` when it is
Serve's only application, else under `/<app>`. For the transformers engine, concurrent requests are batched
by a `Batcher` (dart_ray.engines.batching: the next batch forms when the engine is free, from
everything that queued meanwhile, up to `policy.max_batch_size`; a request waits at most
`policy.batch_wait_ms` for company); vLLM batches by itself. In a timing-mode run (`[timing]`)
replicas run the TimingEngine, which takes as long as a 7B model on GPUs without computing
(dart_ray.engines.timing). `utilisation()` says how busy the replica's accelerators were.

Weights: `update_weights(version, [ObjectRef])`, sent to any one replica, records the publish
in a deployment-scoped `WeightRegistry` (so replicas that start later load it first) and
fans `load_weights` out to every live replica with `handle.broadcast`. A replica the broadcast
misses (Serve started it while the publish was in progress: it read the registry before the
publish was recorded and became routable after the broadcast listed the replicas) follows the
registry itself: it re-reads it before its first request (`_sync`) and long-polls it from
then on (`_follow`), so it loads a publish as soon as it is recorded; and `update_weights`
broadcasts again until no replica answers that had not (a replica added meanwhile). A replica
that leaves mid-broadcast (autoscaling down) fails no publish. Each replica loads the packed
tensors in place from the object store (zero-copy, see `dart_ray.models.weights`); requests
in flight finish on the version they started with (`VersionGate`), and every `Generation`
carries the version that produced it. The call returns each replica's version.

Security: HTTP binds to `policy.http_host` (127.0.0.1 unless configured), and with
`policy.auth_token_file` or `policy.auth_token_env` set every route but `/health` needs
`Authorization: Bearer <token>` (compared in constant time), the token read in the replica.
The token is never logged (`dart_ray.config.masking`). A malformed body gets 400 naming the field.

(No `from __future__ import annotations` here: FastAPI must see `Request` as a real class on
the ingress methods, or it takes `request` for a query parameter.)
"""

import asyncio
import dataclasses
import hmac
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.config import AutoscalingConfig, DeploymentActorConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.schema import LoggingConfig

from dart_ray.config import ConfigError, PolicyConfig, TimingConfig, read_secret
from dart_ray.engines import make_engine
from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    PreparedRequest,
    SamplingParams,
)
from dart_ray.engines.batching import Batcher
from dart_ray.engines.timing import TimingEngine
from dart_ray.models.loading import check_model_dir
from dart_ray.uitars.prompts import BadRequest, from_openai
from serve_apps.openai_route import (
    choices_n,
    openai_logprobs,
    sampling_of,
)
from serve_apps.weight_registry import WeightRegistry
from serve_apps.weights import REGISTRY, WeightFollower

log = logging.getLogger("ray.serve")
http = FastAPI(title="dart-ray policy")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def read_token(cfg: PolicyConfig) -> str | None:
    """The bearer token the HTTP route requires (None: no token configured).

    Read where the replica runs, from `policy.auth_token_file` or `policy.auth_token_env`;
    configured but missing or empty is an error, never a route left open by accident.
    """
    if cfg.auth_token_file is None and not cfg.auth_token_env:
        return None
    token = read_secret(cfg.auth_token_env, cfg.auth_token_file)
    if not token:
        raise ConfigError(
            f"policy.auth_token_file {cfg.auth_token_file} is empty"
            if cfg.auth_token_file is not None
            else f"policy.auth_token_env names {cfg.auth_token_env}, which is not set (or empty) "
            "in the replica's environment"
        )
    return token


@serve.deployment(name="PolicyServer")
@serve.ingress(http)
class PolicyServer(WeightFollower):
    async def __init__(
        self,
        cfg: dict[str, Any],
        model_path: str,
        initial_version: int = 0,
        timing: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = PolicyConfig.model_validate(cfg)
        self.engine: Engine = (
            TimingEngine(TimingConfig.model_validate(timing), self.cfg.interrupt_on_update)
            if timing is not None
            else make_engine(self.cfg, model_path)
        )
        self._started = time.monotonic()
        self._in_flight = 0
        self._busy_s = 0.0
        self._busy_since = 0.0
        # the weights in `model_path` are this version (a checkpoint when a run resumes)
        self.engine.gate.version = initial_version
        self.model_path = model_path
        self.defaults = SamplingParams(
            self.cfg.temperature, self.cfg.top_p, self.cfg.max_new_tokens, top_k=self.cfg.top_k
        )
        self._prepare_pool = ThreadPoolExecutor(
            self.cfg.prepare_threads, thread_name_prefix="prepare"
        )
        self._batcher: Batcher[PreparedRequest, Generation] = Batcher(
            self.engine.generate, self.cfg.max_batch_size, self.cfg.batch_wait_ms / 1000
        )
        self._token = read_token(self.cfg)
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        self.app_name = ctx.app_name
        self.deployment = ctx.deployment
        # one load at a time: the broadcast and `_follow` may bring the same version (or two
        # versions) at once, and the engine checks the version before it waits for the gate
        self._load_lock = asyncio.Lock()
        self._seen = self.engine.version
        """The newest version this replica heard of (loaded, or lost with its trainer)."""
        self._first_sync: asyncio.Task[None] | None = None
        """The registry read the first requests wait for (see `_sync`)."""
        version, refs = await serve.get_deployment_actor(REGISTRY).latest.remote()
        await self._catch_up(version, refs)  # a replica started after a publish
        self._follower = asyncio.create_task(self._follow(), name="follow-weights")

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerateRequest) -> Generation:
        """One response for one request; raises BadRequest for a malformed request.

        The request is prepared (checked, its screenshots decoded and encoded) on arrival, in
        the replica's preparation threads (`policy.prepare_threads`), so that preparing the
        next batch overlaps the engine's work on the current one; it joins the batcher's
        queue at once, and a batch waits for the preparation of the members it took. A
        malformed request fails alone.
        """
        if not isinstance(request, GenerateRequest):
            raise BadRequest(f"generate takes a GenerateRequest, not {type(request).__name__}")
        if self._first_sync is None:  # this replica's first request: see `_sync`
            self._first_sync = asyncio.create_task(self._sync(), name="first-sync")
        if not self._first_sync.done():  # shielded: one cancelled request cancels no other
            await asyncio.shield(self._first_sync)
        prepared = asyncio.get_running_loop().run_in_executor(
            self._prepare_pool, self.engine.prepare, request, self.defaults
        )
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
        self._in_flight += 1
        try:
            if self.engine.name == "hf":
                gen = await self._batcher.submit(prepared)
            else:
                gen = (await self.engine.generate([await prepared]))[0]
            return dataclasses.replace(gen, replica=self.replica)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.monotonic() - self._busy_since

    def utilisation(self) -> dict[str, float]:
        """How busy this replica's accelerators were: `gpu_busy_s` over `gpus` x `alive_s`.
        The timing engine knows each simulated GPU's busy time; a real engine counts the
        replica busy while any request is in flight. With it, what weight updates cost
        generation: `updates`, and their total `update_wait_s` (waiting for generations in
        flight) and `update_blocked_s` (new generations held off: the wait and the load)."""
        gate = self.engine.gate
        updates = {
            "updates": float(gate.updates),
            "update_wait_s": gate.wait_s,
            "update_blocked_s": gate.blocked_s,
        }
        if isinstance(self.engine, TimingEngine):
            return self.engine.utilisation() | updates
        live = time.monotonic() - self._busy_since if self._in_flight else 0.0
        return {
            "gpus": 1.0,
            "gpu_busy_s": self._busy_s + live,
            "alive_s": time.monotonic() - self._started,
        } | updates

    def version(self) -> int:
        return self.engine.version

    def health(self) -> dict[str, Any]:
        return {
            "ok": True,
            "replica": self.replica,
            "engine": self.engine.name,
            "version": self.engine.version,
            "last_update_s": self.engine.last_update_s,
            "torch_threads": torch.get_num_threads(),
        }

    # ------------------------------------------------------------------ HTTP

    def _authorised(self, request: Request) -> bool:
        if self._token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode())

    @http.get("/health")
    def http_health(self) -> dict[str, Any]:
        return {"ok": True, "version": self.engine.version}

    @http.get("/v1/models")
    def http_models(self, request: Request) -> Any:
        if not self._authorised(request):
            return _error(401, "missing or wrong bearer token", "authentication_error")
        name = Path(self.model_path).name
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "dart-ray"}]}

    @http.post("/v1/chat/completions")
    async def http_chat(self, request: Request) -> Any:
        if not self._authorised(request):
            return _error(401, "missing or wrong bearer token", "authentication_error")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        if body.get("stream"):
            return _error(400, "stream=true is not supported")
        if not isinstance(body.get("model", ""), str):
            return _error(400, "model must be a string")
        try:
            sampling = sampling_of(body, self.defaults)
            n = choices_n(body)
            if sampling.top_logprobs and self.engine.name != "hf":
                raise BadRequest(
                    f"top_logprobs is not supported by the {self.engine.name} engine "
                    "(logprobs=true gives each sampled token's log-prob)"
                )
            processor = getattr(self.engine, "processor", None)
            if body.get("logprobs") and processor is None:
                raise BadRequest(f"logprobs is not supported by the {self.engine.name} engine")
            req = GenerateRequest(tuple(from_openai(body.get("messages"))), sampling)
            gens = await asyncio.gather(*(self.generate(req) for _ in range(n)))
        except BadRequest as e:
            return _error(400, str(e))
        tokenizer = processor.tokenizer if body.get("logprobs") else None
        completion = sum(len(g.response_ids) for g in gens)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or Path(self.model_path).name,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": g.text},
                    "logprobs": openai_logprobs(g, tokenizer) if tokenizer else None,
                    "finish_reason": g.finish_reason,
                }
                for i, g in enumerate(gens)
            ],
            "usage": {
                "prompt_tokens": len(gens[0].prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(gens[0].prompt_ids) + completion,
            },
            "weight_version": min(g.weight_version for g in gens),
        }


def build_app(
    cfg: PolicyConfig,
    model_path: str | Path,
    initial_version: int = 0,
    timing: TimingConfig | None = None,
) -> serve.Application:
    """The policy application with replicas, autoscaling and resources from `cfg`; with
    `timing` (a timing-mode run), replicas run the TimingEngine instead of `cfg.engine`.

    The model folder is checked here, in the caller, so a wrong path fails at once with a
    message naming the problem instead of as replicas that keep failing to start.
    `initial_version` is the version of the weights in the folder (a resumed checkpoint's).
    """
    model_path = check_model_dir(model_path)
    actor_options: dict[str, Any] = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus}
    if cfg.torch_threads:  # read by torch when the replica imports it
        actor_options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(cfg.torch_threads)}}
    options: dict[str, Any] = {
        "ray_actor_options": actor_options,
        "max_ongoing_requests": max(cfg.max_ongoing_requests, cfg.max_batch_size),
        # one line per request otherwise ("CALL generate OK"): most of a job's log
        "logging_config": LoggingConfig(enable_access_log=cfg.access_log),
        "deployment_actors": [
            DeploymentActorConfig(
                name=REGISTRY, actor_class=WeightRegistry, actor_options={"num_cpus": 0}
            )
        ],
    }
    if cfg.autoscaling:
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=cfg.min_replicas,
            max_replicas=cfg.max_replicas,
            target_ongoing_requests=cfg.target_ongoing_requests,
            upscale_delay_s=cfg.upscale_delay_s,
            downscale_delay_s=cfg.downscale_delay_s,
            look_back_period_s=cfg.look_back_period_s,
        )
    else:
        options["num_replicas"] = cfg.replicas
    deployment = PolicyServer.options(**options)
    return deployment.bind(
        cfg.model_dump(mode="json"),
        str(model_path),
        initial_version,
        timing.model_dump(mode="json") if timing is not None else None,
    )


OPENAI_ROUTE = "/v1/chat/completions"
"""The OpenAI-compatible route, under the application's route prefix."""


def route_for(app: str) -> str:
    """The route prefix a new policy application takes: `/` when no other Serve application
    is live (the only policy server: the OpenAI route is `/v1/chat/completions`, where
    docs/POLICY.md says), else `/<app>` (several runs on one Serve: each its own
    `/<app>/v1/chat/completions`). Serve must have started."""
    live = [
        name
        for name, s in serve.status().applications.items()
        if name != app and s.status != "DELETING"
    ]
    return f"/{app}" if live else "/"


def policy_url(cfg: PolicyConfig, route_prefix: str) -> str:
    """The full URL of the OpenAI route of an application at `route_prefix`."""
    host = f"[{cfg.http_host}]" if ":" in cfg.http_host else cfg.http_host
    return f"http://{host}:{cfg.http_port}{route_prefix.rstrip('/')}{OPENAI_ROUTE}"


def deploy_policy(
    cfg: PolicyConfig,
    model_path: str | Path,
    app: str,
    initial_version: int = 0,
    timing: TimingConfig | None = None,
) -> tuple[DeploymentHandle, str]:
    """Start Serve's HTTP proxy on `policy.http_host:http_port` (if it is not up) and deploy
    the policy as application `app` at `route_for(app)`; returns the handle and the URL of
    its OpenAI route. What `dart-ray serve` and a run both use."""
    serve.start(http_options={"host": cfg.http_host, "port": cfg.http_port})
    route = route_for(app)
    app_ = build_app(cfg, model_path, initial_version, timing)
    return serve.run(app_, name=app, route_prefix=route), policy_url(cfg, route)


def run_policy(
    cfg: PolicyConfig, model_path: str | Path, name: str = "policy", route_prefix: str = "/"
) -> DeploymentHandle:
    """Start Serve's HTTP proxy on `policy.http_host:http_port` and deploy at `route_prefix`
    (tests pick their own); returns the handle."""
    serve.start(http_options={"host": cfg.http_host, "port": cfg.http_port})
    return serve.run(build_app(cfg, model_path), name=name, route_prefix=route_prefix)

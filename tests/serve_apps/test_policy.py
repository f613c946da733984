"""The policy server through a real Serve handle and over HTTP, with live weight updates."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from dart_ray.config import PolicyConfig
from dart_ray.engines.base import GenerateRequest, Generation
from dart_ray.engines.hf import HFEngine
from dart_ray.models.loading import ModelDirError
from dart_ray.models.weights import pack
from dart_ray.uitars.prompts import BadRequest
from serve_apps.policy import build_app, deploy_policy, run_policy
from serve_apps.weights import UpdateReport
from tests.policy_helpers import GREEDY, png, request
from tests.serve_apps.conftest import TOKEN_ENV

APP = "policy-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The route's token, in a file: it wins over the one in TOKEN_ENV (also configured)."""
    f = tmp_path_factory.mktemp("policy-token") / "token"
    f.write_text(secrets.token_hex(16) + "\n")
    return f


@pytest.fixture(scope="module")
def cfg(token_file: Path) -> PolicyConfig:
    return PolicyConfig(
        replicas=2,
        num_cpus=0.5,
        torch_threads=2,  # more than Ray's 1 for half a CPU
        temperature=0.0,
        max_new_tokens=12,
        max_batch_size=8,
        batch_wait_ms=20,
        http_port=_free_port(),
        auth_token_env=TOKEN_ENV,
        auth_token_file=token_file,
    )


@pytest.fixture(scope="module")
def handle(ray_local: None, tiny_model_dir: Path, cfg: PolicyConfig) -> Iterator[DeploymentHandle]:
    # Serve keeps the HTTP options of whoever started it first in this Ray session: start it
    # afresh so the proxy listens on this module's port
    serve.shutdown()
    h = run_policy(cfg, tiny_model_dir, name=APP)
    yield h
    serve.delete(APP)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> HFEngine:
    """A local engine on the same folder, to know what each version must answer."""
    return HFEngine(tiny_model_dir)


def _expected(ref: HFEngine, req: GenerateRequest, weights: dict[str, torch.Tensor]) -> Generation:
    ref.model.load_state_dict(weights)
    return asyncio.run(ref.generate([ref.prepare(req, GREEDY)]))[0]


def _replica_versions(handle: DeploymentHandle) -> list[int]:
    return handle.broadcast("version").results()


def test_generate_through_the_handle(handle: DeploymentHandle, reference: HFEngine) -> None:
    req = request()
    want = _expected(
        reference, req, {k: v.clone() for k, v in reference.model.state_dict().items()}
    )
    gens = [r.result() for r in [handle.generate.remote(req) for _ in range(6)]]
    for g in gens:
        assert g.response_ids == want.response_ids and g.prompt_ids == want.prompt_ids
        assert g.weight_version == 0
    assert max(g.batch_size for g in gens) > 1  # concurrent requests shared a forward pass
    assert {h["torch_threads"] for h in handle.broadcast("health").results()} == {2}
    with pytest.raises(BadRequest, match="takes a GenerateRequest"):
        handle.generate.remote({"messages": []}).result()
    # a malformed request fails alone, not the batch it joined
    mixed = [handle.generate.remote(r) for r in (req, request(screens=(b"junk",)), req)]
    assert mixed[0].result().response_ids == want.response_ids
    with pytest.raises(BadRequest, match="image 0 is not a readable PNG"):
        mixed[1].result()
    assert mixed[2].result().response_ids == want.response_ids
    health = handle.health.remote().result()
    assert health["ok"] and health["engine"] == "hf"


def test_update_reaches_every_replica_and_in_flight_requests_keep_their_version(
    handle: DeploymentHandle, reference: HFEngine, tiny_model_dir: Path
) -> None:
    base = {k: v.clone() for k, v in HFEngine(tiny_model_dir).model.state_dict().items()}
    versions = {
        0: base,
        1: {k: v * 1.3 for k, v in base.items()},
        2: {k: v * 0.7 for k, v in base.items()},
    }
    reqs = [request(screens=(png((40 * i, 100, 0), box=10 * i),)) for i in range(4)]
    want = {v: [_expected(reference, r, w).response_ids for r in reqs] for v, w in versions.items()}
    assert want[0] != want[1] != want[2]  # the updates change the answers

    report = handle.update_weights.remote(1, [ray.put(pack(versions[1]))]).result()
    assert isinstance(report, UpdateReport) and report.version == 1
    assert len(report.replicas) == 2 and set(report.replicas.values()) == {1}
    assert _replica_versions(handle) == [1, 1]
    for i, r in enumerate(reqs):
        assert handle.generate.remote(r).result().response_ids == want[1][i]

    # requests in flight across the next update: each answers exactly as the version it reports
    before = [handle.generate.remote(reqs[i % 4]) for i in range(16)]
    update = handle.update_weights.remote(2, [ray.put(pack(versions[2]))])
    during = [handle.generate.remote(reqs[i % 4]) for i in range(8)]
    assert update.result().replicas and _replica_versions(handle) == [2, 2]
    after = [handle.generate.remote(reqs[i % 4]) for i in range(4)]
    seen = []
    for i, resp in enumerate(before + during + after):
        g = resp.result()
        seen.append(g.weight_version)
        assert g.response_ids == want[g.weight_version][i % 4], (i, g.weight_version)
    # Which of the early requests ran before the update depends on scheduling (under load the
    # update may take the gate first); what must hold is above: every answer is exactly that
    # of the version it reports. Requests sent after every replica loaded 2 are all on 2.
    assert set(seen) <= {1, 2}
    assert seen[-4:] == [2, 2, 2, 2]


def test_a_replica_that_starts_later_loads_the_newest_version(handle: DeploymentHandle) -> None:
    """A replica Serve starts after a publish (a restart here; autoscaling alike) catches up."""
    import time

    current = max(_replica_versions(handle))
    assert current >= 1  # runs after the update test
    replicas = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{APP}#PolicyServer#")
    ]
    assert len(replicas) == 2
    victim = replicas[0]
    ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
    versions: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until Serve has replaced it and routes to it
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        if (
            len(names & {r["name"] for r in replicas}) == 1
            and len([n for n in names if n.startswith(f"SERVE_REPLICA::{APP}#")]) == 2
        ):
            try:
                versions = _replica_versions(handle)
            except ray.exceptions.RayActorError:
                versions = []
            if len(versions) == 2:
                break
        time.sleep(1)
    assert versions == [current, current]


def _post(port: int, path: str, body: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_openai_route_with_bearer_token(
    handle: DeploymentHandle, cfg: PolicyConfig, token_file: Path
) -> None:
    port, token = cfg.http_port, token_file.read_text().strip()
    url = "data:image/png;base64," + base64.b64encode(png((10, 200, 10))).decode()
    body = {
        "model": "tiny",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "click OK"}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        ],
        "max_tokens": 5,
        "temperature": 0,
    }
    status, out = _post(port, "/v1/chat/completions", body, token)
    assert status == 200, out
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= out["usage"]["completion_tokens"] <= 5
    assert out["weight_version"] == max(_replica_versions(handle))
    # the same request through the handle gives the same text
    assert _post(port, "/v1/chat/completions", body, token)[1]["choices"] == out["choices"]

    assert _post(port, "/v1/chat/completions", body, None)[0] == 401
    assert _post(port, "/v1/chat/completions", body, "wrong")[0] == 401
    assert _post(port, "/v1/chat/completions", body, token + "x")[0] == 401
    assert _post(port, "/v1/chat/completions", body, os.environ[TOKEN_ENV])[0] == 401
    bad = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
            }
        ]
    }
    status, out = _post(port, "/v1/chat/completions", bad, token)
    assert status == 400 and "remote URLs are not fetched" in out["error"]["message"]
    assert _post(port, "/v1/chat/completions", b"{not json", token)[0] == 400
    status, out = _post(port, "/v1/chat/completions", {**body, "top_p": 3}, token)
    assert status == 400 and "top_p" in out["error"]["message"]
    status, out = _post(port, "/v1/chat/completions", {**body, "max_tokens": 10**9}, token)
    assert status == 400 and "max_tokens must be at most" in out["error"]["message"]
    assert _post(port, "/v1/chat/completions", {**body, "stop": 5}, token)[0] == 400
    # malformed bodies: 400 with a message naming the field
    for bad_body, field in [
        ({**body, "temperature": "hot"}, "temperature"),
        ({**body, "messages": "click OK"}, "messages"),
        ({**body, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({**body, "model": ["x"]}, "model"),
        ([body], "JSON object"),
    ]:
        status, out = _post(port, "/v1/chat/completions", bad_body, token)
        assert status == 400 and field in out["error"]["message"], (bad_body, out)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
        assert json.loads(r.read())["ok"] is True
    assert token not in json.dumps(handle.health.remote().result())


def test_a_second_policy_app_takes_its_own_route_and_the_first_keeps_v1(
    handle: DeploymentHandle, cfg: PolicyConfig, token_file: Path, tiny_model_dir: Path
) -> None:
    """A run deploys with `deploy_policy`: alone on Serve it takes `/` (the documented
    `/v1/chat/completions`, as `dart-ray serve` does: tests/test_serve_command.py); beside
    another application (here this module's, at `/`) it takes `/<app>`, and says so."""
    port, token = cfg.http_port, token_file.read_text().strip()
    body = {"messages": [{"role": "user", "content": "click OK"}], "max_tokens": 2}
    app = "policy-second-run"
    _, url = deploy_policy(cfg.model_copy(update={"replicas": 1}), tiny_model_dir, app)
    try:
        assert url == f"http://127.0.0.1:{port}/{app}/v1/chat/completions"
        assert _post(port, f"/{app}/v1/chat/completions", body, token)[0] == 200
        assert _post(port, "/v1/chat/completions", body, token)[0] == 200  # the first's
    finally:
        serve.delete(app)


def test_replicas_write_no_per_request_access_log_by_default(handle: DeploymentHandle) -> None:
    """Serve logs a line per call ("CALL generate OK 12.3ms"): 585 of a job log's 690 lines.
    `policy.access_log` (default false) turns them off in the replicas' own log files."""
    from ray._private.worker import global_worker

    for _ in range(3):
        handle.generate.remote(request()).result()
    logs = Path(global_worker.node.get_logs_dir_path()) / "serve"
    files = sorted(logs.glob(f"replica_{APP}_PolicyServer_*.log"))
    assert files, sorted(p.name for p in logs.iterdir())
    text = "".join(f.read_text() for f in files)
    assert "replica" in text  # the replicas do log (their start, weight loads)
    assert "CALL generate" not in text and "CALL load_weights" not in text


def test_build_app_checks_the_model_folder_and_reads_scaling(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(ModelDirError, match="does not exist"):
        build_app(PolicyConfig(), tmp_path / "missing")
    app = build_app(PolicyConfig(autoscaling=True, min_replicas=1, max_replicas=3), tiny_model_dir)
    # Application exposes no public accessor for its deployment's options
    auto = app._bound_deployment._deployment_config.autoscaling_config  # type: ignore[attr-defined]
    assert (auto.min_replicas, auto.max_replicas) == (1, 3)
    logging = app._bound_deployment._deployment_config.logging_config  # type: ignore[attr-defined]
    assert logging["enable_access_log"] is False
    on = build_app(PolicyConfig(access_log=True), tiny_model_dir)
    assert on._bound_deployment._deployment_config.logging_config["enable_access_log"] is True  # type: ignore[attr-defined]

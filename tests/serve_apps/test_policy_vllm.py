"""The policy server on the vLLM engine (marker `vllm`, runs in .venv-vllm)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

pytest.importorskip("vllm", reason="vLLM lives in .venv-vllm: run `make test-vllm`")

from dart_ray.config import PolicyConfig
from dart_ray.models.loading import load_model
from dart_ray.models.weights import pack
from serve_apps.policy import build_app
from tests.policy_helpers import png, request

pytestmark = pytest.mark.vllm
APP = "policy-vllm-test"


@pytest.fixture(scope="module")
def handle(ray_local: None, tiny_model_dir: Path) -> Iterator[DeploymentHandle]:
    cfg = PolicyConfig(
        engine="vllm",
        num_cpus=1,
        temperature=0.0,
        max_new_tokens=10,
        vllm_max_model_len=2048,
        vllm_kv_cache_mb=128,
    )
    serve.start(http_options={"location": "NoServer"})  # handle only: no port to take
    yield serve.run(build_app(cfg, tiny_model_dir), name=APP, route_prefix=None)
    serve.delete(APP)


def test_serve_on_vllm_generates_and_updates_in_place(
    handle: DeploymentHandle, tiny_model_dir: Path
) -> None:
    reqs = [request(screens=(png((60 * i, 40, 90), box=15 * i),)) for i in range(3)]
    before = [handle.generate.remote(r).result() for r in reqs]
    assert {g.weight_version for g in before} == {0}
    assert handle.health.remote().result()["engine"] == "vllm"
    new = {k: v * 1.3 for k, v in load_model(tiny_model_dir).state_dict().items()}
    report = handle.update_weights.remote(1, [ray.put(pack(new))]).result()
    assert list(report.replicas.values()) == [1]
    after = [handle.generate.remote(r).result() for r in reqs]
    assert {g.weight_version for g in after} == {1}
    assert [g.response_ids for g in after] != [g.response_ids for g in before]

"""`dart-ray serve --engine vllm`: the checkpoint behind Ray's own `ray.serve.llm` OpenAI app,
through the real command, over real HTTP (marker `vllm`, runs in .venv-vllm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM lives in .venv-vllm: run `make test-vllm`")

from dart_ray.config import ConfigError, PolicyConfig
from serve_apps.ray_llm import llm_config
from tests.test_serve_command import REPO, _free_port, _post, _wait_for_url

pytestmark = pytest.mark.vllm


def test_serve_with_vllm_is_rays_openai_app(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "dart_ray.cli", "serve", "--engine", "vllm"]
    argv += ["--model", str(tiny_model_dir), "--port", str(port), "cluster.num_cpus=2"]
    argv += ["policy.num_cpus=1", "policy.vllm_max_model_len=2048", "policy.vllm_kv_cache_mb=128"]
    argv += ["run.root_dir=" + json.dumps(str(tmp_path))]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = _wait_for_url(proc, log, timeout_s=420)
        assert url == f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {
            "model": tiny_model_dir.name,
            "messages": [{"role": "user", "content": "click OK"}],
            "temperature": 0,
            "max_tokens": 4,
            "logprobs": True,
            "top_logprobs": 2,
        }
        status, answer = _post(url, body)
        assert status == 200, answer
        content = answer["choices"][0]["logprobs"]["content"]
        assert 1 <= len(content) <= 4 and all(e["logprob"] <= 0 for e in content)
        assert all(e["top_logprobs"][0]["token"] == e["token"] for e in content)  # greedy
        models = url.replace("/chat/completions", "/models")
        with urllib.request.urlopen(models, timeout=30) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == [tiny_model_dir.name]
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=180)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "ray.serve.llm OpenAI app" in text and "policy server stopped" in text


def test_the_openai_app_refuses_a_token_it_would_not_check(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="checks no bearer token"):
        llm_config(PolicyConfig(engine="vllm", auth_token_env="T"), tiny_model_dir)

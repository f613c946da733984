"""`dart-ray serve`: the policy server alone, through its real command, over real HTTP.

The command runs as a user runs it (its own process, its own local Ray); the test reads the
URL it prints, calls the OpenAI route at the path docs/POLICY.md documents with the fields
OpenAI clients send, and stops it with SIGTERM as `kill` or a supervisor would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.policy_helpers import png

pytestmark = pytest.mark.ray  # starts a Ray of its own: under the lock, never beside another

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_for_url(proc: subprocess.Popen[str], log: Path, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            # the command's own line; Ray's "View the dashboard at http://..." is another
            if line.startswith("policy server (") and " at http://" in line:
                return line.rsplit(" at ", 1)[1]
        assert proc.poll() is None, f"dart-ray serve exited {proc.returncode}:\n{log.read_text()}"
        time.sleep(0.5)
    raise AssertionError(f"no URL printed in {timeout_s} s:\n{log.read_text()}")


def test_serve_answers_the_documented_route_and_stops_on_sigterm(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "dart_ray.cli", "serve", "--model", str(tiny_model_dir)]
    argv += ["--port", str(port), "cluster.num_cpus=2", "policy.num_cpus=0.5"]
    argv += ["run.root_dir=" + json.dumps(str(tmp_path))]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = _wait_for_url(proc, log)
        assert url == f"http://127.0.0.1:{port}/v1/chat/completions"  # docs/POLICY.md's path
        image = "data:image/png;base64," + __import__("base64").b64encode(png((9, 9, 9))).decode()
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "click OK"},
                        {"type": "image_url", "image_url": {"url": image}},
                    ],
                }
            ],
            "temperature": 0,
            "max_completion_tokens": 4,
            "logprobs": True,
            "top_logprobs": 3,
            "n": 2,
        }
        status, answer = _post(url, body)
        assert status == 200, answer
        assert [c["index"] for c in answer["choices"]] == [0, 1]
        tokens = 0
        for choice in answer["choices"]:
            content = choice["logprobs"]["content"]
            assert 1 <= len(content) <= 4  # max_completion_tokens
            tokens += len(content)
            for entry in content:
                assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
                top = entry["top_logprobs"]
                assert len(top) == 3
                assert [t["logprob"] for t in top] == sorted(
                    (t["logprob"] for t in top), reverse=True
                )
                # greedy: the drawn token is the most likely one
                assert top[0]["token"] == entry["token"]
                assert top[0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-5)
        # n=2 at temperature 0: the same answer twice, both counted
        assert answer["choices"][0]["message"] == answer["choices"][1]["message"]
        assert answer["usage"]["completion_tokens"] == tokens
        no_logprobs = _post(url, {"messages": body["messages"], "max_tokens": 2})[1]
        assert no_logprobs["choices"][0]["logprobs"] is None
        status, err = _post(url, {**body, "n": 0})
        assert status == 400 and "n must be in [1, 16]" in err["error"]["message"]
        status, err = _post(url, {**body, "best_of": 2})
        assert status == 400 and "best_of" in err["error"]["message"]
        models = url.replace("/chat/completions", "/models")
        with urllib.request.urlopen(models, timeout=30) as r:
            assert json.loads(r.read())["data"][0]["id"] == tiny_model_dir.name
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == 0, text
    assert "policy server stopped" in text and "Traceback" not in text
    with pytest.raises(ConnectionRefusedError):  # Serve's proxy is gone with it
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.usefixtures("ray_local")
def test_serve_joined_to_a_cluster_removes_only_its_own_app(tiny_model_dir: Path) -> None:
    """Issue 45, point 5: joined to a cluster where a run's policy app is live, `dart-ray
    serve` refuses that app's name, serves under its own, and on stop deletes its own app
    only. Before the fix it ended with `serve.shutdown()`, which deleted every application on
    the cluster (the run's policy included; the run then hung on its next publish)."""
    import threading

    import ray
    from ray import serve

    from dart_ray.config import ConfigError, load_config
    from dart_ray.run.serving import serve_policy
    from serve_apps.policy import run_policy

    address = ray.get_runtime_context().gcs_address
    cfg = load_config(
        None,
        [f"policy.model_path={json.dumps(str(tiny_model_dir))}", f"cluster.address={address}"],
    )
    run_policy(cfg.policy, tiny_model_dir, name="policy-a-run", route_prefix="/a-run")
    try:
        with pytest.raises(ConfigError, match="'policy-a-run' is already running"):
            serve_policy(cfg, None, app="policy-a-run")  # type: ignore[arg-type]
        up, stop = threading.Event(), threading.Event()
        urls: list[str] = []

        def ready(url: str) -> None:
            urls.append(url)
            up.set()

        t = threading.Thread(
            target=serve_policy, args=(cfg, None, ready), kwargs={"app": "serve-x", "stop": stop}
        )
        t.start()
        assert up.wait(300), "dart-ray serve never became ready"
        assert urls[0].endswith("/serve-x/v1/chat/completions")  # beside another app
        assert "serve-x" in serve.status().applications
        stop.set()
        t.join(timeout=120)
        apps = serve.status().applications
        assert "serve-x" not in apps
        assert apps["policy-a-run"].status == "RUNNING"
        assert ray.is_initialized()  # the cluster's connection is the caller's, still up
    finally:
        serve.delete("policy-a-run")

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
            if " at http://" in line:
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

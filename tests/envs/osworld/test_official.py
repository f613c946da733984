"""OSWorld's own evaluator (`desktop-env` in .venv-osworld) called through
`dart_ray.envs.osworld.official`, against a small fake server here (marker `osworld`), and
the worker's failure handling, with a fake worker that needs no venv (no marker).

The fake server answers what OSWorld's getters ask (`/terminal` before postconfig,
`/execute` for `vm_command_line`) and tells whether the bearer token came with the request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from dart_ray.envs.base import EnvInputError
from dart_ray.envs.osworld.official import (
    OSWorldEvaluator,
    OSWorldEvaluatorError,
    OSWorldWorkerCrashed,
    read_score,
)
from dart_ray.records import Task
from tests.envs.osworld.venv import VENV, has_venv

TOKEN = "fake-server-token"


class _Fake(BaseHTTPRequestHandler):
    executed: ClassVar[list[dict[str, object]]] = []

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/platform":
            self._send(b"Linux", "text/plain")
        else:
            self._send(json.dumps({"output": ""}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        authed = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        _Fake.executed.append({"path": self.path, "body": body, "authed": authed})
        out = {"status": "success", "output": "authed" if authed else "anonymous"}
        if "count" in str(body.get("command")):  # `run N` on its Nth run; it exits 1
            n = sum("count" in str(e["body"].get("command")) for e in _Fake.executed)
            self._send(
                json.dumps(out | {"output": f"run {n}", "error": "no", "returncode": 1}).encode()
            )
            return
        self._send(json.dumps(out | {"error": "", "returncode": 0}).encode())

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def official(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OSWorldEvaluator]:
    ev = OSWorldEvaluator(VENV, tmp_path_factory.mktemp("osworld-cache"), timeout_s=120)
    yield ev
    ev.close()


def _task(evaluator: dict[str, object], task_id: str = "t1") -> Task:
    return Task(task_id, "a test task", "desktop", {"config": [], "evaluator": evaluator})


def _rule(rules: object) -> dict[str, object]:
    return {"type": "rule", "rules": rules}


@pytest.mark.parametrize(
    ("evaluator", "last", "score"),
    [
        ({"func": "infeasible"}, "FAIL", 1.0),
        ({"func": "infeasible"}, "DONE", 0.0),
        # FAIL on a feasible task is 0 whatever the state
        (
            {"func": "is_in_list", "result": _rule(["a"]), "expected": _rule({"expected": "a"})},
            "FAIL",
            0.0,
        ),
        (
            {"func": "is_in_list", "result": _rule(["a"]), "expected": _rule({"expected": "a"})},
            None,
            1.0,
        ),
        # OSWorld's exact_match reads rules["expected"] and does not strip
        (
            {"func": "exact_match", "result": _rule("x\n"), "expected": _rule({"expected": "x"})},
            "DONE",
            0.0,
        ),
        (
            {
                "func": ["is_in_list", "is_in_list"],
                "result": [_rule(["a"]), _rule(["b"])],
                "expected": [_rule({"expected": "a"}), _rule({"expected": "z"})],
                "conj": "or",
            },
            "DONE",
            1.0,
        ),
        (
            {
                "func": ["is_in_list", "is_in_list"],
                "result": [_rule(["a"]), _rule(["b"])],
                "expected": [_rule({"expected": "a"}), _rule({"expected": "z"})],
            },
            "DONE",
            0.0,
        ),
        # options reach the metric: literal_match(result, expected, type=..., ignore_case=...)
        (
            {
                "func": "literal_match",
                "result": _rule("Hello"),
                "expected": _rule("hello"),
                "options": {"ignore_case": True},
            },
            "DONE",
            1.0,
        ),
    ],
    ids=[
        "infeasible-fail",
        "infeasible-done",
        "give-up",
        "in-list",
        "exact-no-strip",
        "or",
        "and",
        "options",
    ],
)
@pytest.mark.osworld
@has_venv
def test_osworld_semantics(
    official: OSWorldEvaluator,
    fake_url: str,
    evaluator: dict[str, object],
    last: str | None,
    score: float,
) -> None:
    assert official.evaluate(_task(evaluator), fake_url, TOKEN, last) == score


@pytest.mark.osworld
@has_venv
def test_the_token_goes_to_the_server_and_postconfig_runs_first(
    official: OSWorldEvaluator, fake_url: str
) -> None:
    _Fake.executed.clear()
    evaluator = {
        "postconfig": [{"type": "execute", "parameters": {"command": ["true"]}}],
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "echo", "shell": True},
        "expected": _rule({"expected": "authed"}),
    }
    assert official.evaluate(_task(evaluator), fake_url, TOKEN, "DONE") == 1.0
    assert [e["path"] for e in _Fake.executed] == ["/setup/execute", "/execute"]
    assert all(e["authed"] for e in _Fake.executed)
    # without a token the server sees an anonymous request (ours would refuse it)
    assert official.evaluate(_task(evaluator), fake_url, None, "DONE") == 0.0


@pytest.mark.osworld
@has_venv
def test_a_getter_that_needs_the_internet_names_the_task_and_getter(
    official: OSWorldEvaluator, fake_url: str
) -> None:
    cloud = {"type": "cloud_file", "path": "https://example.invalid/gold.txt", "dest": "gold.txt"}
    evaluator = {"func": "exact_match", "result": _rule("x"), "expected": cloud}
    with pytest.raises(OSWorldEvaluatorError, match=r"task t-cloud: getter 'cloud_file' needs"):
        official.evaluate(_task(evaluator, "t-cloud"), fake_url, TOKEN, "DONE")
    # through a browser: refused before anything runs
    web = {"func": "exact_match", "result": {"type": "page_info", "url": "https://example.org"}}
    with pytest.raises(OSWorldEvaluatorError, match=r"task t-web: getter 'page_info' needs the"):
        official.evaluate(_task(web | {"expected": _rule({})}, "t-web"), fake_url, TOKEN, "DONE")
    # a file already in the task's cache folder is read, not downloaded
    (official.cache / "t-cached").mkdir()
    (official.cache / "t-cached" / "gold.txt").write_text("gold")
    evaluator = {
        "func": "check_include_exclude",
        "result": cloud,
        "expected": _rule({"include": ["gold.txt"]}),
    }
    assert official.evaluate(_task(evaluator, "t-cached"), fake_url, TOKEN, "DONE") == 1.0


@pytest.mark.osworld
@has_venv
def test_unknown_metrics_and_failing_metrics_are_named(
    official: OSWorldEvaluator, fake_url: str
) -> None:
    with pytest.raises(OSWorldEvaluatorError, match=r"task t2: unknown to OSWorld: .*fuzzy_magic"):
        official.evaluate(
            _task({"func": "fuzzy_magic", "result": _rule(1)}, "t2"), fake_url, TOKEN, None
        )
    # OSWorld's exact_match with our old `match` rule: a KeyError inside its metric
    bad = {"func": "exact_match", "result": _rule("x"), "expected": _rule({"match": "x"})}
    with pytest.raises(
        OSWorldEvaluatorError, match=r"task t3: metric 'exact_match': KeyError: 'expected'"
    ):
        official.evaluate(_task(bad, "t3"), fake_url, TOKEN, None)
    # a metric whose package the venv leaves out (it would catch the ImportError: a silent 0)
    audio = {"func": "compare_audios", "result": _rule("a.mp3"), "expected": _rule("b.mp3")}
    with pytest.raises(
        OSWorldEvaluatorError, match=r"task t4: metric 'compare_audios' needs librosa"
    ):
        official.evaluate(_task(audio, "t4"), fake_url, TOKEN, None)
    # the worker is still up and scores the next task
    assert official.evaluate(_task({"func": "infeasible"}), fake_url, TOKEN, "FAIL") == 1.0


@pytest.mark.osworld
@has_venv
def test_setup_runs_through_osworlds_setup_controller_as_osworld_does(
    official: OSWorldEvaluator, fake_url: str
) -> None:
    """Our runner dropped `until`, `stdout`, `stderr`, left `{SCREEN_WIDTH}` and
    `{CLIENT_PASSWORD}` in the command and failed a task on a non-zero exit."""
    _Fake.executed.clear()
    steps = [
        {"type": "launch", "parameters": {"command": ["xterm", "-geometry", "{SCREEN_WIDTH}"]}},
        {
            "type": "execute",
            "parameters": {
                "command": "echo {CLIENT_PASSWORD} | sudo -S count {SCREEN_WIDTH_HALF}",
                "shell": True,
                "until": {"stdout": "run 3"},
                "stdout": "count.out",
            },
        },
    ]
    task = _task({"func": "infeasible"}, "setup-1")
    official.setup(task, steps, fake_url, TOKEN, (1280, 720), client_password="pw-from-env")
    sent = [(e["path"], e["body"].get("command")) for e in _Fake.executed]
    assert sent[0] == ("/setup/launch", ["xterm", "-geometry", "{SCREEN_WIDTH}"])  # as OSWorld
    assert sent[1:] == [("/setup/execute", "echo pw-from-env | sudo -S count 640")] * 3
    assert all(e["authed"] for e in _Fake.executed)
    # its last run's stdout, in the task's cache folder, where OSWorld's getters look
    assert (official.cache / "setup-1" / "count.out").read_text() == "run 3"


@pytest.mark.osworld
@has_venv
def test_a_setup_step_that_needs_the_internet_names_the_task(
    official: OSWorldEvaluator, fake_url: str
) -> None:
    steps = [
        {
            "type": "download",
            "parameters": {"files": [{"url": "https://example.com/a.xlsx", "path": "/tmp/a"}]},
        }
    ]
    with pytest.raises(OSWorldEvaluatorError, match=r"task setup-2: .*example\.com"):
        official.setup(_task({"func": "infeasible"}, "setup-2"), steps, fake_url, TOKEN)


def test_the_desktop_password_never_reaches_a_crash_report(tmp_path: Path) -> None:
    ev = OSWorldEvaluator(_fake_venv(tmp_path, 'echo "ran: sudo -S pw-42" >&2; exit 1'), tmp_path)
    try:
        with pytest.raises(OSWorldWorkerCrashed) as e:
            ev.setup(_task({}, "t5"), [], "http://127.0.0.1:1", None, client_password="pw-42")
        assert "ran: sudo -S ***" in str(e.value) and "pw-42" not in str(e.value)
    finally:
        ev.close()


def _fake_venv(tmp_path: Path, after_ready: str) -> Path:
    """A 'venv' whose python says ready, counts its starts, then does `after_ready`."""
    (tmp_path / "bin").mkdir(parents=True)
    py = tmp_path / "bin" / "python"
    starts = tmp_path / "starts"
    py.write_text(
        f"#!/bin/sh\necho x >> {starts}\necho '{{\"ready\": true}}'\nread line\n{after_ready}\n"
    )
    py.chmod(0o755)
    return tmp_path


def test_a_worker_that_dies_is_named_and_restarted(tmp_path: Path) -> None:
    ev = OSWorldEvaluator(_fake_venv(tmp_path, "echo dying >&2; exit 3"), tmp_path / "cache")
    try:
        for _ in range(2):
            with pytest.raises(OSWorldWorkerCrashed, match=r"task t9: .*exited with 3.*dying"):
                ev.evaluate(_task({"func": "infeasible"}, "t9"), "http://127.0.0.1:1", None, None)
        assert (tmp_path / "starts").read_text().count("x") == 2  # a fresh worker each time
    finally:
        ev.close()


def test_the_workers_log_holds_only_the_last_evaluation(tmp_path: Path) -> None:
    body = 'while read line; do echo "said $line" >&2; echo \'{"score": 1}\'; done'
    ev = OSWorldEvaluator(_fake_venv(tmp_path, f"echo '{{\"score\": 1}}'\n{body}"), tmp_path)
    try:
        for task_id in ("first", "second", "third"):
            ev.evaluate(_task({"func": "infeasible"}, task_id), "http://127.0.0.1:1", None, None)
        tail = ev._tail()
        assert "third" in tail and "second" not in tail, tail
    finally:
        ev.close()


def test_a_worker_answering_outside_the_protocol_is_a_crash(tmp_path: Path) -> None:
    ev = OSWorldEvaluator(_fake_venv(tmp_path, "echo 'not json'; sleep 5"), tmp_path / "cache")
    try:
        with pytest.raises(OSWorldWorkerCrashed, match=r"task t8: .*outside its protocol"):
            ev.evaluate(_task({"func": "infeasible"}, "t8"), "http://127.0.0.1:1", None, None)
        assert ev.proc is None  # stopped; the next call starts a new one
    finally:
        ev.close()


def test_close_stops_an_evaluation_in_flight(tmp_path: Path) -> None:
    ev = OSWorldEvaluator(_fake_venv(tmp_path, "sleep 60"), tmp_path / "cache")
    errors: list[Exception] = []

    def evaluate() -> None:
        try:
            ev.evaluate(_task({"func": "infeasible"}, "t6"), "http://127.0.0.1:1", None, None)
        except OSWorldWorkerCrashed as e:
            errors.append(e)

    t = threading.Thread(target=evaluate)
    t.start()
    time.sleep(1.0)  # the worker has the request and sleeps
    t0 = time.monotonic()
    ev.close()
    t.join(10)
    assert time.monotonic() - t0 < 5 and not t.is_alive()
    assert len(errors) == 1 and "task t6" in str(errors[0])


def test_a_worker_that_does_not_start_is_a_crash(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\necho 'ImportError: no desktop_env'\n")
    (tmp_path / "bin" / "python").chmod(0o755)
    ev = OSWorldEvaluator(tmp_path, tmp_path / "cache")
    try:
        with pytest.raises(OSWorldWorkerCrashed, match=r"task t7: .*did not start.*desktop_env"):
            ev.evaluate(_task({"func": "infeasible"}, "t7"), "http://127.0.0.1:1", None, None)
        assert ev.proc is None
    finally:
        ev.close()


def test_a_relative_venv_works_from_the_workers_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _fake_venv(tmp_path / "v", "echo '{\"score\": 0.5}'")
    monkeypatch.chdir(tmp_path)
    ev = OSWorldEvaluator(Path("v"), tmp_path / "cache")  # the worker runs in cache/
    try:
        assert ev.python == venv / "bin" / "python"
        assert ev.evaluate(_task({"func": "infeasible"}), "http://127.0.0.1:1", None, None) == 0.5
    finally:
        ev.close()


def test_answers_and_a_missing_venv() -> None:
    assert read_score("t", '{"score": 1}') == 1.0
    with pytest.raises(OSWorldEvaluatorError, match="task t: getter 'cloud_file'"):
        read_score("t", '{"error": "task t: getter \'cloud_file\' needs the internet"}')
    with pytest.raises(OSWorldWorkerCrashed, match=r"task t: .*answered"):
        read_score("t", '{"score": "high"}')
    with pytest.raises(EnvInputError, match="make osworld-venv"):
        OSWorldEvaluator(Path("/nonexistent/venv"))

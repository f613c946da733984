"""OSWorld's own evaluator (PyPI `desktop-env`), called from dart-ray.

`desktop-env` pins torch, transformers and numpy < 2, so it lives in its own venv
(`scripts/setup-osworld-venv.sh`, `make osworld-venv`) and runs there as a child process,
`dart_ray/envs/osworld/worker.py`, which scores a task with `DesktopEnv.evaluate` itself
against our desktop server, through OSWorld's own PythonController and SetupController.
This side starts the worker, sends it one JSON line per evaluation and reads one back:

    worker = OSWorldEvaluator(Path(".venv-osworld"))
    score = worker.evaluate(task, "http://127.0.0.1:PORT", token, last_action="DONE")

Failures say which task they were for: a task OSWorld's evaluator cannot score (an unknown
metric, a getter that needs the internet: `OSWorldEvaluatorError`, the task's fault), or a
worker that died or answered outside the protocol (`OSWorldWorkerCrashed`, an EnvCrashed:
the episode is retried). A crashed worker is started afresh on the next call.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from dart_ray.envs.base import EnvCrashed, EnvInputError
from dart_ray.records import Task

WORKER = Path(__file__).with_name("worker.py")
T = TypeVar("T")


class OSWorldEvaluatorError(EnvInputError):
    """OSWorld's evaluator could not score this task (its message names the task and why)."""


class OSWorldWorkerCrashed(EnvCrashed):
    """The evaluator's process died or answered outside its protocol."""


def venv_python(venv: Path) -> Path:
    """The venv's interpreter; EnvInputError saying how to build it when it is missing."""
    py = venv.absolute() / "bin" / "python"  # the worker runs in its cache folder
    if not py.exists():
        raise EnvInputError(
            f"OSWorld's evaluator needs its venv {venv} (missing): build it with "
            f"`make osworld-venv` or `scripts/setup-osworld-venv.sh {venv}`"
        )
    return py


def request_line(
    task: Task,
    server_url: str,
    token: str | None,
    last_action: str | None,
    cache_dir: Path,
    screen: tuple[int, int],
    chromium_port: int = 9222,
) -> str:
    """The JSON line the worker reads for one evaluation."""
    evaluator = task.config.get("evaluator")
    if not isinstance(evaluator, dict):
        raise EnvInputError(f"task {task.task_id}: has no 'evaluator' object to score with")
    req = {
        "task_id": task.task_id,
        "evaluator": evaluator,
        "server_url": server_url,
        "token": token,
        "last_action": last_action,
        "cache_dir": str(cache_dir),
        "screen_width": screen[0],
        "screen_height": screen[1],
        "chromium_port": chromium_port,
    }
    return json.dumps(req) + "\n"


def read_answer(task_id: str, line: str) -> dict[str, Any]:
    """The worker's answer line as an object; the error it carries, raised."""
    try:
        answer = json.loads(line)
    except ValueError:
        raise OSWorldWorkerCrashed(
            f"task {task_id}: OSWorld's evaluator answered outside its protocol: {line[:200]!r}"
        ) from None
    if not isinstance(answer, dict):
        raise OSWorldWorkerCrashed(f"task {task_id}: OSWorld's evaluator answered {line[:200]!r}")
    if "error" in answer:
        raise OSWorldEvaluatorError(f"OSWorld's evaluator: {answer['error']}")
    return answer


def read_score(task_id: str, line: str) -> float:
    """The score in the worker's answer line; the error it carries, raised, otherwise."""
    answer = read_answer(task_id, line)
    score = answer.get("score")
    if not isinstance(score, int | float) or isinstance(score, bool):
        raise OSWorldWorkerCrashed(f"task {task_id}: OSWorld's evaluator answered {answer}")
    return float(score)


class Evaluator(Protocol):
    """What an OSWorld environment asks of OSWorld's code: a worker of its own
    (OSWorldEvaluator), or its node's shared pool (`actors.osworld_evaluator.NodeEvaluator`)."""

    cache: Path

    def evaluate(
        self,
        task: Task,
        server_url: str,
        token: str | None,
        last_action: str | None,
        screen: tuple[int, int] = ...,
    ) -> float: ...

    def setup(
        self,
        task: Task,
        steps: list[Any],
        server_url: str,
        token: str | None,
        screen: tuple[int, int] = ...,
        client_password: str = ...,
    ) -> None: ...

    def close(self) -> None: ...


class OSWorldEvaluator:
    """One worker process in `venv`, started on first use and again after a crash.

    `cache_dir`: where OSWorld's getters keep files, one folder per task (`<cache>/<task id>`,
    as OSWorld lays it out); files a `cloud_file` getter names that are already there are not
    downloaded, which is how a task that needs the internet is scored offline. Unset: a
    temporary folder, removed by close()."""

    def __init__(
        self,
        venv: Path,
        cache_dir: Path | None = None,
        timeout_s: float = 300.0,
        chromium_port: int = 9222,
    ):
        self.python = venv_python(venv)
        self.chromium_port = chromium_port
        self._own_cache = cache_dir is None
        self.cache = cache_dir or Path(tempfile.mkdtemp(prefix="dart-osworld-cache-"))
        self.cache.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.log: IO[str] | None = None
        self._lock = threading.Lock()
        self._secret = ""  # the desktop password of the last setup, never in a crash report

    def evaluate(
        self,
        task: Task,
        server_url: str,
        token: str | None,
        last_action: str | None,
        screen: tuple[int, int] = (1920, 1080),
    ) -> float:
        """OSWorld's score of the desktop's end state for `task` (0.0..1.0)."""
        cache = self.cache / task.task_id
        line = request_line(task, server_url, token, last_action, cache, screen, self.chromium_port)
        return self._parse(task.task_id, self._exchange(task.task_id, line), read_score)

    def setup(
        self,
        task: Task,
        steps: list[Any],
        server_url: str,
        token: str | None,
        screen: tuple[int, int] = (1920, 1080),
        client_password: str = "",
    ) -> None:
        """Run `task`'s setup steps through OSWorld's own SetupController on the server (see
        worker.setup); OSWorldEvaluatorError naming the task when a step fails."""
        req = {
            "op": "setup",
            "task_id": task.task_id,
            "config": steps,
            "server_url": server_url,
            "token": token,
            "cache_dir": str(self.cache / task.task_id),
            "screen_width": screen[0],
            "screen_height": screen[1],
            "chromium_port": self.chromium_port,
            "client_password": client_password,
        }
        self._secret = client_password
        line = self._exchange(task.task_id, json.dumps(req) + "\n")
        answer = self._parse(task.task_id, line, read_answer)
        if answer.get("ok") is not True:
            raise OSWorldWorkerCrashed(f"task {task.task_id}: OSWorld's setup answered {answer}")

    def _exchange(self, task_id: str, line: str) -> str:
        """Send one request line, return the answer line; a worker that failed is stopped
        (and started afresh by the next request)."""
        with self._lock:
            try:
                proc = self._started(task_id)
                assert proc.stdin is not None and self.log is not None
                # only this evaluation's output is kept: OSWorld's metrics print what they
                # compare (whole accessibility trees), which would fill the disk over a run
                self.log.seek(0)
                self.log.truncate()
                proc.stdin.write(line)
                proc.stdin.flush()
                answer = self._read_line(proc, task_id)
            except (OSError, OSWorldWorkerCrashed):  # a broken pipe is an OSError
                self._stop()
                raise
        return answer

    def _parse(self, task_id: str, line: str, parse: Callable[[str, str], T]) -> T:
        """`parse` of an answer; a worker that answered outside the protocol is stopped."""
        try:
            return parse(task_id, line)
        except OSWorldWorkerCrashed:
            with self._lock:
                self._stop()
            raise

    def _started(self, task_id: str) -> subprocess.Popen[str]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self._stop()
        # the worker's stderr, kept open for crash reports
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(self.python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=self.cache,
            start_new_session=True,  # its own group: _kill reaches anything it started
        )
        ready = self._read_line(self.proc, task_id)
        if ready.strip() != '{"ready": true}':
            raise OSWorldWorkerCrashed(
                f"task {task_id}: OSWorld's evaluator did not start: {ready[:200]!r}; "
                f"its last words: {self._tail()!r}"
            )
        return self.proc

    def _read_line(self, proc: subprocess.Popen[str], task_id: str) -> str:
        """One line from the worker, within timeout_s; a crash report naming the task if not."""
        out = proc.stdout
        assert out is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if got and got[0]:
            return got[0]
        if reader.is_alive():
            _kill(proc)
            why = f"did not answer within {self.timeout_s:.0f} s"
        else:
            why = f"exited with {proc.wait()}"
        raise OSWorldWorkerCrashed(
            f"task {task_id}: OSWorld's evaluator {why}; its last words: {self._tail()!r}"
        )

    def _tail(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(0)
        text = self.log.read()
        if self._secret:  # OSWorld's SetupController logs each command as it ran it
            text = text.replace(self._secret, "***")
        return text[-600:]

    def _stop(self) -> None:
        if self.proc is not None:
            _kill(self.proc)
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def close(self) -> None:
        """Stop the worker, also in the middle of an evaluation (which then fails as a crash):
        EnvSession closes an env whose evaluate passed its deadline from another thread."""
        if self.proc is not None:
            _kill(self.proc)  # unblocks the evaluation holding the lock
        with self._lock:
            self._stop()
        if self._own_cache:
            shutil.rmtree(self.cache, ignore_errors=True)


class EvaluatorPool:
    """`size` OSWorldEvaluator workers behind one call: each request borrows a free worker
    (waiting for one while all are busy), so the sessions of a node share a few ~350 MB
    evaluator processes instead of holding one each. Workers start on first use; a crashed
    one is started afresh by its next request, as OSWorldEvaluator does. One cache folder
    (`cache_dir` or a temporary one) serves every worker: OSWorld lays it out per task."""

    def __init__(
        self,
        venv: Path,
        size: int,
        cache_dir: Path | None = None,
        timeout_s: float = 300.0,
        chromium_port: int = 9222,
    ):
        if size < 1:
            raise ValueError(f"an evaluator pool needs at least one worker, got {size}")
        self._own_cache = cache_dir is None
        self.cache = cache_dir or Path(tempfile.mkdtemp(prefix="dart-osworld-cache-"))
        self.timeout_s = timeout_s
        self.workers = [
            OSWorldEvaluator(venv, self.cache, timeout_s, chromium_port) for _ in range(size)
        ]
        self._free: queue.SimpleQueue[OSWorldEvaluator] = queue.SimpleQueue()
        for w in self.workers:
            self._free.put(w)

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[OSWorldEvaluator]:
        worker = self._free.get()
        try:
            yield worker
        finally:
            self._free.put(worker)

    def evaluate(
        self,
        task: Task,
        server_url: str,
        token: str | None,
        last_action: str | None,
        screen: tuple[int, int] = (1920, 1080),
    ) -> float:
        with self._borrowed() as w:
            return w.evaluate(task, server_url, token, last_action, screen)

    def setup(
        self,
        task: Task,
        steps: list[Any],
        server_url: str,
        token: str | None,
        screen: tuple[int, int] = (1920, 1080),
        client_password: str = "",
    ) -> None:
        with self._borrowed() as w:
            w.setup(task, steps, server_url, token, screen, client_password)

    def pids(self) -> list[int]:
        """The worker processes running now (for measuring what the pool holds)."""
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.poll() is None]

    def close(self) -> None:
        for w in self.workers:
            w.close()
        if self._own_cache:
            shutil.rmtree(self.cache, ignore_errors=True)


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the worker's process group (the worker and whatever it started, which may hold
    its stdout open), while the worker is alive: once it is reaped its pid may be reused."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

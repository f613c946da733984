"""What a job's log carries (issue 45 item 13), at each cause; tests/test_job_submit.py reads
a real job's log for all of them together."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest

from dart_ray.reporting.plain import PlainStream, plain_streams


def test_train_report_lines_are_quiet_after_the_worker_quiets_them() -> None:
    """Ray Train names its report logger by file, not module: setting the module name's level
    (the fix before this one) left the per-step "Reporting training result" line on."""
    from ray.train.v2._internal.execution import context

    from dart_ray.train.worker import quiet_train_reports

    before = context.logger.level
    try:
        quiet_train_reports()
        assert not context.logger.isEnabledFor(logging.INFO)
        assert context.logger.isEnabledFor(logging.WARNING)
    finally:
        context.logger.setLevel(before)


def test_colour_codes_never_reach_a_file() -> None:
    out = io.StringIO()
    s = PlainStream(out)  # type: ignore[arg-type]
    n = s.write(
        "Connected. View the dashboard at \x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m\n"
    )
    s.writelines(["(Proxy pid=1) endpoints: {}.\x1b[32m [repeated 3x across cluster]\x1b[0m\n"])
    assert out.getvalue() == (
        "Connected. View the dashboard at http://127.0.0.1:8265 \n"
        "(Proxy pid=1) endpoints: {}. [repeated 3x across cluster]\n"
    )
    assert n == len(
        "Connected. View the dashboard at \x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m\n"
    )
    assert s.getvalue  # the rest of the stream's interface passes through


def test_plain_streams_wraps_files_and_leaves_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    file, tty = io.StringIO(), Tty()
    monkeypatch.setattr(sys, "stdout", file)
    monkeypatch.setattr(sys, "stderr", tty)
    plain_streams()
    plain_streams()  # idempotent: one wrapper
    assert isinstance(sys.stdout, PlainStream) and sys.stdout._inner is file
    assert sys.stderr is tty
    print("\x1b[32mgreen\x1b[0m")
    assert file.getvalue() == "green\n"


def test_serve_router_waits_for_a_busy_cpu_replica() -> None:
    """A `make run` on a 2-core machine logged Serve's "Failed to get queue length ... within
    0.1s ... high network latency": the router's probe deadline is read when `ray.serve` is
    first imported, so the CLI sets it before anything imports Ray (and the workers of its local
    Ray inherit it)."""
    code = (
        "import os\n"
        "for k in [k for k in os.environ if k.startswith('RAY_SERVE_')]: del os.environ[k]\n"
        "from dart_ray.cli import main\n"
        "main(['config', 'show'])\n"
        "from ray.serve._private.request_router.request_router import RequestRouter as R\n"
        "print('deadlines', R.queue_len_response_deadline_s, R.max_queue_len_response_deadline_s)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("deadlines "))
    first, most = map(float, line.split()[1:])
    assert first >= 1.0 and most >= 5.0

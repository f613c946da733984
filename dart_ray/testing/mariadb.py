"""A throw-away MariaDB server on a free loopback port, for tests that restart the server
and for benchmarks that need a larger buffer pool than the shared server has.

It runs Debian's `mariadbd` on a private data directory with `--skip-grant-tables`, bound to
127.0.0.1 only; it holds no data worth protecting and is deleted on `stop()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mariadb_available() -> bool:
    return (
        shutil.which("mariadbd", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", ""))
        is not None
    )


class TemporaryMariaDB:
    def __init__(self, *, buffer_pool: str = "128M", extra_args: tuple[str, ...] = ()) -> None:
        self.port = _free_port()
        self.buffer_pool = buffer_pool
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="dart-mariadb-"))
        self.datadir = self.dir / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self._installed = False

    @property
    def url(self) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}"

    def _user_args(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def start(self, timeout_s: float = 60.0) -> TemporaryMariaDB:
        if not self._installed:
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={self.datadir}",
                    "--skip-test-db",
                    "--auth-root-authentication-method=normal",
                    *self._user_args(),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            self._installed = True
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 (the server owns it)
        self.proc = subprocess.Popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--socket={self.dir / 'mysqld.sock'}",
                f"--pid-file={self.dir / 'mysqld.pid'}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                "--skip-grant-tables",
                "--skip-name-resolve",
                f"--innodb-buffer-pool-size={self.buffer_pool}",
                "--innodb-flush-log-at-trx-commit=1",
                *self._user_args(),
                *self.extra_args,
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mariadbd exited with {self.proc.returncode}; see {self.dir / 'server.log'}"
                )
            try:
                pymysql.connect(host="127.0.0.1", port=self.port, user="root").close()
                return self
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mariadbd did not answer within {timeout_s} s") from None
                time.sleep(0.2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server abruptly (SIGKILL) or cleanly (SIGTERM), keeping its data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
        self.proc = None

    def restart(self, sig: int = signal.SIGKILL, down_s: float = 0.0) -> None:
        self.kill(sig)
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TemporaryMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A real multi-node Ray cluster on this machine, for tests and benchmarks: one head and
worker nodes started with `ray start --block`, each in its own process group, on loopback
only, with a private temp folder. `stop()` kills exactly these processes (`ray stop` would
kill every Ray on the machine, including the test session's own)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    def __init__(self, ray_bin: str, env: dict[str, str] | None = None, auth: bool = False) -> None:
        """`auth`: Ray's token authentication on, as SECURITY.md asks of a real cluster: a
        token in a file of the cluster's own (`RAY_AUTH_TOKEN_PATH`), `RAY_AUTH_MODE=token` in
        `env` for every node and every client (`ray job submit`, drivers). Off: a throw-away
        cluster on loopback without it (a token shared through RAY_AUTH_TOKEN was refused by
        `ray status` in Ray 2.60; the file is not)."""
        self.ray_bin = ray_bin
        self.tmp = Path(tempfile.mkdtemp(prefix="dart-ray-cluster-"))
        self.env = {**os.environ, **(env or {}), "RAY_AUTH_MODE": "disabled"}
        if auth:
            token = self.tmp / "auth_token"
            token.write_text(secrets.token_hex(32) + "\n")
            token.chmod(0o600)
            self.env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self._taken: set[int] = set()
        self.gcs_port = self._port()
        self.dashboard_port = self._port()
        self.metrics_port = self._port()
        self.metrics_ports = [self.metrics_port]
        """Every node's Prometheus endpoint (an actor's metrics are served by its node)."""
        self.procs: list[subprocess.Popen[bytes]] = []

    def _port(self) -> int:
        """A free loopback port this cluster has not handed out yet (a port probed free is
        released at once, so two probes can return the same one)."""
        while (port := free_port()) in self._taken:
            pass
        self._taken.add(port)
        return port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, args: list[str], log: str) -> None:
        # Every node of a one-machine cluster needs agent ports of its own: with Ray's fixed
        # defaults (52365 ...) the second node's dashboard agent cannot bind, and job
        # submission then waits for an agent that never registers ("No available agent").
        ports = [
            f"--dashboard-agent-listen-port={self._port()}",
            f"--dashboard-agent-grpc-port={self._port()}",
            f"--runtime-env-agent-port={self._port()}",
        ]
        out = open(self.tmp / log, "wb")  # noqa: SIM115 (the node owns it)
        self.procs.append(
            subprocess.Popen(
                [self.ray_bin, "start", "--block", "--node-ip-address=127.0.0.1", *ports, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        )

    def start_head(
        self, num_cpus: float, resources: str = "{}", autoscaling_config: Path | None = None
    ) -> None:
        """The head; with `autoscaling_config` (a cluster YAML), its monitor runs Ray's
        autoscaler on it (the fake_multinode provider needs RAY_FAKE_CLUSTER=1 in `env`),
        otherwise the read-only provider of a `ray start --head`, which launches nothing."""
        extra = [f"--autoscaling-config={autoscaling_config}"] if autoscaling_config else []
        self._start(
            [
                *extra,
                "--head",
                f"--port={self.gcs_port}",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={self._port()}",
                "--dashboard-host=127.0.0.1",
                "--include-dashboard=true",
                f"--metrics-export-port={self.metrics_port}",
                f"--num-cpus={num_cpus}",
                f"--resources={resources}",
                f"--temp-dir={self.tmp / 'ray'}",
                "--disable-usage-stats",
            ],
            "head.log",
        )
        self._wait(f"{self.dashboard}/api/version", 120)

    def add_node(self, num_cpus: float, resources: str = "{}") -> None:
        self.metrics_ports.append(self._port())
        self._start(
            [
                f"--address={self.address}",
                f"--num-cpus={num_cpus}",
                f"--resources={resources}",
                f"--metrics-export-port={self.metrics_ports[-1]}",
                "--disable-usage-stats",
            ],
            f"node{len(self.procs)}.log",
        )

    def wait_nodes(self, n: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            p = subprocess.run(
                [self.ray_bin, "status", f"--address={self.address}"],
                capture_output=True,
                text=True,
                env=self.env,
            )
            if p.stdout.count(" node_") >= n:
                return
            time.sleep(2)
        raise TimeoutError(f"{n} nodes did not join within {timeout_s} s:\n{p.stdout}{p.stderr}")

    def _wait(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                return
            except urllib.error.HTTPError:
                return  # it answered (token authentication may refuse the anonymous probe)
            except OSError:
                if time.monotonic() > deadline:
                    log = (self.tmp / "head.log").read_text(errors="replace")[-2000:]
                    raise TimeoutError(f"{url} did not answer in {timeout_s} s:\n{log}") from None
                time.sleep(1)

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        # workers a raylet spawned in sessions of their own still name our temp folder
        subprocess.run(["pkill", "-KILL", "-f", str(self.tmp)], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

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
import warnings
from pathlib import Path

_ALIVE_NODES = """
import sys
from ray.util.state import list_nodes
print(sum(n.state == "ALIVE" for n in list_nodes(address=sys.argv[1], timeout=10)))
"""


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
        self.procs: list[subprocess.Popen[bytes]] = []
        self._head_args: tuple[float, str, Path | None] | None = None
        self._fresh_ports()

    def _fresh_ports(self) -> None:
        self.gcs_port = self._port()
        self.dashboard_port = self._port()
        self.metrics_port = self._port()
        self.metrics_ports = [self.metrics_port]
        """Every node's Prometheus endpoint (an actor's metrics are served by its node)."""

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
        otherwise the read-only provider of a `ray start --head`, which launches nothing.

        Returns once the head is up: its dashboard answers *and* its raylet is an alive node
        of its GCS. The dashboard alone is not enough: in CI (2026-12-07) a head's dashboard
        answered while no raylet was alive, and every driver then failed after 60 s with Ray's
        "No node info found matching attributes". A head not up in 120 s is killed and started
        once more on fresh ports, with a warning that carries its logs; a second failure
        raises with them."""
        self._head_args = (num_cpus, resources, autoscaling_config)
        for attempt in (1, 2):
            self._start_head()
            try:
                self._wait(f"{self.dashboard}/api/version", 120)
                self._wait_alive_node(120)
                return
            except TimeoutError as e:
                if attempt == 2:
                    raise TimeoutError(f"{e}\n{self.logs()}") from None
                warnings.warn(
                    f"the Ray head at {self.address} did not come up; starting it again on "
                    f"fresh ports:\n{e}\n{self.logs()}",
                    stacklevel=2,
                )
                self._kill()
                self._fresh_ports()

    def _start_head(self) -> None:
        assert self._head_args is not None
        num_cpus, resources, autoscaling_config = self._head_args
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

    def alive_nodes(self) -> int:
        """How many nodes the cluster's GCS holds alive (Ray's state API through the
        dashboard, as `ray list nodes` asks it; -1 where it does not answer). Not `ray
        status`: that is the autoscaler's view, where a head started with a cluster YAML is
        no node."""
        p = subprocess.run(
            [str(Path(self.ray_bin).parent / "python"), "-c", _ALIVE_NODES, self.dashboard],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        return int(p.stdout.split()[-1]) if p.returncode == 0 and p.stdout.split() else -1

    def _wait_alive_node(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (n := self.alive_nodes()) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no node of the head at {self.address} is alive ({n})")
            time.sleep(2)

    def head_is_up(self) -> bool:
        """Every node process still runs and the GCS holds at least one node alive."""
        return all(p.poll() is None for p in self.procs) and self.alive_nodes() >= 1

    def restart_head(self) -> None:
        """Kill this cluster's nodes and start its head again on fresh ports (a one-node
        cluster: worker nodes are not restarted). `address` and `dashboard` change."""
        assert self._head_args is not None, "start_head first"
        self._kill()
        self._fresh_ports()
        self.start_head(*self._head_args)

    def logs(self, chars: int = 1500) -> str:
        """The tail of `ray start`'s output and of the head session's GCS and raylet logs,
        for an error message."""
        out = []
        names = ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err")
        files = [self.tmp / "head.log"]
        files += [self.tmp / "ray" / "session_latest" / "logs" / n for n in names]
        for f in files:
            if f.exists():
                text = f.read_text(errors="replace").strip()[-chars:]
                out.append(f"--- {f.name} (tail)\n{text}")
        return "\n".join(out)

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

    def _kill(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        self.procs.clear()
        # workers a raylet spawned in sessions of their own still name our temp folder
        subprocess.run(["pkill", "-KILL", "-f", str(self.tmp)], check=False)

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

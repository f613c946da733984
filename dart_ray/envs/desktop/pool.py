"""A local emulator pool speaking GUI-Docker-Env's lease API, over our desktop servers.

DART-GUI leases desktops from an environment cluster: `POST /start_emulator` returns a fresh
desktop (a QEMU VM running the OSWorld server), `POST /stop_emulator` returns it, a bearer token
guards both. This pool does the same with our Xvfb desktops, so `env.desktop.pool_url` works
on one machine, and a CPU box can serve desktops to EnvSessions elsewhere (bind its address
with `--host` and a token). `max_emulators` caps the leases; past it, `/start_emulator`
answers 503 and the session's reset is aborted and retried.

Run it: `python -m dart_ray.envs.desktop.pool --port 5100 --token-file F [--max-emulators 4]`.
"""

from __future__ import annotations

import argparse
import hmac
import json
import secrets
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dart_ray.envs.desktop.spawn import spawn_server


class Pool:
    def __init__(
        self,
        token: str,
        max_emulators: int = 2,
        width: int = 1024,
        height: int = 768,
        window_manager: str = "openbox",
    ) -> None:
        self.token, self.max = token, max_emulators
        self.size, self.wm = (width, height), window_manager
        self.leases: dict[str, tuple[subprocess.Popen[str], str]] = {}
        self.lock = threading.Lock()

    def start(self) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if len(self.leases) >= self.max:
                return 503, {"error": f"all {self.max} emulators are leased"}
            eid = secrets.token_hex(8)
            self.leases[eid] = (None, "")  # type: ignore[assignment]  # reserve the slot
        try:
            proc, url = spawn_server(*self.size, self.wm, self.token)
        except Exception as e:
            with self.lock:
                del self.leases[eid]
            return 500, {"error": f"desktop failed to start: {e}"}
        with self.lock:
            self.leases[eid] = (proc, url)
        return 200, {"emulator_id": eid, "server_url": url}

    def stop(self, eid: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            lease = self.leases.pop(str(eid), None)
        if lease is None or lease[0] is None:
            return 404, {"error": f"no emulator {eid!r}"}
        proc = lease[0]
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        return 200, {"status": "stopped", "emulator_id": eid}

    def listing(self) -> tuple[int, dict[str, Any]]:
        with self.lock:
            return 200, {
                "emulators": [
                    {"emulator_id": e, "server_url": u}
                    for e, (p, u) in self.leases.items()
                    if p is not None
                ]
            }

    def close(self) -> None:
        for eid in list(self.leases):
            self.stop(eid)


def make_handler(pool: Pool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            got = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, f"Bearer {pool.token}".encode()):
                self._reply(401, {"error": "missing or wrong bearer token"})
                return
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}") if method == "POST" else {}
            except json.JSONDecodeError as e:
                self._reply(400, {"error": f"body is not JSON: {e}"})
                return
            if (method, self.path) == ("POST", "/start_emulator"):
                self._reply(*pool.start())
            elif (method, self.path) == ("POST", "/stop_emulator"):
                self._reply(*pool.stop(body.get("emulator_id")))
            elif (method, self.path) == ("GET", "/emulators"):
                self._reply(*pool.listing())
            else:
                self._reply(404, {"error": f"no {method} {self.path}"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


def serve(pool: Pool, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(pool))
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    from dart_ray.config import read_secret

    ap = argparse.ArgumentParser(description="emulator pool of local desktops")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5100)
    ap.add_argument("--max-emulators", type=int, default=2)
    ap.add_argument("--token-env")
    ap.add_argument("--token-file", type=Path)
    a = ap.parse_args(argv)
    token = read_secret(a.token_env, a.token_file)
    if not token:
        ap.error("the pool needs a bearer token (--token-file or --token-env)")
    pool = Pool(token, a.max_emulators)
    server = serve(pool, a.host, a.port)
    print(f"pool listening on http://{a.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()


if __name__ == "__main__":
    main()

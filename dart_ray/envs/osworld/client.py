"""HTTP clients of the OSWorld in-VM server protocol (`OSWorldClient`) and of a
GUI-Docker-Env-style emulator pool (`EmulatorPool`), and `EnvProtocolError`, what an answer
outside the protocol raises. `dart_ray.envs.osworld` drives a desktop through them;
`dart_ray.envs.osworld.ours` reads the end state through `OSWorldClient`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from dart_ray.envs.base import EnvCrashed, EnvInputError


class EnvProtocolError(EnvCrashed):
    """The server answered, but not in the protocol (not JSON, a field missing or mistyped).

    A crash as far as the episode goes: the session rebuilds the env, the episode is ABORTED
    and retried, and a task whose retries run out is recorded ENV_ERROR, never scored."""


class OSWorldClient:
    """HTTP client of one OSWorld-protocol server. Transport failures raise EnvCrashed, answers
    outside the protocol EnvProtocolError."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    def request(
        self, method: str, path: str, ok404: bool = False, timeout: float | None = None, **kw: Any
    ) -> requests.Response:
        try:
            r = self.http.request(method, self.base + path, timeout=timeout or self.timeout, **kw)
        except requests.RequestException as e:
            raise EnvCrashed(f"desktop server {self.base} did not answer {path}: {e}") from e
        if r.status_code >= 500:
            raise EnvCrashed(f"desktop server failed on {path}: {r.status_code} {r.text[:200]}")
        if r.status_code == 401:
            raise EnvInputError(f"desktop server {self.base} refused the bearer token")
        if r.status_code == 404 and ok404:
            return r
        if r.status_code >= 400:
            raise EnvInputError(f"desktop server refused {path}: {r.status_code} {r.text[:200]}")
        return r

    def answer(self, r: requests.Response, path: str, shape: type = dict) -> Any:
        """The JSON body of `r`, which must be an object (or, with `shape=list`, an array)."""
        try:
            body = r.json()
        except ValueError:
            raise EnvProtocolError(
                f"desktop server {self.base} answered {path} with a body that is not JSON: "
                f"{r.text[:120]!r}"
            ) from None
        if not isinstance(body, shape):
            want = "an object" if shape is dict else "an array"
            raise EnvProtocolError(
                f"desktop server {self.base} answered {path} with JSON "
                f"{type(body).__name__}, not {want}"
            )
        return body

    def field(
        self, body: dict[str, Any], key: str, path: str, kind: type | tuple[type, ...]
    ) -> Any:
        """`body[key]`, which must be of `kind`; EnvProtocolError naming the field otherwise."""
        if key not in body:
            raise EnvProtocolError(f"desktop server {self.base} answered {path} without {key!r}")
        v = body[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise EnvProtocolError(
                f"desktop server {self.base} answered {path} without a valid {key!r} "
                f"(got {json.dumps(v)[:80]})"
            )
        return v

    def screenshot(self) -> bytes:
        return self.request("GET", "/screenshot").content

    def accessibility(self) -> str:
        body = self.answer(self.request("GET", "/accessibility"), "/accessibility")
        return self.field(body, "AT", "/accessibility", (str, type(None))) or ""

    def terminal(self) -> str | None:
        body = self.answer(self.request("GET", "/terminal"), "/terminal")
        return self.field(body, "output", "/terminal", (str, type(None)))  # type: ignore[no-any-return]

    def screen_size(self) -> tuple[int, int]:
        d = self.answer(self.request("POST", "/screen_size", json={}), "/screen_size")
        return self.field(d, "width", "/screen_size", int), self.field(
            d, "height", "/screen_size", int
        )

    def execute(self, command: list[str] | str, shell: bool = False) -> dict[str, Any]:
        r = self.request("POST", "/execute", json={"command": command, "shell": shell})
        return dict(self.answer(r, "/execute"))

    def file(self, path: str) -> bytes | None:
        r = self.request("POST", "/file", ok404=True, json={"file_path": path})
        return None if r.status_code == 404 else r.content

    def list_directory(self, path: str) -> dict[str, Any] | None:
        r = self.request("POST", "/list_directory", ok404=True, json={"path": path})
        if r.status_code == 404:
            return None
        body = self.answer(r, "/list_directory")
        return self.field(body, "directory_tree", "/list_directory", dict)  # type: ignore[no-any-return]

    def setup(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        # setup steps may wait for an app's window (our server waits up to 30 s): a loaded
        # machine must not turn a slow start into a crash, so they get at least 60 s
        r = self.request("POST", f"/setup/{endpoint}", json=body, timeout=max(self.timeout, 60.0))
        return dict(self.answer(r, f"/setup/{endpoint}"))

    def upload(self, path: str, data: bytes) -> None:
        self.request(
            "POST",
            "/setup/upload",
            data={"file_path": path},
            files={"file_data": (Path(path).name, data)},
        )

    def reset(self, apps: list[str] | None) -> bool:
        """Our server's fresh-state reset; False where the server has none (a real VM)."""
        body = {} if apps is None else {"apps": apps}
        r = self.request("POST", "/reset", ok404=True, json=body, timeout=max(self.timeout, 30.0))
        return r.status_code != 404

    def display_alive(self) -> bool | None:
        """Whether the desktop's X display is alive (our server's `/health`); None from a
        server without it (OSWorld's own)."""
        r = self.request("GET", "/health", ok404=True)
        if r.status_code == 404:
            return None
        health = self.answer(r, "/health", dict)
        return self.field(health, "display", "/health", bool)


class EmulatorPool:
    """Client of a GUI-Docker-Env-style pool: one emulator (a desktop) per lease.

    `/start_emulator` answers JSON with the emulator's id (`emulator_id` or `id`) and where its
    OSWorld server listens (`server_url`/`url`, or `ip`/`host` plus `port`/`server_port`)."""

    def __init__(self, url: str, token: str | None, timeout: float = 300.0) -> None:
        self.client = OSWorldClient(url, token, timeout)

    def start(self) -> tuple[str, str]:
        d = self.client.answer(
            self.client.request("POST", "/start_emulator", json={}), "/start_emulator"
        )
        eid = str(d.get("emulator_id", d.get("id", "")))
        url = d.get("server_url") or d.get("url")
        if not url and (host := d.get("ip") or d.get("host")):
            url = f"http://{host}:{d.get('server_port', d.get('port', 5000))}"
        if not eid or not url:
            raise EnvCrashed(f"emulator pool answered without an id and address: {d}")
        return eid, str(url)

    def stop(self, emulator_id: str) -> None:
        self.client.request("POST", "/stop_emulator", json={"emulator_id": emulator_id})

"""Run in .venv-osworld: calls OSWorld's own PythonController and SetupController on our
server for `tests/envs/osworld/test_controllers.py`, one JSON call a line on stdin:

    -> {"obj": "controller" | "setup", "method": "get_screenshot", "args": [...], "kwargs": {}}
    <- {"value": <JSON>} | {"bytes": "<base64>"} | {"raised": "TypeName: message"}

The server's address comes in OSW_URL and its bearer token in OSW_TOKEN (environment, not the
command line), the cache folder in OSW_CACHE and Chrome's debugging port in OSW_CHROMIUM_PORT
(default 9222, OSWorld's); the worker's `Network` adds the token to the requests OSWorld's
client makes.
Imports only the standard library, desktop_env and `dart_ray/envs/osworld/worker.py`.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def _load_worker():  # type: ignore[no-untyped-def]
    """dart_ray/envs/osworld/worker.py by its path: its folder holds modules named like
    common ones (setup, tasks), which must not go on this venv's sys.path."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "dart_ray" / "envs" / "osworld" / "worker.py"
    spec = importlib.util.spec_from_file_location("osworld_worker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


osworld_worker = _load_worker()


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what OSWorld's code prints goes to stderr
    osworld_worker.import_desktop_env()
    from desktop_env.controllers.python import PythonController
    from desktop_env.controllers.setup import SetupController

    url = urlsplit(os.environ["OSW_URL"])
    net = osworld_worker.Network()
    net.origin, net.token = f"{url.scheme}://{url.netloc}", os.environ.get("OSW_TOKEN")
    net.install()
    host, port = url.hostname or "127.0.0.1", url.port or 80
    objs: dict[str, Any] = {
        "controller": PythonController(vm_ip=host, server_port=port),
        "setup": SetupController(
            vm_ip=host,
            server_port=port,
            chromium_port=int(os.environ.get("OSW_CHROMIUM_PORT", "9222")),
            cache_dir=os.environ.get("OSW_CACHE", "cache"),
        ),
    }
    objs["controller"].retry_interval = 0.2  # a failing call answers in a second, not 15
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        call = json.loads(line)
        try:
            v = getattr(objs[call["obj"]], call["method"])(
                *call.get("args", []), **call.get("kwargs", {})
            )
            answer = (
                {"bytes": base64.b64encode(v).decode()} if isinstance(v, bytes) else {"value": v}
            )
        except Exception as e:  # the test asserts on it
            answer = {"raised": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer, default=repr) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

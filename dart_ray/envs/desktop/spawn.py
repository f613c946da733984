"""Start our desktop server as a child process and learn where it listens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dart_ray.envs.base import EnvCrashed


def spawn_server(
    width: int,
    height: int,
    window_manager: str,
    token: str,
    host: str = "127.0.0.1",
    root: Path | None = None,
    osworld_profile: bool = False,
) -> tuple[subprocess.Popen[str], str]:
    """(process, base URL) of a new `dart_ray.envs.desktop.server` with this bearer token.

    The token travels in the child's environment, never on its command line (which any
    local user can read in `ps`). `root` is the server's scratch folder (X auth, HOMEs); pass
    one to be able to remove it even if the server dies without cleaning up. `osworld_profile`
    runs it as OSWorld's `user` with HOME /home/user (`profile.py`)."""
    cmd = [
        sys.executable,
        "-m",
        "dart_ray.envs.desktop.server",
        "--host",
        host,
        "--port",
        "0",
        "--width",
        str(width),
        "--height",
        str(height),
        "--window-manager",
        window_manager,
        "--token-env",
        "DART_DESKTOP_TOKEN",
        *(["--root", str(root)] if root is not None else []),
        "--exit-with-parent",  # its X server and apps go when the session's process dies
    ]
    env = os.environ | {"DART_DESKTOP_TOKEN": token}
    if osworld_profile:
        from dart_ray.envs.desktop import profile

        cmd = profile.run_as_user([str(profile.PYTHON), *cmd[1:], "--osworld-profile"])
        if root is not None:
            profile.give_to_user(root)
        # only what the server needs: the desktop runs as `user`, who can read this process's
        # environment, so none of the caller's (root's) variables go with it
        keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ")}
        env = keep | {
            "DART_DESKTOP_TOKEN": token,
            "HOME": str(profile.HOME),
            "USER": profile.USER,
            "LOGNAME": profile.USER,
            "PATH": profile.PATH,  # never the caller's (root's pyenv dirs: EACCES for `user`)
            "PYTHONPATH": str(Path(__file__).resolve().parents[3]),  # this checkout's dart_ray
        }
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "listening on http://127.0.0.1:PORT display :N"
    if not line.startswith("listening on "):
        proc.kill()
        raise EnvCrashed(f"desktop server did not start (exit {proc.wait()}): {line!r}")
    return proc, line.split()[2]

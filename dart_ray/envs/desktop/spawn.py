"""Start our desktop server as a child process and learn where it listens.

With `confine`, the server and everything on its desktop run in a mount namespace of their own
where the machine's system folders (`CONFINED`) are overlays: what they change there (through
the OSWorld profile's `sudo`: packages, system files, users, other homes) lands in upper layers
under the given folder and never reaches the machine; a new server gets new, empty layers.
`LocalDesktopEnv` starts one per episode that way (`env.desktop.confine`), so no episode's
system changes reach the next. Making the namespace and mounting needs root.
"""

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
    confine: Path | None = None,
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
    if confine is not None:
        cmd = confined(cmd, confine)
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


CONFINED = ("/etc", "/usr", "/var", "/opt", "/srv", "/root", "/home")
"""The folders a confined desktop sees through overlays: what a package manager, `useradd` or
an edit of a system file changes. /tmp, /dev, /proc and /run stay the machine's (the server's
scratch folder lives in /tmp; processes are ended by the env, `namespace_processes`)."""

_OVERLAYS = """set -e
layers=$1; shift
for d in CONFINED; do
  [ -d "$d" ] || continue
  mkdir -p "$layers/upper$d" "$layers/work$d"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$layers/upper$d,workdir=$layers/work$d" "$d"
done
exec "$@"
""".replace("CONFINED", " ".join(CONFINED))


def confined(argv: list[str], layers: Path) -> list[str]:
    """`argv` run in a new mount namespace whose `CONFINED` folders are overlays with their
    upper layers under `layers` (EnvInputError when this process is not root)."""
    from dart_ray.envs.base import EnvInputError

    if os.geteuid() != 0:
        raise EnvInputError(
            "env.desktop.confine needs root (a mount namespace and overlays): start the "
            "session as root, or set env.desktop.confine=false"
        )
    layers.mkdir(parents=True, exist_ok=True)
    script = ["/bin/sh", "-c", _OVERLAYS, "dart-confine", str(layers)]
    return ["unshare", "--mount", "--propagation", "private", "--", *script, *argv]


def mount_namespace(pid: int) -> int | None:
    """The inode of `pid`'s mount namespace (None if it is gone or not readable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def namespace_processes(ns: int) -> list[int]:
    """Every process in mount namespace `ns`: what a confined desktop runs, daemons that left
    its process group through `setsid` or `sudo` included."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if (
            entry.name.isdigit()
            and int(entry.name) != me
            and mount_namespace(int(entry.name)) == ns
        ):
            out.append(int(entry.name))
    return out

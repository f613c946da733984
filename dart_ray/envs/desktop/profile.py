"""The OSWorld profile of our desktop: OSWorld's tasks unmodified, on this machine.

279 of OSWorld's 369 tasks name paths under `/home/user` (the VM's account), launch
`google-chrome`, open a terminal with Ctrl+Alt+T and run `sudo`. Rewriting their paths would
change the tasks (commands, expected outputs, evaluator options all carry them), so instead
the profile gives the desktop that account:

- the server and everything on the desktop run as the system account `user`, HOME
  `/home/user`, which a reset empties (it is not replaced: the path must stay);
- it runs on the desktop's own Python (`PYTHON`, with pyautogui), which `python` in commands
  means, as on OSWorld's VM;
- openbox reads our `rc.xml`, which binds Ctrl+Alt+T to a terminal (xterm titled Terminal);
- `scripts/install-osworld-desktop.sh` (root) creates the account (password locked: there is
  no default password), installs the apps, a `google-chrome` that runs Chromium, and sudo
  without a password for `user`.

Only root can become `user` (the account has no password): `LocalDesktopEnv` started by
root runs the server through `setpriv` as `user`; started by `user` itself, it runs it
directly. Anyone else gets an error saying so. Without the profile nothing changes: a fresh
HOME under the server's scratch folder, as the `desktop` tests expect.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

USER = "user"
HOME = Path("/home/user")
# the desktop's own interpreter (the install script builds it): `user` may not reach the one
# that starts the server (a pyenv under /root), and OSWorld's `python` commands run here
PYTHON = Path("/opt/dart-osworld-desktop/venv/bin/python")
# what a reset puts in the emptied HOME, as OSWorld's VM image has it: files its apps write
# on their first run that tasks read back (VLC's vlcrc: the install script makes them)
SKELETON = Path("/opt/dart-osworld-desktop/home")
# the desktop's PATH: that Python first (`python3` in a shell line has pyautogui, as on the VM)
PATH = f"{PYTHON.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERMINAL = "xterm -T Terminal -geometry 100x30+40+40"

RC_XML = f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- dart-ray OSWorld profile: openbox's defaults, plus Ctrl+Alt+T for a terminal -->
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <focus><focusNew>yes</focusNew><followMouse>no</followMouse></focus>
  <placement><policy>Smart</policy></placement>
  <desktops><number>1</number></desktops>
  <keyboard>
    <keybind key="C-A-t"><action name="Execute"><command>{TERMINAL}</command></action></keybind>
  </keyboard>
</openbox_config>
"""


class ProfileMissing(RuntimeError):
    """The OSWorld profile is asked for but this machine does not have it installed."""


def check_installed() -> None:
    """Raise ProfileMissing naming what is missing (the account, its home, the tools)."""
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        raise ProfileMissing(
            f"no account {USER!r}: run scripts/install-osworld-desktop.sh as root"
        ) from None
    if Path(pw.pw_dir) != HOME or not HOME.is_dir():
        raise ProfileMissing(f"account {USER!r} must have the home {HOME} (it has {pw.pw_dir})")
    if not PYTHON.exists():
        raise ProfileMissing(f"no {PYTHON}: run scripts/install-osworld-desktop.sh")
    for tool in ("setpriv", "sudo", "soffice"):
        if shutil.which(tool) is None:
            raise ProfileMissing(f"{tool} is not installed: run scripts/install-osworld-desktop.sh")


def run_as_user(argv: list[str]) -> list[str]:
    """`argv` wrapped to run as `user`: through setpriv when we are root, as is when we are
    `user`; anyone else cannot become `user` and gets ProfileMissing naming why."""
    check_installed()
    pw = pwd.getpwnam(USER)
    if os.geteuid() == pw.pw_uid:
        return argv
    if os.geteuid() != 0:
        raise ProfileMissing(
            f"the OSWorld profile runs the desktop as {USER!r}: start it as root or as {USER!r}"
        )
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", *argv]


def give_to_user(path: Path) -> None:
    """Hand a scratch folder made by root to `user`, who will run the server in it; made
    afresh where it is gone (a confined desktop's reset starts a new server in the folder
    the last one removed when it stopped)."""
    pw = pwd.getpwnam(USER)
    if os.geteuid() == 0:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def write_openbox_config(root: Path) -> Path:
    path = root / "openbox-rc.xml"
    path.write_text(RC_XML)
    return path

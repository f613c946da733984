#!/usr/bin/env bash
# Install (idempotently) the OSWorld desktop profile: the Debian apps OSWorld's Ubuntu tasks
# use, and the `user` account whose home is /home/user, the paths 279 of its 369 tasks name.
#
#   apps: LibreOffice Calc/Writer/Impress, Chromium (as `google-chrome`, the name OSWorld's
#         tasks launch), GIMP, VLC, Thunderbird, socat (tasks forward 9222 to Chrome's 1337),
#         dconf-cli (pyautogui asks dconf whether the mouse is left-handed),
#         sudo, AT-SPI (python3-pyatspi, at-spi2-core, dbus-x11; libreoffice-gtk3 so LibreOffice
#         publishes its widgets) and xdotool
#   user: a system account `user`, home /home/user, shell bash, password locked (`passwd -l`:
#         no login with a password, no default password), and
#         /etc/sudoers.d/dart-osworld-user granting it sudo without a password, because
#         OSWorld's tasks run `sudo` in their setup and solutions (the VM's user has sudo).
#   home: /opt/dart-osworld-desktop/home, copied into the emptied HOME at every reset: what
#         the apps' first run writes on OSWorld's VM image (VLC's vlcrc)
#   python: /opt/dart-osworld-desktop/venv, from Debian's python3, with what our desktop server
#         imports (pyautogui, python-xlib, Pillow, pydantic, ...): the server runs as `user`,
#         who may not be able to reach the interpreter of the venv that starts it (pyenv under
#         /root), and `python` in OSWorld's commands means this interpreter, as on the VM.
#
# Only root can run code as `user`: the desktop server is started as `user` by a root process
# (setpriv in dart_ray/envs/desktop/spawn.py). So `user`'s sudo reaches only what runs on the
# desktop, which is anyway code execution by design (docs/ENVIRONMENTS.md, Security): install
# the profile only on a machine or container given to the desktop. OSWORLD_SUDO=0 skips the
# sudoers file (tasks that need sudo then fail in setup).
#
# The existing `desktop` tests do not need any of this; `make test-osworld-apps` runs it.
set -euo pipefail

PKGS=(python3-venv python3-tk libreoffice-calc libreoffice-writer libreoffice-impress libreoffice-gtk3
      chromium gimp vlc thunderbird
      socat sudo dconf-cli python3-pyatspi gir1.2-atspi-2.0 at-spi2-core dbus-x11 xdotool
      xvfb xauth openbox wmctrl xterm)
if [ "$(id -u)" -ne 0 ]; then
  echo "install-osworld-desktop: needs root (apt, an account, a sudoers file)" >&2
  exit 1
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-osworld-desktop: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if ! id user >/dev/null 2>&1; then
  useradd --system --create-home --home-dir /home/user --shell /bin/bash user
fi
passwd -l user >/dev/null  # locked: no password works, none is set
install -d -o user -g user -m 0755 /home/user

sudoers=/etc/sudoers.d/dart-osworld-user
if [ "${OSWORLD_SUDO:-1}" = 1 ]; then
  tmp=$(mktemp)
  echo "# dart-ray OSWorld profile (scripts/install-osworld-desktop.sh): the desktop's user" >"$tmp"
  echo "user ALL=(ALL) NOPASSWD: ALL" >>"$tmp"
  visudo -cqf "$tmp"
  install -m 0440 "$tmp" "$sudoers"
  rm -f "$tmp"
else
  rm -f "$sudoers"
fi

PYVENV=/opt/dart-osworld-desktop/venv
PYPKGS=(pyautogui python-xlib pillow pydantic sqlalchemy pyyaml psutil requests)
# checked as `user`: an interpreter reached through a folder closed to others would not do
if ! runuser -u user -- "$PYVENV/bin/python" -c "import pyautogui, Xlib, PIL, pydantic, sqlalchemy, yaml, psutil, requests" 2>/dev/null; then
  echo "install-osworld-desktop: building $PYVENV (${PYPKGS[*]})"
  rm -rf "$PYVENV"
  /usr/bin/python3 -m venv "$PYVENV"  # Debian's, not whatever python3 PATH finds first
  "$PYVENV/bin/python" -m pip -qq --disable-pip-version-check install "${PYPKGS[@]}"
  chmod -R a+rX /opt/dart-osworld-desktop
fi

# What OSWorld's VM image has in the user's HOME and a reset puts back (profile.SKELETON):
# VLC's settings file, written by VLC's first run (every setting at its default, commented),
# which OSWorld's VLC getters read (a HOME without one fails them with an error, not a 0).
SKEL=/opt/dart-osworld-desktop/home
if [ ! -s "$SKEL/.config/vlc/vlcrc" ]; then
  first=$(mktemp -d)
  chown user:user "$first"
  (cd "$first" && runuser -u user -- env HOME="$first" vlc -I dummy --reset-config vlc://quit \
    >/dev/null 2>&1)
  install -d -m 0755 "$SKEL/.config/vlc"
  install -m 0644 "$first/.config/vlc/vlcrc" "$SKEL/.config/vlc/vlcrc"
  rm -rf "$first"
fi
chmod -R a+rX "$SKEL"

# OSWorld's tasks launch `google-chrome`; Debian ships Chromium. Its remote debugging port
# (--remote-debugging-port=1337 in the tasks) binds 127.0.0.1; its profile is where OSWorld's
# Chrome getters read it (~/.config/google-chrome). Many tasks end Chrome with `pkill chrome`
# before a getter reads the settings it writes when it closes; Chromium names its process
# `chromium`, which that pattern misses, so this wrapper stays as its parent, named
# `google-chrome` (which it matches), and hands the signal on to the browser.
rm -rf /usr/local/lib/dart-osworld
cat >/usr/local/bin/google-chrome <<'EOF'
#!/bin/sh
# dart-ray OSWorld profile: OSWorld's tasks call google-chrome; this desktop has Chromium.
# Stays as the browser's parent so that `pkill chrome` ends it (install-osworld-desktop.sh)
chromium --no-first-run --no-default-browser-check --password-store=basic \
  --remote-debugging-address=127.0.0.1 --user-data-dir="$HOME/.config/google-chrome" "$@" &
browser=$!
trap 'kill -TERM $browser 2>/dev/null' TERM INT HUP
wait $browser
status=$?
wait $browser 2>/dev/null  # after a signal: until the browser has written its files and ended
exit $status
EOF
chmod 0755 /usr/local/bin/google-chrome
echo "install-osworld-desktop: profile ready (user, /home/user, ${#PKGS[@]} packages)"

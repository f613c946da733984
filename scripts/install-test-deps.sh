#!/usr/bin/env bash
# Install the Debian packages the `browser` and `desktop` test tiers need, if any is missing:
#   browser: chromium + chromium-driver (MiniWoB++ in headless Chromium, offline)
#   desktop: xvfb + xauth (a private X display), openbox (window manager), wmctrl (window
#            control for /setup/activate_window), xterm and mousepad (the desktop's apps)
#            ffmpeg (x11grab: /start_recording and /end_recording)
# Idempotent and fast when everything is there (one dpkg-query). Needs root to install.
set -euo pipefail

PKGS=(chromium chromium-driver xvfb xauth openbox wmctrl xterm mousepad ffmpeg)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-test-deps: browser and desktop packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-deps: missing ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-test-deps: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null

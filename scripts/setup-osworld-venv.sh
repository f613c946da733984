#!/usr/bin/env bash
# Build (idempotently) the separate virtual environment OSWorld's own evaluators run in.
#
# Why a third venv: OSWorld's client, setup steps, getters and metrics ship on PyPI as
# `desktop-env`, whose requirements pin torch 2.5, transformers 4.35, numpy < 2 and pull cloud
# SDKs (AWS, Azure, Aliyun), LLM clients and wandb. None of that may reach the training venv,
# and the evaluators need little of it. So `desktop-env` goes in with --no-deps, followed by
# the packages its controllers, getters and metrics import (found by importing them).
#
# Left out, because they pull torch or a numerics stack no metric of the desktop suite needs:
#   easyocr  (torch)            -> metric compare_image_text (docs)
#   librosa  (numba, llvmlite)  -> metric compare_audios (vlc)
# dart_ray/envs/osworld/worker.py puts a stand-in module in their place so the metrics import,
# and refuses a task naming one of those metrics, naming the package (docs/ENVIRONMENTS.md).
# Playwright is installed as a package but without its browser download (nothing outside the
# registries can be fetched): the Chrome getters that drive a browser through CDP fail there.
#
# Usage: scripts/setup-osworld-venv.sh [VENV]   (default .venv-osworld; DESKTOP_ENV_SPEC
# overrides the pin)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-osworld}"
DESKTOP_ENV_SPEC="${DESKTOP_ENV_SPEC:-desktop-env==1.0.2}"
# What the imports of desktop_env.controllers, .evaluators and .desktop_env need, with the
# bounds desktop-env asks for where it gives one.
DEPS=(
    "numpy>=1.26,<2" "pandas>=2.2,<2.3" "Pillow~=11.0.0" "gymnasium~=0.28.1" "pytz"
    requests requests-toolbelt lxml cssselect xmltodict pyyaml chardet beautifulsoup4
    openpyxl python-docx python-pptx odfpy formulas
    pypdf PyPDF2 pdfplumber pymupdf borb
    rapidfuzz ImageHash scikit-image opencv-python-headless scipy
    mutagen pyacoustid fastdtw
    playwright pydrive python-dotenv tldextract
)
STAMP="$VENV/.installed-stamp"
WANT="$DESKTOP_ENV_SPEC|$(sha256sum "$0" | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "osworld venv $VENV is up to date ($DESKTOP_ENV_SPEC)"
    exit 0
fi
echo "== building osworld venv $VENV ($DESKTOP_ENV_SPEC, without its torch/cloud dependencies)"
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
quiet() { grep -v -e '^WARNING: Location' -e 'dependency' -e '^desktop-env .* requires' || true; }
PIP=("$VENV/bin/python" -m pip -qq --disable-pip-version-check)
"${PIP[@]}" install --upgrade pip 2>&1 | quiet
"${PIP[@]}" install --no-deps "$DESKTOP_ENV_SPEC" 2>&1 | quiet
"${PIP[@]}" install "${DEPS[@]}" 2>&1 | quiet
# the worker imports what it will call; this fails the build, not the first evaluation
"$VENV/bin/python" dart_ray/envs/osworld/worker.py --check
for banned in torch transformers; do
    if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$banned') is None)"; then
        echo "$banned was installed into $VENV; it must not be" >&2
        exit 1
    fi
done
echo "$WANT" > "$STAMP"
echo "== $VENV is ready"

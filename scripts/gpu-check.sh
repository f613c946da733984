#!/usr/bin/env bash
# The GPU check: one script for one short slot on a machine with one CUDA GPU, writing a
# results folder. On a bare GPU machine (torch only) it takes 2-3 minutes; every step has a
# cap, all of them together 10 minutes. Run it on CPU first with --dry-run: same steps, CPU
# sizes, nothing that needs CUDA (tests/test_gpu_check.py runs the dry run in CI).
#
#   scripts/gpu-check.sh [--dry-run] [OUT]      (OUT: the results folder, default gpu-check)
#
# Steps, each with its own time limit and log in OUT, and a line in OUT/SUMMARY.md:
#   env          the GPU, driver, Python and torch it found
#   weight-load  benchmarks/weight_load.py: packed bf16 weights of 1B and 7B parameters into
#                a model on the GPU, `load_into` (pageable, per tensor) vs `load_into_staged`
#                (two pinned buffers, overlapped) vs the pinned host->device and device->device
#                floors (dry run: 10M and 100M on the CPU)
#   staged-exact the staged load's exactness test (tests/test_weights.py, marker gpu)
#   vllm-lora    LoRA adapters published to the vLLM engine (tests/engines/test_vllm.py -k lora)
#   gpu-tier     `pytest -m gpu` (the recipe on vLLM and NCCL) where Ray and vLLM import;
#                a bare GPU machine without them records the step as not run, naming what
#                is missing (the GPU machines lent here cannot install packages, and a Ray
#                wheel alone is larger than what may be carried to them)
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1
  shift
fi
OUT=${1:-gpu-check}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$OUT"
SUMMARY="$OUT/SUMMARY.md"
{
  echo "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)$([ $DRY = 1 ] && echo ' (dry run on CPU)')"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---:|---|"
} >"$SUMMARY"
FAILED=0

step() { # step NAME LIMIT_S COMMAND...: run with a limit, log to OUT/NAME.log, one summary line
  local name=$1 limit=$2 t0 rc res
  shift 2
  echo "== $name (at most ${limit}s)"
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  case $rc in
    0) res=passed ;;
    124) res="timed out after ${limit}s"; FAILED=1 ;;
    *) res="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  echo "| $name | $res | $(($(date +%s) - t0)) | $name.log |" >>"$SUMMARY"
  tail -n 12 "$OUT/$name.log"
}

skip() { # skip NAME REASON
  echo "== $1: not run ($2)"
  echo "| $1 | not run: $2 | 0 | - |" >>"$SUMMARY"
}

step env 60 bash -c "
  if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo 'nvidia-smi: not found'; fi
  $PYTHON -c 'import platform, torch; print(platform.python_version(), torch.__version__, \"cuda\" if torch.cuda.is_available() else \"no cuda\", torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"\")'
"

if [ $DRY = 1 ]; then
  step weight-load 120 "$PYTHON" benchmarks/weight_load.py --device cpu --sizes 10M,100M \
    --repeats 2 --out "$OUT/weight_load.json"
else
  step weight-load 240 "$PYTHON" benchmarks/weight_load.py --device cuda --sizes 1B,7B \
    --repeats 5 --out "$OUT/weight_load.json"
fi

# the exactness test needs only torch and pytest; tests/conftest.py imports the rest of the
# project's dependencies, so it runs where they are installed
if "$PYTHON" -c "import pytest, ray, pydantic, sqlalchemy" 2>/dev/null; then
  step staged-exact 60 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_weights.py
  missing=$("$PYTHON" -c "
import importlib.util
print(' '.join(m for m in ('vllm',) if importlib.util.find_spec(m) is None))")
  if [ -n "$missing" ] && [ $DRY = 0 ]; then
    skip gpu-tier "$missing is not installed for $PYTHON"
    skip vllm-lora "$missing is not installed for $PYTHON"
  else
    # dry run: collected and skipped without CUDA, which checks that the tier imports
    step gpu-tier 240 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_recipe.py
    # train.lora on vLLM: published adapters served as LoRA adapters, answers as the
    # transformers engine's with the same adapters (on CPU: .venv-vllm's `make test-vllm`)
    if [ -n "$missing" ]; then
      skip vllm-lora "$missing is not installed for $PYTHON"
    else
      step vllm-lora 180 "$PYTHON" -m pytest -q -p no:cacheprovider -m vllm -k lora \
        tests/engines/test_vllm.py
    fi
  fi
else
  skip staged-exact "the project's dependencies (Ray, pydantic, SQLAlchemy) are not installed for $PYTHON"
  skip gpu-tier "Ray and vLLM are not installed for $PYTHON"
  skip vllm-lora "Ray and vLLM are not installed for $PYTHON"
fi

echo
cat "$SUMMARY"
exit $FAILED

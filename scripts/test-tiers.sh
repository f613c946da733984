#!/usr/bin/env bash
# The test command of the README (`make test` runs it): every tier but `gpu`, `learning` and
# `schedule`, each timed, then a table of the tiers and the total, so CI's log shows where its
# minutes go.
#   parallel  pure logic, stores (SQLite and MariaDB), environments: pytest-xdist, 2 workers
#   serial    everything on the session's local Ray (marker `ray`, set by tests/conftest.py
#             for tests that use the `ray_local` fixture) and the `slow` end-to-end runs: one
#             Ray, one Serve HTTP port and fixed test ports per host, so one at a time
#   vllm      the vLLM engine in .venv-vllm (TEST_VLLM=0 skips it)
# With arguments, they go to one plain pytest run instead (e.g. `make test PYTEST_ARGS=-x`).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
BASE="not gpu and not learning and not schedule"
if [ $# -gt 0 ]; then
  exec "$VENV/bin/pytest" "$@"
fi
declare -a NAMES=() SECS=() RCS=()
tier() {
  local name=$1 t0 rc
  shift
  echo "== tier $name: $*"
  t0=$(date +%s)
  "$@"
  rc=$?
  NAMES+=("$name") SECS+=($(($(date +%s) - t0))) RCS+=("$rc")
}
tier parallel "$VENV/bin/pytest" -n 2 -m "$BASE and not ray and not slow"
tier serial "$VENV/bin/pytest" --durations=20 -m "$BASE and (ray or slow)"
if [ "${TEST_VLLM:-1}" = 1 ]; then
  tier vllm make --no-print-directory test-vllm
fi
total=0 failed=0
printf '\n%-10s %8s  %s\n' tier seconds result
for i in "${!NAMES[@]}"; do
  total=$((total + SECS[i]))
  [ "${RCS[i]}" = 0 ] && res=passed || { res="FAILED (exit ${RCS[i]})"; failed=1; }
  printf '%-10s %8s  %s\n' "${NAMES[i]}" "${SECS[i]}" "$res"
done
printf '%-10s %8s\n' total "$total"
exit "$failed"

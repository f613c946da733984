#!/usr/bin/env bash
# The test command of the README (`make test` runs it): every tier but `gpu`, `learning`,
# `schedule` and `bench`, each timed, then a table of the tiers and the wall time, so CI's log shows where
# its minutes go.
#   parallel  pure logic, stores (SQLite and MariaDB), environments: pytest-xdist, 2 workers
#   ray       the tests on the session's local Ray (marker `ray`, set by tests/conftest.py for
#             tests that use the `ray_local` fixture): one Ray, one Serve HTTP port and fixed
#             test ports per host, so one at a time
#   cluster   the `slow` end-to-end runs that start their own Ray cluster (faults, job submit,
#             `make run` from a clean clone, load): after the `ray` tier, so that the session's
#             Ray is gone (two clusters on a host share its CPUs, and Ray Train's placement
#             group cleaner cannot tell which one is its own)
#   osworld   OSWorld's own controllers and evaluators (PyPI desktop-env) in .venv-osworld
#             against our desktop (TEST_OSWORLD=0 skips it)
#   vllm      the vLLM engine in .venv-vllm (TEST_VLLM=0 skips it). The two venvs are built in
#             the background from the start (pip: mostly network and disk), one after the
#             other, each one's log printed when its tier begins.
# With arguments, they go to one plain pytest run instead (e.g. `make test PYTEST_ARGS=-x`).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
BASE="not gpu and not learning and not schedule and not bench and not osworld_apps"
if [ $# -gt 0 ]; then
  exec "$VENV/bin/pytest" "$@"
fi
declare -a NAMES=() SECS=() RCS=()
record() { NAMES+=("$1") SECS+=("$2") RCS+=("$3"); }
tier() {
  local name=$1 t0 rc
  shift
  echo "== tier $name: $*"
  t0=$(date +%s)
  "$@"
  rc=$?
  record "$name" $(($(date +%s) - t0)) "$rc"
}
# build_venv NAME MAKE-TARGET [AFTER]: build a venv in the background (after AFTER's build,
# one pip at a time on 2 cores), its log and "seconds rc" in $TMP_VENVS/NAME{.log,.done}
TMP_VENVS=$(mktemp -d)
build_venv() {
  local name=$1 target=$2 after=${3:-}
  (
    [ -n "$after" ] && while [ ! -f "$TMP_VENVS/$after.done" ]; do sleep 5; done
    local t0 rc
    t0=$(date +%s)
    make --no-print-directory "$target" >"$TMP_VENVS/$name.log" 2>&1
    rc=$?
    echo "$(($(date +%s) - t0)) $rc" >"$TMP_VENVS/$name.done"
  ) &
}
# venv_ready NAME: wait for NAME's build, print its log, record it; true if it built
venv_ready() {
  local name=$1 secs rc
  while [ ! -f "$TMP_VENVS/$name.done" ]; do sleep 2; done
  read -r secs rc <"$TMP_VENVS/$name.done"
  echo "== $name venv (built in the background in ${secs} s):"
  cat "$TMP_VENVS/$name.log"
  record "$name-venv" "$secs" "$rc"
  [ "$rc" = 0 ]
}
start=$(date +%s)
[ "${TEST_VLLM:-1}" = 1 ] && build_venv vllm vllm-venv
# after the vLLM venv's build; both are done long before the tiers that need them
[ "${TEST_OSWORLD:-1}" = 1 ] && build_venv osworld osworld-venv "$([ "${TEST_VLLM:-1}" = 1 ] && echo vllm)"
tier parallel "$VENV/bin/pytest" -n 2 --durations=15 -m "$BASE and not ray and not slow and not osworld"
tier ray "$VENV/bin/pytest" --durations=25 -m "$BASE and ray"
tier cluster "$VENV/bin/pytest" --durations=15 -m "$BASE and slow and not ray and not osworld"
if [ "${TEST_OSWORLD:-1}" = 1 ] && venv_ready osworld; then
  tier osworld "$VENV/bin/pytest" --durations=5 -m "$BASE and osworld" tests/envs
fi
if [ "${TEST_VLLM:-1}" = 1 ] && venv_ready vllm; then
  tier vllm make --no-print-directory test-vllm
fi
rm -rf "$TMP_VENVS"
failed=0
printf '\n%-12s %8s  %s\n' tier seconds result
for i in "${!NAMES[@]}"; do
  [ "${RCS[i]}" = 0 ] && res=passed || { res="FAILED (exit ${RCS[i]})"; failed=1; }
  case "${NAMES[i]}" in *-venv) res="$res (in the background)" ;; esac
  printf '%-12s %8s  %s\n' "${NAMES[i]}" "${SECS[i]}" "$res"
done
printf '%-12s %8s\n' wall $(($(date +%s) - start))
exit "$failed"

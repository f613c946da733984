#!/usr/bin/env bash
# Print the custom Ray resources this machine offers, as JSON for `ray start --resources`.
#
# On machines a lab already owns (cluster/local.yaml) every worker runs the same start
# command, so the machine decides its own role:
#   a GPU machine (nvidia-smi lists a GPU) hosts policy replicas and train workers: no `env`;
#   a CPU machine hosts environment sessions: one `env` unit per DART_RAY_CPUS_PER_ENV cores.
# DART_RAY_ENV_RESOURCE must equal the run's `env.resource` (default "env").
set -euo pipefail
name="${DART_RAY_ENV_RESOURCE:-env}"
per="${DART_RAY_CPUS_PER_ENV:-2}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo '{}'
    exit 0
fi
units=$(( $(nproc) / per ))
if (( units < 1 )); then
    units=1
fi
printf '{"%s": %d}\n' "$name" "$units"

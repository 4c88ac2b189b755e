#!/usr/bin/env bash
# The nightly tier's cluster runs: every clustered scenario (scenarios/*-cluster-*.toml) over seeds 1-5, each
# run checked, then the scoreboard over them (docs/scoreboard.md; what they find: docs/findings.md).  A run's
# own verdict does not stop the others; the exit status is the worst: 2 if any run was unknown, else 1 if any
# found a violation, else 0.  OUT (default runs/nightly-clusters) holds the runs and the scoreboard.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$here/runs/nightly-clusters}"
cd "$here"
worst=0
for scenario in scenarios/*-cluster-*.toml; do
  for seed in 1 2 3 4 5; do
    .venv/bin/ordeal run "$scenario" --seed "$seed" --out "$out"
    code=$?
    if [ "$code" -gt 2 ]; then exit "$code"; fi
    if [ "$code" -eq 2 ] || { [ "$code" -eq 1 ] && [ "$worst" -eq 0 ]; }; then worst=$code; fi
  done
done
.venv/bin/ordeal scoreboard "$out" --out "$out/scoreboard"
exit "$worst"

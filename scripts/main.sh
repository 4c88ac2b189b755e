#!/usr/bin/env bash
# The main job: set everything up (idempotent), then run the default scenario end to end with its report.
# Extra arguments go to `ordeal run` (e.g. --seed 7).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
exec .venv/bin/ordeal run scenarios/p2p-smoke.toml --seed 1 "$@"

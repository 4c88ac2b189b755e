#!/usr/bin/env bash
# The tests: set everything up (idempotent), then run lint, the unit tests and the integration tests
# against the real local stack. Extra arguments go to pytest (e.g. -k wraparound, -m "not slow").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -ra --reruns 1 --reruns-delay 2 "$@"

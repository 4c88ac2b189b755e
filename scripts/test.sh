#!/usr/bin/env bash
# The tests: set everything up (idempotent), then run lint, the layer contract (import-linter, pyproject.toml
# [tool.importlinter]), the unit tests and the integration tests against the real local stack. Extra
# arguments go to pytest (e.g. -k wraparound, -m "not slow").  No reruns: an intermittent failure is a
# finding (a test that truly needs a retry says so itself, with a marker and its reason).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
.venv/bin/ruff check .
.venv/bin/lint-imports
exec .venv/bin/python -m pytest -ra "$@"

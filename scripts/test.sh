#!/usr/bin/env bash
# The tests: set everything up (idempotent), then run lint, the layer contract (import-linter, pyproject.toml
# [tool.importlinter]) and every test tier once (pytest's testpaths: tests/integration against the real local
# stack, tests/checkers on Spark, tests/unit; tests/README.md). Extra arguments go to pytest (e.g.
# -k wraparound, -m "not slow").  No reruns: an intermittent failure is a finding (a test that truly needs a
# retry says so itself, with a marker and its reason).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
.venv/bin/ruff check .
.venv/bin/lint-imports
# The containers provider's images (tests marked `containers`): built once from Debian packages, then reused
# by content hash (first build ~2.5 min, reuse < 1 s).  Root only (rootful Podman); in the host's network
# namespace, since apt-get inside the builds needs the mirror.
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null 2>&1 && [ "${ORDEAL_CONTAINERS:-1}" != 0 ]; then
  .venv/bin/ordeal images build
fi
# Tests marked `nightly` (longer cluster runs) are left to the nightly tier (tox -e nightly); an -m of the
# caller's, given after, replaces this one.
# Every test's outcome and time also go to a JUnit file outside the checkout (ORDEAL_TEST_JUNIT), so the times of
# the last full run on this machine can be read after its checkout is gone (where the suite's time goes).
exec .venv/bin/python -m pytest -ra -m "not nightly" --junitxml="${ORDEAL_TEST_JUNIT:-/var/tmp/ordeal-tests-junit.xml}" "$@"

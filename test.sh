#!/usr/bin/env bash
# Runs heavylift's whole test suite from scratch: installs what it needs, then pytest.
# Extra arguments go to pytest (e.g. ./test.sh -k templates).
set -euo pipefail
cd "$(dirname "$0")"
scripts/bootstrap.sh
exec .venv/bin/pytest -q -p no:cacheprovider --durations=15 "$@"

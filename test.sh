#!/usr/bin/env bash
# Runs heavylift's tests from scratch: installs what it needs, then ruff (a finding fails the
# run), then pytest.
#
#   ./test.sh          the whole suite, end-to-end tests included (SSH test hosts, real vLLM)
#   ./test.sh --fast   ruff and the tests that need no test host: schema, rules, planning,
#                      templates, operation and fact fixtures (pytest -m "not e2e")
#
# Further arguments go to pytest (e.g. ./test.sh --fast -k templates).
set -euo pipefail
cd "$(dirname "$0")"
tier=()
if [ "${1-}" = "--fast" ]; then
    shift
    tier=(-m "not e2e")
fi
scripts/bootstrap.sh
.venv/bin/ruff check --quiet .
exec .venv/bin/pytest -q -p no:cacheprovider --durations=15 ${tier[@]+"${tier[@]}"} "$@"

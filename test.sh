#!/usr/bin/env bash
# Runs heavylift's tests from scratch: installs what it needs, then ruff (a finding fails the
# run), then pytest.
#
#   ./test.sh          the whole suite, end-to-end tests included (SSH test hosts, real vLLM)
#   ./test.sh --fast   ruff and the tests that need no test host: schema, rules, planning,
#                      templates, operation and fact fixtures (pytest -m "not e2e")
#
# Further arguments go to pytest (e.g. ./test.sh --fast -k templates), which then runs once, as
# given. The whole suite (no arguments) runs in lanes (docs/testing.md): first the fleet module
# alone (it measures a rolling upgrade under client traffic), then two lanes of modules side by
# side, each a pytest process of its own. A vLLM start is three Python processes importing torch
# and vLLM one after another, so one lane leaves much of two cores idle.
set -euo pipefail
cd "$(dirname "$0")"
tier=()
if [ "${1-}" = "--fast" ]; then
    shift
    tier=(-m "not e2e")
fi
scripts/bootstrap.sh
.venv/bin/ruff check --quiet .
pytest=(.venv/bin/pytest -q -p no:cacheprovider --durations=15)
if [ ${#tier[@]} -gt 0 ] || [ $# -gt 0 ]; then
    exec "${pytest[@]}" ${tier[@]+"${tier[@]}"} "$@"
fi

# what the lanes share (the uv cache's fill, the venv seed: tests/conftest.py built_once)
HEAVYLIFT_TEST_SHARED=$(mktemp -d /var/tmp/heavylift-tests.XXXXXX)
export HEAVYLIFT_TEST_SHARED
trap 'rm -rf "$HEAVYLIFT_TEST_SHARED"' EXIT

FLEET=tests/test_e2e_waves.py
# lane 1: single-host rollouts; lane 2 takes every other file (a new test file lands there)
LANE1=(tests/test_e2e_rollout.py tests/test_e2e_deploy.py tests/test_e2e_mla.py tests/test_e2e_hostlock.py
       tests/test_e2e_runtime.py)
ignored=()
for file in "$FLEET" "${LANE1[@]}"; do
    ignored+=(--ignore="$file")
done

status=0
started=$SECONDS
echo "== lane 0: $FLEET alone"
HEAVYLIFT_TEST_LANE=0 "${pytest[@]}" "$FLEET" || status=1

echo "== lanes 1 and 2 side by side: lane 1 is ${LANE1[*]}; lane 2 the rest (its output follows as it runs)"
lane1_log="$HEAVYLIFT_TEST_SHARED/lane1.log"
HEAVYLIFT_TEST_LANE=1 "${pytest[@]}" "${LANE1[@]}" >"$lane1_log" 2>&1 &
lane1=$!
HEAVYLIFT_TEST_LANE=2 "${pytest[@]}" tests "${ignored[@]}" || status=1
wait "$lane1" || status=1
echo "== lane 1's output"
cat "$lane1_log"
echo "== the suite took $((SECONDS - started)) s; $([ "$status" = 0 ] && echo "every lane passed" || echo "a lane FAILED")"
exit "$status"

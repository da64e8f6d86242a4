#!/usr/bin/env bash
# The demo: deploys the tiny random-weight Llama on this machine with the real CPU build of
# vLLM, exactly as a GPU site is deployed, and prints a completion from it.
#
#   ./demo.sh          set up, converge the demo site, print a completion
#   ./demo.sh stop     stop the demo's vLLM and Hub mirror
#
# What it runs for you: scripts/bootstrap.sh, a local Hub mirror (olah) on 127.0.0.1:8390
# serving heavylift/tiny-llama generated into .demo/, then
#   .venv/bin/pyinfra -y inventory/demo.py deploy.py
set -euo pipefail
cd "$(dirname "$0")"

DEMO_DIR="$PWD/.demo"
MIRROR_PORT=8390
VLLM_PORT=8321
DEMO_ROOT=/opt/heavylift-demo

stop_demo() {
    start-stop-daemon --stop --oknodo --remove-pidfile --retry TERM/30/KILL/5 \
        --pidfile "$DEMO_ROOT/deployments/tiny-llama/run/serve.pid" >/dev/null || true
    start-stop-daemon --stop --oknodo --remove-pidfile --retry TERM/10/KILL/5 \
        --pidfile "$DEMO_DIR/hub-mirror.pid" >/dev/null || true
    echo "demo stopped"
}

if [ "${1:-}" = "stop" ]; then
    stop_demo
    exit 0
fi

scripts/bootstrap.sh

# the checkpoint: generated locally (deterministic), published as a git repo the mirror serves
mkdir -p "$DEMO_DIR"
.venv/bin/python -m testbed.tiny_model llama "$DEMO_DIR/tiny-llama"
.venv/bin/python -m testbed.hub_mirror publish --dir "$DEMO_DIR/hub" --repo heavylift/tiny-llama --src "$DEMO_DIR/tiny-llama"

if ! curl -fsS -o /dev/null "http://127.0.0.1:$MIRROR_PORT/api/models/heavylift/tiny-llama/revision/main" 2>/dev/null; then
    echo "demo: starting the Hub mirror on 127.0.0.1:$MIRROR_PORT"
    start-stop-daemon --start --background --make-pidfile --pidfile "$DEMO_DIR/hub-mirror.pid" \
        --output "$DEMO_DIR/hub-mirror.log" --chdir "$PWD" \
        --exec "$PWD/.venv/bin/python" -- -m testbed.hub_mirror serve --dir "$DEMO_DIR/hub" --port "$MIRROR_PORT"
    for _ in $(seq 1 60); do
        curl -fsS -o /dev/null "http://127.0.0.1:$MIRROR_PORT/api/models/heavylift/tiny-llama/revision/main" 2>/dev/null && break
        sleep 0.5
    done
fi

.venv/bin/pyinfra -y inventory/demo.py deploy.py

echo
echo "demo: asking the served model for a completion"
curl -fsS "http://127.0.0.1:$VLLM_PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "heavylift/tiny-llama", "prompt": "Hello, heavylift", "max_tokens": 16, "temperature": 0}'
echo
echo "demo: vLLM serves heavylift/tiny-llama at http://127.0.0.1:$VLLM_PORT/v1 (./demo.sh stop to stop it)"

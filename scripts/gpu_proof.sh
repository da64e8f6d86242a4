#!/usr/bin/env bash
# The GPU proof, run on the lent GPU machine (no registry, no Hub) in stages, each call of the device
# tool running some of them back to back; state lives in /tmp/hl, figures go to $OUT (docs/gpu-proof.md).
#
#   scripts/gpu_proof.sh carry              copy the payload parts this call carried (.gpu/) to /tmp/hl/parts
#   scripts/gpu_proof.sh facts              the machine: nvidia-smi, the image's Python packages, init system
#   scripts/gpu_proof.sh checkpoints        generate the checkpoints (testbed/gpu_checkpoints.py) with the image's torch
#   scripts/gpu_proof.sh setup              unpack the payload, heavylift's control venv, checkpoints, Hub stand-ins
#   scripts/gpu_proof.sh converge NAME [N]  pyinfra -y inventory/h200.py deploy.py for deployment NAME (run N):
#                                           llama-8b, mla, kimi-nvfp4, glm5-dsa (HEAVYLIFT_PROOF_CHECKPOINTS="kimi-nvfp4 glm5-dsa") on one GPU; tp8, tp4-a, tp4-b on eight (with
#                                           HEAVYLIFT_PROOF_CHECKPOINTS=dsv3)
#   scripts/gpu_proof.sh plain NAME         stop heavylift's service, run the same launcher by hand, time it with a
#                                           direct client; then heavylift brings its service back (timed the same way)
#   scripts/gpu_proof.sh plain_start NAME cold|warm   the release's launcher by hand, no service running (cold: the
#                                           service user's caches emptied first), timed with the direct client
#   scripts/gpu_proof.sh change NAME LABEL  converge a change (HEAVYLIFT_H200_GPU_MEMORY, revision, HEAVYLIFT_PROOF_TREE)
#                                           while benchmarks/health_watch.py polls /health: the downtime, into downtime.jsonl
#   scripts/gpu_proof.sh revision CKPT TEXT the Hub stand-in serves a new commit whose only change is README.md
set -euo pipefail
cd "$(dirname "$0")/.."
HL=/tmp/hl
# figures and logs stay in /tmp/hl/out across calls; `bundle` packs them into one file under the device's $OUT
RESULTS=$HL/out
PY=${HEAVYLIFT_H200_PYTHON:-/opt/torch/.venv/bin/python3}
ROOT=${HEAVYLIFT_H200_ROOT:-$HL/heavylift}
export HEAVYLIFT_PAYLOAD=$HL/payload HEAVYLIFT_H200_ROOT=$ROOT HEAVYLIFT_CACHE=$HL/cache
# this machine's rule for every process started here (NVLink multicast off); the service gets the same three
# from the site's nvlink_multicast = False (inventory/h200.py), this covers the script's own processes
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$HL" "$RESULTS"

stamp() { date +%s.%N; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
say() { echo "[$(date +%T)] $*"; }

# checkpoints (generated here) by name: their Hub repo, the Hub stand-in's port, the generator's kind
declare -A REPO=([llama-8b]=heavylift/llama-3.1-8b-shape [mla]=heavylift/mla-kimi-shape [dsv3]=heavylift/mla-dsv3-width
                [kimi-nvfp4]=heavylift/kimi-k2.5-nvfp4-shape [glm5-dsa]=heavylift/glm-5-dsa-shape)
declare -A HUB_PORT=([llama-8b]=8390 [mla]=8391 [dsv3]=8392 [kimi-nvfp4]=8393 [glm5-dsa]=8394)
declare -A KIND=([llama-8b]=llama-8b [mla]=mla [dsv3]=mla-dsv3-width [kimi-nvfp4]=kimi-nvfp4 [glm5-dsa]=glm5-dsa)
# deployments (HEAVYLIFT_H200_DEPLOYMENT of the inventories): their checkpoint, port and heavylift name
declare -A CHECKPOINT=([llama-8b]=llama-8b [mla]=mla [tp8]=dsv3 [tp4-a]=dsv3 [tp4-b]=dsv3 [kimi-nvfp4]=kimi-nvfp4 [glm5-dsa]=glm5-dsa [glm5-dsa-fp8]=glm5-dsa)
declare -A PORT=([llama-8b]=8000 [mla]=8001 [tp8]=8000 [tp4-a]=8002 [tp4-b]=8003 [kimi-nvfp4]=8004 [glm5-dsa]=8005 [glm5-dsa-fp8]=8005)
declare -A NAME=([llama-8b]=llama-8b [mla]=mla [tp8]=dsv3-tp8 [tp4-a]=dsv3-tp4-a [tp4-b]=dsv3-tp4-b [kimi-nvfp4]=kimi-nvfp4 [glm5-dsa]=glm5-dsa [glm5-dsa-fp8]=glm5-dsa)
CHECKPOINTS=${HEAVYLIFT_PROOF_CHECKPOINTS:-llama-8b mla}

carry() {
    mkdir -p "$HL/parts"
    cp -v .gpu/payload* "$HL/parts/"
    ls -la "$HL/parts"
}

facts() {
    nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits | tee "$RESULTS/nvidia-smi-query.txt"
    nvidia-smi --version | tee "$RESULTS/nvidia-smi-version.txt" || true
    nvidia-smi > "$RESULTS/nvidia-smi-table.txt" || true
    # what the tensor parallel preflights read (docs/tp-preflights.md): topology, GPU memory in use, /dev/shm
    nvidia-smi topo -m > "$RESULTS/nvidia-smi-topo.txt" 2>&1 || true
    { nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits
      nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv,noheader,nounits; } \
        > "$RESULTS/nvidia-smi-use.txt" 2>&1 || true
    { stat -f -c 'shm: %S %b %a' /dev/shm; df -h /dev/shm; } > "$RESULTS/dev-shm.txt" 2>&1 || true
    "$PY" - <<'EOF' | tee "$RESULTS/image-python.json"
import json, sys
from importlib import metadata
names = ["torch", "torchvision", "torchaudio", "triton", "numpy", "transformers", "numba", "llvmlite",
         "opencv-python-headless", "safetensors", "tokenizers", "pillow", "huggingface-hub"]
found = {}
for n in names:
    try:
        d = metadata.distribution(n)
        found[n] = [d.version, str(d.locate_file(""))]
    except metadata.PackageNotFoundError:
        found[n] = None
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "base_prefix": sys.base_prefix,
                  "packages": found}, indent=1))
EOF
    { echo "pid1: $(cat /proc/1/comm)"; for t in systemctl start-stop-daemon setpriv useradd curl git patch; do
        echo "$t: $(command -v $t || echo missing)"; done; df -h /tmp | tail -1; nproc; free -g | head -2; } | tee "$RESULTS/machine.txt"
}

hub_up() {  # NAME: the Hub stand-in serving that checkpoint on loopback
    local name=$1 port=${HUB_PORT[$1]}
    if curl -fsS -o /dev/null "http://127.0.0.1:$port/api/models/${REPO[$name]}/revision/main" 2>/dev/null; then return; fi
    setsid nohup "$PY" -m benchmarks.static_hub "$HL/models/$name" "${REPO[$name]}" "$port" > "$HL/hub-$name.log" 2>&1 < /dev/null &
    echo $! > "$HL/hub-$name.pid"
    for _ in $(seq 1 240); do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/api/models/${REPO[$name]}/revision/main" 2>/dev/null && break
        sleep 0.5
    done
    head -1 "$HL/hub-$name.log"
}

setup() {
    local t0; t0=$(stamp)
    [ -d "$HL/payload" ] || "$PY" scripts/gpu_unpack.py "$HL/parts" "$HL/payload"
    mkdir -p "$HL/bin"
    # uv from its own wheel (the payload's), to build heavylift's control venv offline
    [ -x "$HL/bin/uv" ] || "$PY" -c "
import sys, zipfile, glob
w = zipfile.ZipFile(glob.glob('$HL/payload/wheelhouse/uv-*.whl')[0])
m = next(n for n in w.namelist() if n.endswith('/scripts/uv'))
open('$HL/bin/uv', 'wb').write(w.read(m))"
    chmod 755 "$HL/bin/uv"
    if [ ! -x "$HL/ctl/bin/pyinfra" ]; then
        "$HL/bin/uv" venv -q --python "$PY" "$HL/ctl"
        "$HL/bin/uv" pip install -q --python "$HL/ctl/bin/python" --offline --no-index \
            --find-links "$HL/payload/control" -r "$HL/payload/control-requirements.txt"
    fi
    local t1; t1=$(stamp)
    checkpoints
    local t2; t2=$(stamp)
    for name in $CHECKPOINTS; do hub_up "$name"; done
    echo "{\"unpack_and_control_venv_s\": $(minus "$t1" "$t0"), \"checkpoints_s\": $(minus "$t2" "$t1"), \"hubs_s\": $(minus "$(stamp)" "$t2")}" | tee "$RESULTS/setup.json"
}

checkpoints() {  # generated here with the image's torch, never carried (a finished one is kept)
    for name in $CHECKPOINTS; do
        [ -f "$HL/models/$name/README.md" ] || "$PY" -m testbed.gpu_checkpoints "${KIND[$name]}" "$HL/models/$name" | tee -a "$RESULTS/checkpoints.jsonl"
    done
}

converge() {  # DEPLOYMENT N (HEAVYLIFT_PROOF_TREE: another heavylift tree to run, HEAVYLIFT_PROOF_DATA: --data k=v ...)
    local choice=$1 n=${2:-1} t0 rc=0 tree=${HEAVYLIFT_PROOF_TREE:-$PWD} data=()
    local name=${NAME[$1]}
    for kv in ${HEAVYLIFT_PROOF_DATA:-}; do data+=(--data "$kv"); done
    hub_up "${CHECKPOINT[$choice]}" >/dev/null
    t0=$(stamp)
    (cd "$tree" && HEAVYLIFT_H200_DEPLOYMENT=$choice "$HL/ctl/bin/pyinfra" -y "$OLDPWD/inventory/h200.py" deploy.py "${data[@]}") \
        > "$RESULTS/converge-$name-$n.log" 2>&1 || rc=$?
    local wall; wall=$(minus "$(stamp)" "$t0")
    say "converge $name #$n: exit $rc, $wall s"
    grep -E "rule |vLLM |ready|No changes|Success|Error|error|\[@local\] (Loaded|heavylift)" "$RESULTS/converge-$name-$n.log" | tail -25 || true
    cp "$ROOT/deployments/$name/status.json" "$RESULTS/status-$name-$n.json" 2>/dev/null || true
    cp "$ROOT/deployments/$name/resolution.json" "$RESULTS/resolution-$name.json" 2>/dev/null || true
    echo "{\"deployment\": \"$name\", \"run\": \"$n\", \"exit\": $rc, \"wall_seconds\": $wall}" >> "$RESULTS/converge.jsonl"
    tail -n 60 "$ROOT/deployments/$name/run/serve.log" > "$RESULTS/serve-$name.log" 2>/dev/null || true
    return $rc
}

bundle() {  # everything measured so far, as one file where the caller collects it ($OUT on the device)
    tar -czf "${OUT:?}/gpu-proof.tgz" -C "$HL" out
    ls -la "$OUT"
}

process_start() {  # PID -> epoch seconds the process started (clock ticks since boot, from /proc)
    "$PY" -c "
import os, sys
ticks = os.sysconf('SC_CLK_TCK')
start = int(open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')', 1)[1].split()[19]) / ticks
boot = next(float(l.split()[1]) for l in open('/proc/stat') if l.startswith('btime'))
print(f'{boot + start:.2f}')" "$1"
}

plain() {  # DEPLOYMENT: the same launcher run by hand against heavylift's service, each timed from its process start
    local choice=$1 pid started
    local name=${NAME[$1]} repo=${REPO[${CHECKPOINT[$1]}]} port=${PORT[$1]}
    local run=$ROOT/deployments/$name/run
    start-stop-daemon --stop --oknodo --remove-pidfile --pidfile "$run/serve.pid" --retry TERM/60/KILL/10
    # the release's own launcher without heavylift: the same command line, environment, user and HOME (its caches)
    setsid bash -c "set -a; . '$ROOT/deployments/$name/private/serve.env'; set +a; HOME='$ROOT/home' exec setpriv --reuid=heavylift --regid=heavylift --init-groups -- '$ROOT/deployments/$name/current/serve'" \
        > "$HL/plain-$name.log" 2>&1 < /dev/null &
    pid=$!
    started=$(process_start "$pid")
    "$PY" benchmarks/serve_client.py "http://127.0.0.1:$port" "$repo" --tokens 256 --started-at "$started" \
        | tee "$RESULTS/plain-$name.json"
    kill -TERM -- -"$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    grep -E "backend|KV cache|kv_cache|Maximum concurrency|Loading weights took|torch.compile|graph" "$HL/plain-$name.log" | head -30 > "$RESULTS/plain-$name-vllm.txt" || true
    # heavylift brings its service back (it is not running) and gates it
    converge "$choice" restart || true
    pid=$(cat "$run/serve.pid")
    started=$(process_start "$pid")
    "$PY" - "$started" "$ROOT/deployments/$name/status.json" <<'EOF' | tee "$RESULTS/heavylift-$name-restart.json"
import json, os, sys
started, status_file = float(sys.argv[1]), sys.argv[2]
status = json.load(open(status_file))
gate_done = os.stat(status_file).st_mtime
print(json.dumps({"start_to_gate_seconds": round(gate_done - started, 2), **status}))
EOF
    "$PY" benchmarks/serve_client.py "http://127.0.0.1:$port" "$repo" --tokens 256 | tee "$RESULTS/direct-after-$name.json"
}

revision() {  # CHECKPOINT TEXT: the Hub stand-in serves a new commit whose only change is README.md (same weight bytes)
    local name=$1 pidfile=$HL/hub-$1.pid
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; sleep 1; fi
    printf '%s\n' "$2" > "$HL/models/$name/README.md"
    hub_up "$name"
}

change() {  # DEPLOYMENT LABEL: converge a change while a client polls /health every 0.1 s; downtime = its last 200
    # before the outage -> the moment the gate wrote status.json; the start-up breakdown says where it went
    local choice=$1 label=$2 name=${NAME[$1]} port=${PORT[$1]} watch wpid
    local status=$ROOT/deployments/$name/status.json
    watch=$HL/watch-$label.jsonl; rm -f "$watch"
    "$PY" benchmarks/health_watch.py "http://127.0.0.1:$port" "$watch" --every 0.1 & wpid=$!
    sleep 1
    converge "$choice" "$label" || true
    sleep 0.5; kill "$wpid" 2>/dev/null || true
    "$PY" - "$watch" "$status" "$label" <<'EOF' | tee -a "$RESULTS/downtime.jsonl"
import json, os, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
down = next((l for l in lines if not l["up"] and l["last_other"]), None)
up = next((l for l in lines if l["up"] and down and l["at"] > down["at"]), None)
status = json.load(open(sys.argv[2]))
gate = os.stat(sys.argv[2]).st_mtime
out = {"change": sys.argv[3], "stops_answering": down and down["last_other"], "answers_again": up and up["at"]}
if down:
    out["downtime_to_gate_s"] = round(gate - down["last_other"], 2)
    out["downtime_to_health_s"] = up and round(up["at"] - down["last_other"], 2)
out["startup"] = status.get("startup")
print(json.dumps(out))
EOF
}

plain_start() {  # DEPLOYMENT cold|warm: the release's launcher by hand (no service running), timed from its start
    local choice=$1 how=$2 pid started
    local name=${NAME[$1]} repo=${REPO[${CHECKPOINT[$1]}]} port=${PORT[$1]}
    if [ "$how" = cold ]; then  # empty caches: vLLM's, Triton's, CUDA's, inductor's default (HOME is the service's)
        rm -rf "$ROOT/home/.cache" "$ROOT/home/.triton" "$ROOT/home/.nv" /tmp/torchinductor_*
    fi
    local launcher=$ROOT/deployments/$name/current/serve  # before the first switch (until=prepare): the newest release's
    [ -e "$launcher" ] || launcher=$ROOT/deployments/$name/releases/$(ls -t "$ROOT/deployments/$name/releases" | head -1)/serve
    setsid bash -c "set -a; . '$ROOT/deployments/$name/private/serve.env'; set +a; HOME='$ROOT/home' exec setpriv --reuid=heavylift --regid=heavylift --init-groups -- '$launcher'" \
        > "$HL/plain-$name-$how.log" 2>&1 < /dev/null &
    pid=$!
    started=$(process_start "$pid")
    "$PY" benchmarks/serve_client.py "http://127.0.0.1:$port" "$repo" --tokens 256 --started-at "$started" \
        | tee -a "$RESULTS/plain-$name-$how.json"
    kill -TERM -- -"$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    grep -E "Loading weights took|torch.compile took|Directly load|Compiling a graph|Graph capturing|init engine|profiling" "$HL/plain-$name-$how.log" | cut -c1-220 | tee "$RESULTS/plain-$name-$how-vllm.txt" || true
}

"$@"

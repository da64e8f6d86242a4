#!/usr/bin/env bash
# Installs everything heavylift's demo and tests need on a fresh Debian machine:
# uv, the control venv (.venv, pinned by uv.lock), and the system tools the test bed uses
# (sshd for SSH test hosts, git for the Hub mirror, systemd-analyze).
#
# uv is heavylift's own, pinned, at a path it controls: .tools/bin/uv, taken from PyPI's uv
# wheel with a bare python3 (operations/uv_wheel.py, standard library only), as heavylift does
# for its hosts. Never pip into the system Python (Debian 12 refuses it, PEP 668, and has no
# pip by default), never `uv` from PATH (a pyenv shim answers "pyenv: uv: command not found").
# Everything that needs uv calls .tools/bin/uv by that path.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
UV="$PWD/.tools/bin/uv"

missing=()
command -v git >/dev/null || missing+=(git)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v start-stop-daemon >/dev/null || missing+=(dpkg)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# the interpreter that runs this script's Python: its real path, not a shim's
PYTHON="$(python3 -c 'import sys; print(sys.executable)')"

if [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "bootstrap: installing uv $UV_VERSION from PyPI's uv wheel into .tools/bin"
    "$PYTHON" -m operations.uv_wheel "$UV_VERSION" "$UV"
fi

# the control venv from that interpreter. uv never downloads one (its Python builds come from
# outside the package registries), and trusts the system's certificate store (UV_SYSTEM_CERTS,
# uv 0.13's name of --native-tls): uv otherwise trusts only its bundled roots and fails behind a
# TLS-inspecting proxy with "invalid peer certificate: UnknownIssuer", as the hosts' uv would
export UV_PYTHON_DOWNLOADS=never UV_SYSTEM_CERTS=1
# with bytecode: uv writes none by default, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python never caches it either, so every pyinfra run compiled ~490 modules from source (0.6 s)
"$UV" sync --quiet --frozen --all-groups --compile-bytecode --python "$PYTHON"
# heavylift's own modules too (a stale .pyc is never used: Python checks the source's mtime)
.venv/bin/python -m compileall -q -j 0 models operations resolve testbed benchmarks deploy.py >/dev/null

#!/usr/bin/env bash
# Installs everything heavylift's demo and tests need on a fresh Debian machine:
# uv (from PyPI), the control venv (.venv, pinned by uv.lock), and the system tools the
# test bed uses (sshd for SSH test hosts, git for the Hub mirror, systemd-analyze).
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9

missing=()
command -v git >/dev/null || missing+=(git)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v start-stop-daemon >/dev/null || missing+=(dpkg)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v uv >/dev/null || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    echo "bootstrap: installing uv $UV_VERSION from PyPI"
    python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

uv sync --quiet --frozen --all-groups

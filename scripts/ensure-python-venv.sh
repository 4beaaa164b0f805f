#!/usr/bin/env bash
# Installs Python's venv module (Debian's python3-venv, or python3.X-venv) when the interpreter
# lacks it; used by install-python.sh, install-nvrtc.sh and .ci/run (once, before its background
# installs, which would each run apt-get at once). Writes only to standard error.
#
#   bash scripts/ensure-python-venv.sh [PYTHON]   # default $PYTHON or python3
set -euo pipefail
python=${1:-${PYTHON:-python3}}
if "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    exit 0
fi
echo "== python3-venv is missing: apt-get install python3-venv" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
$sudo apt-get update -qq >&2
minor=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 \
    || $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$minor-venv" >&2

#!/usr/bin/env bash
# Builds .venv from PyPI with the given extras: scripts/venv.sh [EXTRAS]
# On a fresh Debian machine python3 may lack venv/ensurepip; as root we install them.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
stamp=".venv/.ferryq-${extras:-base}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "ferryq needs Python 3.11 or newer as '$python' (set PYTHON=...)" >&2
  exit 1
fi
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$python" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      ver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" || \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
      "$python" -m venv .venv
    else
      echo "cannot create a virtualenv: install python3-venv (apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -U pip
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"
touch "$stamp"

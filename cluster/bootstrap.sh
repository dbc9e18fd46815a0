#!/usr/bin/env bash
# Bootstrap memlib's environment on Debian 12 (also used by the container image).
#   1. graph-tool from Debian (it is not on PyPI): python3-graph-tool, plus python3-venv.
#   2. a venv made by the system python with --system-site-packages, so graph-tool is visible.
#   3. memlib and its pinned dependencies (pyproject.toml ranges, constraints.txt exact pins).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
SYSPY=/usr/bin/python3

need_apt=0
$SYSPY -c "import graph_tool" 2>/dev/null || need_apt=1
$SYSPY -c "import ensurepip, venv" 2>/dev/null || need_apt=1
if [ "$need_apt" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "memlib setup: graph-tool is missing; run as root or: sudo apt-get install -y python3-graph-tool python3-venv python3-dev" >&2
    exit 1
  fi
  echo "memlib setup: installing python3-graph-tool from Debian ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-graph-tool python3-venv python3-dev python3-pip >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "memlib setup: creating $VENV (system site packages visible for graph-tool) ..."
  $SYSPY -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
echo "memlib setup: installing pinned dependencies (constraints.txt) ..."
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[test]"
"$VENV/bin/python" -m memlib check-env

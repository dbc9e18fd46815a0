#!/usr/bin/env bash
# Bootstrap memlib's environment on Debian 12 (also used by the container image).
#   1. graph-tool from Debian (it is not on PyPI): python3-graph-tool, plus python3-venv.
#   2. a venv made by the system python with --system-site-packages, so graph-tool is visible.
#   3. memlib and its pinned dependencies (pyproject.toml ranges, constraints.txt exact pins), with
#      the extras named by MEMLIB_EXTRAS (default: test, what `make test` needs; the node image sets
#      it empty: runtime dependencies only).
#   4. Debian's chromium for the browser test of the /ui explorer page, where apt can install it
#      (best effort; MEMLIB_NO_BROWSER=1 skips it, as the node image does).
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

if [ "${MEMLIB_NO_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "memlib setup: installing chromium from Debian (browser test of /ui) ..."
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
      || echo "memlib setup: chromium could not be installed; the /ui browser test will be skipped" >&2
  else
    echo "memlib setup: no chromium (needs root and apt); the /ui browser test will be skipped" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "memlib setup: creating $VENV (system site packages visible for graph-tool) ..."
  $SYSPY -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
echo "memlib setup: installing pinned dependencies (constraints.txt) ..."
EXTRAS=${MEMLIB_EXTRAS-test}
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
"$VENV/bin/memlib" check-env

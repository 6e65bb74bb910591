#!/usr/bin/env bash
# Installs what the overhead and routing suites compare against, idempotently: the Rust
# peer routers (PyPI wheels, pinned) in a throwaway venv bench/.venv-peers, and wrk
# (Debian). Safe to run again: it does nothing when everything is in place.
#
# How the peers are started (bench/common/peers.py):
#   bench/.venv-peers/bin/vllm-router --host H --port P --worker-urls URL URL \
#       --policy round_robin --prometheus-port M
#   bench/.venv-peers/bin/python -m sglang_router.launch_router --host H --port P \
#       --worker-urls URL URL --policy round_robin --prometheus-port M
# Both try to reach a tokenizer hub at start: the suites run them in a private
# network namespace, where that fails at once.
set -euo pipefail

cd "$(dirname "$0")/.."  # bench/
PYTHON="${PYTHON:-python3}"
VENV=.venv-peers
PEERS=(vllm-router==0.1.17 sglang-router==0.3.2)

peers_installed() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "${PEERS[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for pin in sys.argv[1:]:
    name, _, wanted = pin.partition("==")
    try:
        if version(name) != wanted:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

if peers_installed; then
    echo "peers: ${PEERS[*]} already in bench/$VENV"
else
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PEERS[@]}"
    echo "peers: installed ${PEERS[*]} in bench/$VENV"
fi

if command -v wrk >/dev/null; then
    echo "wrk: $(command -v wrk)"
else
    apt-get install -y -qq wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk; }
    echo "wrk: installed $(command -v wrk)"
fi

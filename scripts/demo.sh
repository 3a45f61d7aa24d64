#!/usr/bin/env bash
# Quickstart 1: set up (first time only) and run `gmts demo` on the embedded tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
export HF_HUB_OFFLINE=1
exec .venv/bin/gmts demo "$@"

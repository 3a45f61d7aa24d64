#!/usr/bin/env bash
# Quickstart 1: set up (first time only) and run `gmts demo` on the embedded tiny model.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/gmts ]; then
  echo "first run: installing gmts and its packages into .venv (about 1-2 minutes of pip)" >&2
fi
bash scripts/setup.sh demo
export HF_HUB_OFFLINE=1
exec .venv/bin/gmts demo "$@"

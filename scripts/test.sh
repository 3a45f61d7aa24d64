#!/usr/bin/env bash
# Quickstart 2: set up (first time only), lint, and run the whole test suite (slow tests too).
# For the fast subset while developing: .venv/bin/python -m pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export HF_HUB_OFFLINE=1
# One warm-start cache for the whole run, inside the checkout (ignored by git).
export GMTS_CACHE="${GMTS_CACHE:-$PWD/.cache/gmts}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -m "" -q "$@"

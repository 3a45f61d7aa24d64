#!/usr/bin/env bash
# Create .venv and install gmts into it. Usage: scripts/setup.sh [demo|test]
#   demo: the core, the trainer and the rewards (enough for `gmts demo`)
#   test: everything the test suite needs, TRL and verl included
# Re-running is cheap: a stamp file records what was installed for which pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-demo}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.gmts-${profile}-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip >/dev/null
# The CPU build of torch: a plain `torch` requirement could pull a multi-GB CUDA build.
pip install "torch==2.13.0"
case "$profile" in
  demo) pip install -e ".[train,rewards]" ;;
  test)
    pip install -e ".[all]"
    # verl 0.9's own requirements pull GPU-only packages; install what its CPU import needs,
    # then verl itself without dependencies (recipe: shared/notes/reference-semantics.md).
    pip install omegaconf codetiming orjson ray "tensordict>=0.8,!=0.9.0,<=0.10.0" \
      "transformers>=5.5.3,!=5.6.0,<5.11"
    pip install --no-deps "verl==0.9.1"
    ;;
  *) echo "unknown profile: $profile (expected demo or test)" >&2; exit 2 ;;
esac
touch "$stamp"

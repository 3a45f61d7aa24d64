#!/usr/bin/env bash
# Item 6 of the benchmarks: items 1-3 on one CUDA GPU, from one prepared script.
#
#   bash benchmarks/gpu.sh [OUT_DIR]      (default benchmarks/results/gpu)
#
# Uses the machine's own python3 with CUDA PyTorch and transformers; gmts is taken from src/
# (no install, nothing fetched). Item 3 uses a randomly initialised model of Qwen2.5-1.5B's
# configuration (benchmarks/gpu_model.py). Then `python benchmarks/report.py` renders the
# "6. On a GPU" tables of docs/results.md from benchmarks/results/gpu. Sized for 10 minutes
# on an H200 (an estimate: not yet run on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT_DIR=${1:-benchmarks/results/gpu}
MODEL_DIR=${GMTS_GPU_MODEL_DIR:-/tmp/gmts-qwen2.5-1.5b-random}
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
"$PY" benchmarks/run.py --device cuda --only selection,logprobs --logprobs-repeats 5 \
    --out "$OUT_DIR" --no-report
"$PY" benchmarks/gpu_model.py "$MODEL_DIR"
GMTS_BENCH_MODEL="$MODEL_DIR" "$PY" benchmarks/run.py --device cuda --only overhead \
    --out "$OUT_DIR" --no-report
echo "GPU benchmarks written to $OUT_DIR"

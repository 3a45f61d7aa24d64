#!/usr/bin/env bash
# Item 6 of the benchmarks (items 1-3 on one CUDA GPU) and issue 11's training proof, from one
# prepared script.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [PARTS]     (default benchmarks/results/gpu, bench,train,vllm)
#
# PARTS (comma-separated):
#   bench  selection and log-prob benchmarks, then the overhead benchmark on a randomly
#          initialised model of Qwen2.5-1.5B's configuration (benchmarks/gpu_model.py);
#          sized for 10 minutes on an H200 (an estimate: not yet run on a GPU).
#   train  3 training steps of that model with the trainer itself: bf16 mixed precision
#          (float32 master weights), FSDP2 on one GPU, DAPO + GMTS scaled down
#          (benchmarks/gpu_train.py); sized for under 8 minutes (an estimate: not yet run).
#   vllm   the same 3 steps with rollout.engine=vllm: the colocated vLLM engine in bf16, sleep
#          mode (level 2) between rollouts, the weights synced in place before every rollout
#          after the first. Prints and writes (train_vllm.json) the generation tokens/s of the
#          rollout next to the hf run's (train.json; run part train too), the weight sync time,
#          and the peak memory of the rollout and the update (PyTorch's and the device's own)
#          against the memory plan's. Needs vllm importable by $PY (pip install vllm); sized
#          for under 8 minutes (an estimate: not yet run on a GPU).
#
# Uses the machine's own python3 with CUDA PyTorch and transformers; gmts is taken from src/
# (no install, nothing fetched). Then `python benchmarks/report.py` renders the "6. On a GPU"
# tables of docs/results.md from benchmarks/results/gpu. The CPU path of the training part:
#   python benchmarks/gpu_train.py --dry-run --out /tmp/train.json
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT_DIR=${1:-benchmarks/results/gpu}
PARTS=${2:-bench,train,vllm}
MODEL_DIR=${GMTS_GPU_MODEL_DIR:-/tmp/gmts-qwen2.5-1.5b-random}
TRAIN_MODEL_DIR=${GMTS_GPU_TRAIN_MODEL_DIR:-/tmp/gmts-qwen2.5-1.5b-random-fullvocab}
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
if [[ ",$PARTS," == *",bench,"* ]]; then
    "$PY" benchmarks/run.py --device cuda --only selection,logprobs --logprobs-repeats 5 \
        --out "$OUT_DIR" --no-report
    "$PY" benchmarks/gpu_model.py "$MODEL_DIR"
    GMTS_BENCH_MODEL="$MODEL_DIR" "$PY" benchmarks/run.py --device cuda --only overhead \
        --out "$OUT_DIR" --no-report
fi
if [[ ",$PARTS," == *",train,"* ]]; then
    "$PY" benchmarks/gpu_train.py --model-dir "$TRAIN_MODEL_DIR" --out "$OUT_DIR/train.json"
fi
if [[ ",$PARTS," == *",vllm,"* ]]; then
    if ! "$PY" -c "import vllm" 2>/dev/null; then
        echo "part vllm: $PY cannot import vllm (pip install vllm), or leave vllm out of PARTS" >&2
        exit 2
    fi
    "$PY" -c "import vllm; print('vllm', vllm.__version__)"
    "$PY" benchmarks/gpu_train.py --engine vllm --model-dir "$TRAIN_MODEL_DIR" \
        --out "$OUT_DIR/train_vllm.json"
    "$PY" - "$OUT_DIR" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("train.json", "train_vllm.json"):
    if (out / name).exists():
        r = json.loads((out / name).read_text())
        sync = [s.get("time/weight_sync_s") for s in r["steps"][1:]]
        print(f"{r['engine']}: generation {statistics.median(r['generation_tokens_per_s']):.0f} "
              f"tokens/s (median of steps 2+), weight sync {sync}, peaks {r['device_peak_bytes']}")
PY
fi
echo "GPU results written to $OUT_DIR"

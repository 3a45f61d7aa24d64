#!/usr/bin/env bash
# Item 6 of the benchmarks (items 1-3 on one CUDA GPU) and issue 11's training proof, from one
# prepared script.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [PARTS]     (default benchmarks/results/gpu, bench,train,vllm,trl)
#   bash benchmarks/gpu.sh --dry-run [WORK_DIR] [PARTS]  (CPU, tiny shapes; results in
#                                          WORK_DIR/results/gpu, default WORK_DIR a new /tmp folder)
#
# PARTS (comma-separated):
#   bench  selection and log-prob benchmarks, then the overhead benchmark on a randomly
#          initialised model of Qwen2.5-1.5B's configuration (benchmarks/gpu_model.py);
#          sized for 10 minutes on an H200 (an estimate: not yet run on a GPU).
#   train  3 training steps of that model with the trainer itself: bf16 mixed precision
#          (float32 master weights), FSDP2 on one GPU, DAPO + GMTS scaled down
#          (benchmarks/gpu_train.py); sized for under 8 minutes (an estimate: not yet run).
#   vllm   the same 3 steps with rollout.engine=vllm (a bf16 engine colocated in the trainer's
#          process, sleep mode between rollouts): generation tokens/s of both engines, the
#          weight-sync time and peak memory against the plan (gpu_train.py --engine vllm);
#          needs vllm importable by the python used. A dry run skips it where vllm is missing
#          (its CPU path runs in .venv-vllm's tests: tests/vllm/test_vllm_train.py).
#   trl    GMTSGRPOTrainer in TRL's own vLLM colocate mode with TRL's vLLM defaults (IS
#          correction on), 2 steps (scripts/gpu/trl_vllm_colocate.py); needs TRL and vllm.
#          A dry run skips it (on CPU TRL's own colocate weight sync cannot run: the CPU build
#          of vLLM re-packs its linear layers; tests/integrations/test_trl_vllm_colocate_on_cpu.py
#          pins that, docs/integrations.md says why).
#
# Uses the machine's own python3 with CUDA PyTorch and transformers; gmts is taken from src/
# (no install, nothing fetched). Then `python benchmarks/report.py` renders the "6. On a GPU"
# tables of docs/results.md from benchmarks/results/gpu.
#
# --dry-run runs every command above with the same arguments on the CPU, except: --device cpu
# --quick for benchmarks/run.py, --tiny for gpu_model.py (2 layers, width 128), --dry-run for
# gpu_train.py, and model folders inside WORK_DIR (never the GPU run's). It then renders the
# results into a copy of docs/results.md. So every entry point, flag and result format the GPU
# run uses is exercised (tests/benchmarks/test_gpu_scripts.py runs it); what it cannot check is
# CUDA itself (device selection, timings, torch.cuda peak memory) and the full-size model.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY=1
    shift
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PARTS=${2:-bench,train,vllm,trl}
PY=${PYTHON:-python3}
if ((DRY)); then
    WORK=${1:-$(mktemp -d /tmp/gmts-gpu-dry.XXXXXX)}
    OUT_DIR=$WORK/results/gpu
    MODEL_DIR=$WORK/model-tiny
    TRAIN_MODEL_DIR=$WORK/train-model-tiny
    DEVICE=(--device cpu --quick)
    TINY=(--tiny)
    TRAIN_DRY=(--dry-run)
    echo "dry run: every part on the CPU with tiny shapes, results in $OUT_DIR"
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, '(CPU: dry run)')"
else
    OUT_DIR=${1:-benchmarks/results/gpu}
    MODEL_DIR=${GMTS_GPU_MODEL_DIR:-/tmp/gmts-qwen2.5-1.5b-random}
    TRAIN_MODEL_DIR=${GMTS_GPU_TRAIN_MODEL_DIR:-/tmp/gmts-qwen2.5-1.5b-random-fullvocab}
    DEVICE=(--device cuda)
    TINY=()
    TRAIN_DRY=()
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
fi

if [[ ",$PARTS," == *",bench,"* ]]; then
    "$PY" benchmarks/run.py "${DEVICE[@]}" --only selection,logprobs --logprobs-repeats 5 \
        --out "$OUT_DIR" --no-report
    "$PY" benchmarks/gpu_model.py "$MODEL_DIR" ${TINY[@]+"${TINY[@]}"}
    GMTS_BENCH_MODEL="$MODEL_DIR" "$PY" benchmarks/run.py "${DEVICE[@]}" --only overhead \
        --out "$OUT_DIR" --no-report
fi
if [[ ",$PARTS," == *",train,"* ]]; then
    "$PY" benchmarks/gpu_train.py ${TRAIN_DRY[@]+"${TRAIN_DRY[@]}"} --model-dir "$TRAIN_MODEL_DIR" \
        --out "$OUT_DIR/train.json"
fi
if [[ ",$PARTS," == *",vllm,"* ]]; then
    if ! "$PY" -c "import vllm" 2>/dev/null; then
        if ((DRY)); then
            echo "part vllm: skipped in the dry run ($PY cannot import vllm)"
        else
            echo "part vllm: $PY cannot import vllm (pip install vllm), or leave vllm out of PARTS" >&2
            exit 2
        fi
    else
        "$PY" -c "import vllm; print('vllm', vllm.__version__)"
        "$PY" benchmarks/gpu_train.py ${TRAIN_DRY[@]+"${TRAIN_DRY[@]}"} --engine vllm \
            --model-dir "$TRAIN_MODEL_DIR" --out "$OUT_DIR/train_vllm.json"
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
fi
if [[ ",$PARTS," == *",trl,"* ]]; then
    if ((DRY)); then
        echo "part trl: skipped in the dry run (TRL's own colocate sync needs vLLM on a GPU)"
    elif ! "$PY" -c "import trl, vllm" 2>/dev/null; then
        echo "part trl: $PY cannot import trl and vllm (pip install trl vllm), or leave trl out of PARTS" >&2
        exit 2
    else
        "$PY" scripts/gpu/trl_vllm_colocate.py --out "$OUT_DIR/trl_colocate"
    fi
fi
if ((DRY)); then  # render the results as report.py would, into a copy of the page
    cp docs/results.md "$WORK/results.md"
    "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
from report import update_results_doc; update_results_doc(Path(sys.argv[1]), Path(sys.argv[2]))" \
        "$WORK/results" "$WORK/results.md"
    echo "dry run done: every part ran on the CPU; not run: CUDA (nothing here measured a GPU)"
else
    echo "GPU results written to $OUT_DIR"
fi

#!/usr/bin/env bash
# GMTS on verl's default trainer path on ONE GPU, with vLLM: 2 GRPO steps of a randomly
# initialised model of Qwen2.5-Math-1.5B's shape (hidden 1536, 28 layers, 12/2 heads; a 259-id
# byte-level tokenizer, so no hub download), launched exactly as docs/integrations.md tells
# users: python -m gmts.integrations.verl --config configs/verl/qwen2.5-math-1.5b-grpo-gmts.yaml.
#
#   bash scripts/gpu/verl_e2e.sh [WORK_DIR]        (default /tmp/gmts-verl-gpu)
#   bash scripts/gpu/verl_e2e.sh --dry-run [WORK_DIR]   (CPU; default WORK_DIR a new /tmp folder)
#
# NOT RUN YET: no GPU was available to this project when it was written. It needs, on the GPU
# machine, a python (PYTHON, default python3) with CUDA torch, verl 0.9.1, vLLM and
# TransferQueue installed (the machine reaches no package index); it checks that first.
# It prints the plugin's metrics (actor/gmts/*) of each step and exits non-zero if the run
# fails or a step lacks them. The data and reward come from the CPU test's scaffold
# (tests/integrations/verl_cpu/scaffold.py); the CPU platform and rollout there are NOT used.
#
# --dry-run checks everything the run needs except the GPU, vLLM and the training itself: the
# python has torch and verl; the scaffold writes its inputs (the tiny shape; the 1.5B shape is
# only built as a Qwen2Config); the launcher reads the config and every override below
# (python -m gmts.integrations.verl ... --dry-run prints the verl command); and verl's own Hydra
# config accepts that command's overrides (verl.trainer.main_ppo ... --cfg job composes and
# prints the config without running; an unknown key fails). tests/benchmarks/
# test_gpu_scripts.py runs it with .venv-verl.
set -euo pipefail
cd "$(dirname "$0")/../.."
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY=1
  shift
fi
if ((DRY)); then WORK=${1:-$(mktemp -d /tmp/gmts-verl-dry.XXXXXX)}; else WORK=${1:-/tmp/gmts-verl-gpu}; fi
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src:$PWD/tests/integrations/verl_cpu${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=disabled
# the recorder dumps the first actor mini-batch (selection inputs and loss) for inspection
export VERL_USE_EXTERNAL_MODULES=verl_cpu_gmts_dump GMTS_TEST_DUMP_DIR="$WORK/dump"

if ((DRY)); then
  echo "dry run: checks the inputs, the launcher and verl's config on the CPU; runs no training"
  "$PY" -c "import torch, verl; print('torch', torch.__version__, 'verl', verl.__version__, '(vLLM and CUDA not checked: dry run)')"
  "$PY" tests/integrations/verl_cpu/scaffold.py "$WORK" tiny
  "$PY" -c "import scaffold; from transformers import Qwen2Config; \
c = Qwen2Config(**scaffold.QWEN25_MATH_15B); print('qwen2.5-math-1.5b shape:', c.num_hidden_layers, 'layers, hidden', c.hidden_size)"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "import torch, verl, vllm, transfer_queue; assert torch.cuda.is_available(); \
print('torch', torch.__version__, 'verl', verl.__version__, 'vllm', vllm.__version__)"
  "$PY" tests/integrations/verl_cpu/scaffold.py "$WORK" qwen2.5-math-1.5b
fi

LAUNCH=(
  --config configs/verl/qwen2.5-math-1.5b-grpo-gmts.yaml
  data.train_files="$WORK/train.parquet" data.val_files="$WORK/test.parquet"
  actor_rollout_ref.model.path="$WORK/model"
  reward.custom_reward_function.path="$WORK/reward.py"
  trainer.n_gpus_per_node=1 trainer.total_training_steps=2 trainer.total_epochs=1
  trainer.logger=console trainer.val_before_train=false trainer.test_freq=-1
  trainer.save_freq=-1 trainer.resume_mode=disable trainer.default_local_dir="$WORK/ckpt"
  data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16
  actor_rollout_ref.rollout.n=4 data.max_prompt_length=128 data.max_response_length=256
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4
  +ray_kwargs.ray_init._node_ip_address=127.0.0.1 +ray_kwargs.ray_init.include_dashboard=false
)

if ((DRY)); then
  "$PY" -m gmts.integrations.verl "${LAUNCH[@]}" --dry-run > "$WORK/command.txt"
  VERL_COMMAND=$(sed -n 2p "$WORK/command.txt")  # line 1: GMTS_VERL_SELECTION=...
  eval "$VERL_COMMAND --cfg job" > "$WORK/verl_config.yaml"
  grep -q "name: vllm" "$WORK/verl_config.yaml"
  echo "dry run done: the launcher and verl's config accept every setting ($WORK/command.txt," \
    "$WORK/verl_config.yaml); not run: the GPU, vLLM and the 2 training steps"
  exit 0
fi

timeout 1800 "$PY" -m gmts.integrations.verl "${LAUNCH[@]}" 2>&1 | tee "$WORK/verl.log"

grep -o "step:[0-9]* .*" "$WORK/verl.log" | tr ' ' '\n' | grep -E "^step:|actor/gmts/|actor/pg_loss|grad_norm|timing_s/step:"
for step in 1 2; do
  grep -q "step:$step .*actor/gmts/selected_fraction" "$WORK/verl.log" \
    || { echo "step $step: no GMTS metrics in the log" >&2; exit 1; }
done
echo "verl + vLLM + GMTS on one GPU: 2 steps done; log in $WORK/verl.log"
